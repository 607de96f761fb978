"""What the benchmark's settings must be (conf/bench.yaml), checked before anything is measured: a sequence length
of 0 or a negative batch used to fail deep inside a worker process, after the yardstick had run."""

from __future__ import annotations

from omegaconf import DictConfig

from lra_bench.config.validate import NONE, Rule, _is_int, check_table, choice, integer, number, one_of
from lra_bench.errors import ConfigError

LENGTHS = Rule(
    lambda v: isinstance(v, list) and len(v) > 0 and all(_is_int(n) and n >= 1 for n in v),
    "a non-empty list of sequence lengths >= 1, e.g. [1024,2048]",
)
LANDMARKS = Rule(
    lambda v: isinstance(v, list) and all((_is_int(m) and m >= 1) or m == "log2" for m in v),
    "a list of landmark counts >= 1 or 'log2', e.g. [64,log2]",
)

BENCH_RULES: dict[str, Rule] = {
    "seq_lens": LENGTHS,
    "landmarks": LANDMARKS,
    "batch_size": integer(1),
    "num_heads": integer(1),
    "head_dim": integer(1),
    "threads": one_of(NONE, integer(1)),
    "pad_fraction": number(0.0, above=False, hi=1.0, below=True),
    "warmup": integer(0),
    "max_warmup_s": number(0.0),
    "repeats": integer(1),
    "min_repeats": integer(1),
    "max_time_s": number(0.0),
    "count_flops_max_n": one_of(NONE, integer(1)),
    "timeout_s": number(0.0),
    "seed": integer(0, 2**32 - 1),
    "matmul.size": one_of(choice("auto"), integer(1)),
    "matmul.repeats": integer(1),
    "matmul.warmup": integer(0),
    "profile.n": one_of(NONE, integer(1)),
    "profile.steps": integer(1),
    "profile.top": integer(1),
}


def check_bench(cfg: DictConfig) -> None:
    check_table(cfg, BENCH_RULES)
    if int(cfg.min_repeats) > int(cfg.repeats):
        raise ConfigError(f"min_repeats={cfg.min_repeats} exceeds repeats={cfg.repeats}; need min_repeats <= repeats")
