"""`python -m lra_bench.evaluate CHECKPOINT [--out DIR] [--retest] [KEY=VALUE ...]`: test exactly one checkpoint.

A command above the run package, which loads (torch) only once the arguments and the checkpoint are checked. The
model is rebuilt from the checkpoint's own run config (stored in every checkpoint the harness writes; for an older
one, the config in its run dir's `results.json`), so the architecture, attention and selector are the ones that were
trained, and the weights and buffers are loaded by the same `trainer.test` the training run used: the test accuracy
and loss are the ones it recorded for that checkpoint. `KEY=VALUE` may set logistics only (`data_dir`, `cache_dir` —
which follows `data_dir` unless given —, `trainer.accelerator`, …): any other key would make it another experiment.

Writes `results.json` (status `evaluated`), `test_predictions.npz` and `run.log` into `--out DIR`, by default
`<run dir>/eval/<checkpoint name>/`, never over the training run's record (`lra_bench.run.evaluation`). Exit 2 with
one line on a bad checkpoint, override or data source.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lra_bench.config.setup import quiet_third_party_warnings, setup
from lra_bench.config.validate import check_writable, validate
from lra_bench.errors import ConfigError
from lra_bench.record import results
from lra_bench.record.checkpoint_file import CHECKPOINT_DIR, load_usable, meta_of
from lra_bench.record.identity import LOGISTICS, is_logistics
from tasks.layout import DataSourceError


def default_out(checkpoint: Path) -> Path:
    """`<run dir>/eval/<checkpoint stem>/` for `<run dir>/checkpoints/<name>.ckpt` (else beside the file)."""
    run_dir = checkpoint.parent.parent if checkpoint.parent.name == CHECKPOINT_DIR else checkpoint.parent
    return run_dir / "eval" / checkpoint.stem


def run_config(path: Path, checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The resolved config the checkpoint was trained with."""
    meta = meta_of(checkpoint)
    if meta is not None and isinstance(meta.get("config"), dict):
        return meta["config"]
    record_path = default_out(path).parent.parent / results.FILENAME
    if record_path.exists():
        record = results.read_record(record_path)
        if isinstance(record.get("config"), dict) and record["config"]:
            return record["config"]
    raise ConfigError(
        f"checkpoint {path} carries no run config (written before lra-bench stored it) and {record_path} does not "
        "exist: test it with `python run.py train=false ckpt_path=<it> <the overrides it was trained with>`"
    )


#: logistics keys the eval entry does not offer (Hydra's own, the tests' fault injection, which stages run)
NOT_OFFERED = ("hydra", "callbacks.fault", "train", "test", "retest")


def apply_overrides(config: dict[str, Any], overrides: Sequence[str]) -> DictConfig:
    """The checkpoint's config with logistics `KEY=VALUE` overrides; any other key is a one-line error."""
    cfg = OmegaConf.create(config)
    keys = []
    for item in overrides:
        key, sep, _ = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{item!r}: expected KEY=VALUE")
        if not is_logistics(key):
            raise ConfigError(
                f"{key}: part of the checkpoint's experiment, so it cannot change here; only logistics may "
                f"({', '.join(p for p in LOGISTICS if p not in NOT_OFFERED)})"
            )
        keys.append(key)
    cfg.merge_with(OmegaConf.from_dotlist(list(overrides)))
    if "data_dir" in keys and "cache_dir" not in keys:
        cfg.cache_dir = f"{cfg.data_dir}/cache"  # the config tree's default: the cache lives under the data
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lra_bench.evaluate",
        description="Test one checkpoint with the model it was trained as; record it (status evaluated).",
    )
    parser.add_argument("checkpoint", type=Path, help="a .ckpt written by run.py (best-<step>.ckpt, last.ckpt)")
    parser.add_argument("overrides", nargs="*", help="logistics only: data_dir=..., trainer.accelerator=cpu, …")
    parser.add_argument("--out", type=Path, default=None, help="record folder (default: <run dir>/eval/<name>/)")
    parser.add_argument("--retest", action="store_true", help="test again even if this evaluation is recorded")
    args = parser.parse_args(argv)

    setup()
    quiet_third_party_warnings()
    try:
        path = args.checkpoint.expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"{args.checkpoint}: no such checkpoint file")
        cfg = apply_overrides(run_config(path, load_usable(path)), args.overrides)
        cfg.train, cfg.ckpt_path, cfg.retest, cfg.print_config = False, str(path), bool(args.retest), False
        out = (args.out or default_out(path)).expanduser()
        check_writable(out)
        validate(cfg)
        # torch's and Lightning's run code: only once the arguments and the checkpoint are checked (--help stays fast)
        from lra_bench.run.evaluation import evaluate_into

        evaluate_into(cfg, out)
    except (ConfigError, DataSourceError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
