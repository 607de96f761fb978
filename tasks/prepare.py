"""Check a task's data and build its tokenized cache: `python -m tasks.prepare task=<t> data_dir=... [key=value ...]`.

Accepts the same keys as `run.py` for the data: `task=<name>`, `data_dir=`, `cache_dir=` (default
`<data_dir>/cache`), `task.<field>=<value>` overrides, and `protocol=<p>` to apply the task settings a protocol
fixes (e.g. `protocol=lra_original task=text` builds the 1000-byte cache that protocol's runs will use), plus
`json=true` to print the summary as JSON. The task's defaults come from `conf/task/<t>.yaml` on top of its schema
dataclass, exactly as Hydra composes them for a run, so the cache built here is the one a run finds.

Prints the source, the split convention, counts per split, label balance and length statistics (and, for
Pathfinder, the zero-byte PNGs skipped). A missing or broken source is one error (exit 2) naming the files it
expected and the three ways to get them. Plain `key=value` parsing (no Hydra app): `tasks` stays independent
of `lra_bench`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from tasks.layout import DataSourceError
from tasks.registry import list_tasks, task_entry

CONF = Path(__file__).resolve().parents[1] / "conf"
TOP_KEYS = ("task", "data_dir", "cache_dir", "protocol", "json")


class UsageError(ValueError):
    """A bad command line; the message says what would be valid."""


def parse_args(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """`key=value` words → (top-level keys, `task.*` overrides as a dotlist without the `task.` prefix)."""
    top: dict[str, str] = {}
    task_overrides: list[str] = []
    for word in argv:
        if word in ("-h", "--help"):
            raise UsageError(__doc__ or "")
        key, sep, value = word.partition("=")
        key = key.lstrip("+")
        if not sep:
            raise UsageError(f"{word!r}: expected key=value (e.g. task=text data_dir=data)")
        if key.startswith("task."):
            task_overrides.append(f"{key[len('task.') :]}={value}")
        elif key in TOP_KEYS:
            top[key] = value
        else:
            raise UsageError(f"{key}={value}: unknown key; valid: {', '.join(TOP_KEYS)}, task.<field>")
    if "task" not in top:
        raise UsageError(f"task=<name> is required; one of {', '.join(list_tasks())}")
    return top, task_overrides


def _yaml_without_defaults(path: Path) -> Any:
    node = OmegaConf.load(path)
    if "defaults" in node:
        node.pop("defaults")
    return node


def task_config(task: str, overrides: Sequence[str], protocol: str | None = None) -> dict[str, Any]:
    """The task node as a run composes it: schema ← conf/task/<t>.yaml ← the protocol's recipe ← overrides."""
    _, schema = task_entry(task)
    cfg = OmegaConf.structured(schema)
    yaml = CONF / "task" / f"{task}.yaml"
    if yaml.exists():
        cfg = OmegaConf.merge(cfg, _yaml_without_defaults(yaml))
    if protocol:
        recipe = CONF / "recipe" / f"{protocol}_{task}.yaml"
        if not recipe.exists():
            known = sorted({p.stem.rsplit(f"_{task}", 1)[0] for p in (CONF / "recipe").glob(f"*_{task}.yaml")})
            raise UsageError(f"protocol={protocol}: no {recipe.relative_to(CONF.parent)}; valid: {', '.join(known)}")
        node = _yaml_without_defaults(recipe)
        if "task" in node:
            cfg = OmegaConf.merge(cfg, node.task)
    if overrides:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def default_data_dir() -> str:
    """As `conf/config.yaml`: `conf/local/default.yaml`'s data_dir if set, else $LRA_DATA_DIR, else `data`."""
    local = CONF / "local" / "default.yaml"
    if local.exists():
        node = OmegaConf.load(local)
        if isinstance(node.get("data_dir"), str) and "${" not in node.get("data_dir"):
            return str(node.get("data_dir"))
    return os.environ.get("LRA_DATA_DIR", "data")


def prepare(
    task: str, data_dir: str, cache_dir: str | None = None, overrides: Sequence[str] = (), protocol: str | None = None
) -> dict[str, Any]:
    """Build (or find) the cache and return {task, cache, data_info, splits: describe()}."""
    cls, _ = task_entry(task)
    cfg = task_config(task, overrides, protocol)
    dm = cls(cfg, data_dir=data_dir, cache_dir=cache_dir or str(Path(data_dir) / "cache"), batch_size=1)
    dm.prepare_data()
    stats = dm.describe()
    return {
        "task": task,
        "protocol": protocol,
        "cache": str(dm.cache_path),
        "data_info": dm.data_info(),
        "splits": stats,
    }


def format_report(report: dict[str, Any]) -> str:
    info = report["data_info"]
    lines = [
        f"[{report['task']}] source: {info.get('source')}",
        f"  split: {info.get('split')}",
        f"  tokenizer: {info.get('tokenizer_version')}  max_length: {info.get('max_length')}  "
        f"seq_len: {info.get('seq_len')}",
        f"  cache: {report['cache']}",
    ]
    extra = {
        k: v
        for k, v in info.items()
        if k not in ("source", "split", "tokenizer_version", "max_length", "seq_len", "text_length") and v
    }
    if info.get("skipped_empty_pngs") is not None:
        extra["skipped_empty_pngs"] = info["skipped_empty_pngs"]
    for key, value in extra.items():
        lines.append(f"  {key}: {value}")
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
    try:
        top, overrides = parse_args(argv)
        data_dir = top.get("data_dir") or default_data_dir()
        report = prepare(top["task"], data_dir, top.get("cache_dir"), overrides, top.get("protocol"))
    except (UsageError, DataSourceError, KeyError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"error: {message}", file=sys.stderr)
        return 2
    except Exception as err:  # config mistakes (OmegaConf validation, bad values)
        if type(err).__module__.startswith("omegaconf") or isinstance(err, ValueError):
            print(f"error: {err}", file=sys.stderr)
            return 2
        raise
    if str(top.get("json", "false")).lower() in ("1", "true", "yes"):
        print(json.dumps(report, indent=2, default=str))
    else:
        print(format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
