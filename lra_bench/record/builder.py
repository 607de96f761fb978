"""The one record builder: what a result record says about a run that its config alone determines.

Why one builder: the run (`lra_bench.run.train`) and the sweep callback's records of jobs that died before
writing their own (`LeaderboardCallback.on_job_end`) used to fill task/attn/selector/landmarks each their own way
(`selector` None in one and `"none"` in the other, the landmark count `"log2"` unresolved), which split one method
into two leaderboard rows. Both now call `new_record`.

Light at import (no torch): Hydra instantiates the sweep callback in every process; the landmark count imports
the model code only when asked.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lra_bench.kit.plain import plain_dict
from lra_bench.record.provenance import code_version, environment
from lra_bench.record.schema import RunInfo, RunRecord
from lra_bench.registry import ATTENTIONS, attention_factory, selector_node


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def select(cfg: DictConfig, key: str) -> Any:
    """`cfg.<key>` resolved, or None when missing or unresolvable (a broken config still gets a record)."""
    try:
        return OmegaConf.select(cfg, key, default=None)
    except Exception:  # an interpolation that cannot resolve
        return None


def selector_name(cfg: DictConfig) -> str | None:
    """The selector's option name; None when the run has none (`selector: none`, attentions that take none)."""
    name = select(cfg, "selector.name")
    return None if name in (None, "none") else str(name)


def resolved_config(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain JSON types (enums as their names: `task.source: auto`, as written in the YAML), so it
    goes into a weights-only checkpoint and compares equal to a freshly composed config."""
    try:
        container = plain_dict(cfg, enum_to_str=True)
    except Exception:  # a config error raised before the run could resolve it
        container = plain_dict(cfg, resolve=False, enum_to_str=True)
    container.pop("hydra", None)
    return container


def rank_budget(cfg: DictConfig) -> int | None:
    """The rank budget block 0's attention spends at the run's sequence length — its landmarks, features or
    projection rows (`"log2"` → ⌈log₂ n⌉, a formula rule → its value): the attention is built through
    `lra_bench.registry.attention_factory`, the model's own path, and asked (`Attention.rank_budget`). None for
    an attention without a rank knob (exact attention), or when the config cannot build one (a failed job's
    record: then the knob's value if it is already an int)."""
    try:
        knob = ATTENTIONS.get(str(select(cfg, "attn.name"))).rank_knob
    except Exception:  # an unknown attention (a failed job's record)
        return None
    if knob is None:
        return None
    try:
        from models.encoder import Encoder  # the model code (torch) only when asked: see the module docstring

        model = plain_dict(cfg.model)
        total = Encoder.total_length(int(cfg.task.seq_len), str(model["pooling"]))
        make = attention_factory(
            plain_dict(cfg.attn),
            selector_node(cfg),
            num_heads=int(model["num_heads"]),
            head_dim=int(model["head_dim"]),
        )
        budget = make(0, total).rank_budget(total)
        return None if budget is None else int(budget)
    except Exception:
        value = select(cfg, f"attn.{knob}")
        return value if isinstance(value, int) and not isinstance(value, bool) else None


def new_record(cfg: DictConfig, output_dir: Path, *, with_env: bool = True) -> RunRecord:
    """A schema-complete record (status `running`) for the run `cfg` in `output_dir`: what it is (task, attn,
    selector, protocol, resolved rank budget, seed), where, the resolved config, the code and environment.
    Identity, fingerprint and deviations need the data and are added by the run."""
    seed = select(cfg, "seed")
    planned = select(cfg, "trainer.max_steps")
    record = RunRecord(
        task=select(cfg, "task.name"),
        attn=select(cfg, "attn.name"),
        protocol=select(cfg, "protocol.name"),
        seed=int(seed) if isinstance(seed, int) else seed,
        selector=selector_name(cfg),
        rank_budget=rank_budget(cfg),
        config=resolved_config(cfg),
        run=RunInfo(
            name=output_dir.name,
            output_dir=str(output_dir.resolve()),
            started_at=now(),
            planned_steps=int(planned) if isinstance(planned, int) else None,
            segments=[],
        ),
    )
    return add_environment(record) if with_env else record


def add_environment(record: RunRecord) -> RunRecord:
    """`record` with the code version and environment of this process (what a run records when it starts)."""
    record.code, record.env = code_version(), environment()
    return record
