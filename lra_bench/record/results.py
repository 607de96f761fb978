"""The result record: one `results.json` per run, written atomically, read by the leaderboard.

Schema (version 1) — every key is always present; unknown values are null:

    schema_version  int
    status          "running" | "completed" | "failed" | "interrupted"
    error           str | null          (the exception message when failed)
    task, attn, selector, protocol      str (selector null when the attention takes none)
    num_landmarks   int | str | null
    seed            int
    run             {name, output_dir, started_at, finished_at, wandb_id, resumed_from_step}
    metrics         {val_acc, test_acc, best_step, train_steps, step_time_median_s, tokens_per_s,
                     peak_memory_mib, params, data_share}
    diagnostics     {"latest": {...}, "best": {...}} per layer/head quantities (see lra_bench.diagnostics.metrics)
    data            {text_length, max_length, seq_len, tokenizer_version, split, source}
    env             {git_commit, python, platform, packages{...}, hardware{...}}
    config          the fully resolved Hydra config

The record is rewritten at each milestone (start, end, failure) so a killed job still leaves its status.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from tasks.files import atomic_path

SCHEMA_VERSION = 1
FILENAME = "results.json"
STATUSES = ("running", "completed", "failed", "interrupted")
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)

METRIC_KEYS = (
    "val_acc",
    "test_acc",
    "best_step",
    "train_steps",
    "step_time_median_s",
    "tokens_per_s",
    "peak_memory_mib",
    "params",
    "data_share",
)
RUN_KEYS = ("name", "output_dir", "started_at", "finished_at", "wandb_id", "resumed_from_step")
DATA_KEYS = ("text_length", "max_length", "seq_len", "tokenizer_version", "split", "source")


def empty_record() -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "status": "running",
        "error": None,
        "task": None,
        "attn": None,
        "selector": None,
        "protocol": None,
        "num_landmarks": None,
        "seed": None,
        "run": dict.fromkeys(RUN_KEYS),
        "metrics": dict.fromkeys(METRIC_KEYS),
        "diagnostics": {"latest": None, "best": None},
        "data": dict.fromkeys(DATA_KEYS),
        "env": {},
        "config": {},
    }


def write_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write JSON to a temp file of this process beside `path`, fsync, then rename: readers never see half a file;
    the file gets the umask's mode (group-readable on shared clusters), a failed write leaves no temp file.

    On a full disk (ENOSPC, EDQUOT, EFBIG) the record is rewritten in place instead: truncating frees the blocks the
    new content needs, and a record that says `failed` beats one stuck at `running`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(payload, indent=2, sort_keys=False, default=_jsonable) + "\n"
    try:
        with atomic_path(path) as tmp, open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        if err.errno not in DISK_FULL or not path.exists():
            raise
        with open(path, "w") as fh:
            fh.write(text)


def read_record(path: Path) -> dict[str, Any]:
    with open(path) as fh:
        record = json.load(fh)
    if record.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: schema_version={record.get('schema_version')!r}, expected {SCHEMA_VERSION}")
    return record


def validate_record(record: dict[str, Any]) -> list[str]:
    """Names of missing keys (empty when the record matches the schema)."""
    missing = [k for k in empty_record() if k not in record]
    for section, keys in (("metrics", METRIC_KEYS), ("run", RUN_KEYS), ("data", DATA_KEYS)):
        missing += [f"{section}.{k}" for k in keys if k not in record.get(section, {})]
    if record.get("status") not in STATUSES:
        missing.append(f"status (got {record.get('status')!r})")
    return missing


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    return str(value)
