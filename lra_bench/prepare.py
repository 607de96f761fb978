"""Check a task's data and build its tokenized cache: `python -m lra_bench.prepare task=<t> [override ...] [--json]`.

Takes exactly the overrides `run.py` takes (`task=`, `data_dir=`, `cache_dir=`, `task.<field>=`, `protocol=` — a
protocol may fix task settings, e.g. `protocol=lra_original task=text` builds that protocol's 1000-byte cache)
and composes the same config tree, so the cache built here is the one the run finds. `--json` prints the summary
as JSON.

Prints the source, the split convention, counts per split, label balance and length statistics (and, for
Pathfinder, the zero-byte PNGs skipped). A missing or broken source, or a bad override, is one error line
(exit 2) naming the files it expected and the ways to get them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig

from lra_bench.config.compose import compose_config, one_line
from lra_bench.config.validate import check_components
from lra_bench.errors import ConfigError
from tasks.layout import DataSourceError


def prepare(cfg: DictConfig) -> dict[str, Any]:
    """Build (or find) the cache of `cfg`'s task and return {task, protocol, cache, tokens, data_info, splits}
    (`tokens`: the digest a run's identity names the data by, so two machines can tell they hold the same data)."""
    from lra_bench.run.build import build_datamodule  # torch and Lightning: after the command line is read

    check_components(cfg)
    dm = build_datamodule(cfg)
    dm.prepare_data()
    return {
        "task": str(cfg.task.name),
        "protocol": str(cfg.protocol.name),
        "cache": str(dm.cache_path),
        "tokens": dm.tokens,
        "data_info": dm.data_info(),
        "splits": dm.describe(),
    }


def format_report(report: dict[str, Any]) -> str:
    info = report["data_info"]
    lines = [
        f"[{report['task']}] source: {info.get('source')}",
        f"  split: {info.get('split')}",
        f"  tokenizer: {info.get('tokenizer_version')}  max_length: {info.get('max_length')}  "
        f"seq_len: {info.get('seq_len')}",
        f"  cache: {report['cache']}",
        f"  tokens: {report['tokens']} (data.tokens: the data's part of a run's identity)",
    ]
    shown = ("source", "split", "tokenizer_version", "max_length", "seq_len", "text_length")
    extra = {k: v for k, v in info.items() if k not in shown and v}
    if info.get("skipped_empty_pngs") is not None:
        extra["skipped_empty_pngs"] = info["skipped_empty_pngs"]
    lines += [f"  {key}: {value}" for key, value in extra.items()]
    lines.append(
        f"  {'split':<6} {'count':>8}  {'labels (value:count)':<34} {'majority':>8}  "
        f"{'len min/median/max':>20}  {'at max':>6}"
    )
    for split, s in report["splits"].items():
        labels = " ".join(f"{k}:{v}" for k, v in s["labels"].items())
        lengths = f"{s['length_min']}/{s['length_median']:g}/{s['length_max']}"
        lines.append(
            f"  {split:<6} {s['count']:>8}  {labels:<34} {s['majority_share']:>8.3f}  {lengths:>20}  "
            f"{s['at_max_length_share']:>6.1%}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    as_json = "--json" in argv
    overrides = [a for a in argv if a != "--json"]

    try:
        cfg = compose_config(overrides)
        report = prepare(cfg)
    except (ConfigError, DataSourceError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # Hydra/OmegaConf composition errors: unknown option, bad override, wrong type
        if type(err).__module__.split(".")[0] in ("hydra", "omegaconf"):
            print(f"error: {one_line(err)}", file=sys.stderr)
            return 2
        raise
    print(json.dumps(report, indent=2, default=str) if as_json else format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
