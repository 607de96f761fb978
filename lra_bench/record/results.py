"""The result record: one `results.json` per run, written atomically, read by the leaderboard.

The schema's types live in `lra_bench.record.schema` (a dataclass per section); this module is the file's I/O.

Schema (version 2) — every key is always present; unknown values are null:

    schema_version  int
    status          "running" | "completed" | "failed" | "interrupted" | "evaluated"
                    (completed: every planned step ran and the best-val checkpoint was tested; evaluated: a
                    checkpoint tested by the eval entry, not a training run — the leaderboard never counts it)
    error           str | null          (the exception message when failed)
    task, attn, selector, protocol      str (selector null when the attention takes none)
    rank_budget     int | null          the rank budget the model spends: landmarks, features or projection rows
                                        (the attention's `rank_knob`, resolved: never "log2"; null = exact)
    seed            int
    fingerprint     str | null          16 hex digits: `identity.fingerprint(identity)`
    identity        {dotted.key: value} everything that can change the result (`lra_bench.record.identity`)
    code            {commit, dirty}     the code that wrote this record (git; null outside a checkout)
    off_protocol    bool | null         whether the run changed a value of its protocol (null: not checked)
    deviations      {dotted.key: {"protocol": value, "run": value}} | null   the changed values
    evaluation      {checkpoint, checkpoint_step, checkpoint_fingerprint} | null   (status evaluated only)
    predictions     str | null          file name of the per-example test outputs beside this record
    stage           "supervised" | "pretrain"            (self-pretraining: see lra_bench.run.pretrain)
    pretraining     "none" | "mlm" | "causal"            what the encoder was pretrained with before this run
    pretrained      {path, fingerprint, family_fingerprint, objective, mask_ratio, steps, …} | null
    pretrain        {objective, mask_ratio, mask_id, loss, holdout_fraction, curve, best_val_acc, final} | null
                    (stage pretrain only)
    run             {name, output_dir, started_at, finished_at, wandb_id, resumed_from_step, resumed_from,
                     planned_steps, segments: [{started_at, from_step, code, kernels, saved_at, to_step}]}
    metrics         {val_acc, test_acc, test_loss, test_examples, best_step, train_steps, step_time_median_s,
                     tokens_per_s, peak_memory_mib, params, data_share, timed_steps, step_time_iqr_s,
                     load_avg_1m}      (the last three: how many steps the median is over, their interquartile
                                        range, the mean 1-minute load average while they ran; null in older records)
    diagnostics     {"latest": {...}, "best": {...}} per layer/head quantities (see lra_bench.diagnostics.metrics)
    data            {text_length, max_length, seq_len, tokenizer_version, split, source}
    env             {git_commit, python, platform, packages{...}, hardware{...}}
    config          the fully resolved Hydra config

The record is rewritten at each milestone (start, end, failure) so a killed job still leaves its status.
Version 1 records (before `fingerprint` … `predictions`) still read: `read_record` fills the newer keys with
null, so the leaderboard groups them by what they say (see `lra_bench.leaderboard.aggregate`).
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from lra_bench.record.schema import STATUSES, DataInfo, Metrics, RunInfo, RunRecord
from tasks.files import atomic_path

READABLE_VERSIONS = (1, 2)
FILENAME = "results.json"
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)

METRIC_KEYS = Metrics.keys()
#: metric keys added to schema 2 after it first shipped: null when reading a record written before them
LATER_METRIC_KEYS = ("timed_steps", "step_time_iqr_s", "load_avg_1m")
RUN_KEYS = RunInfo.keys()
#: top-level keys added in schema 2 (null in a version-1 record)
V2_KEYS = ("fingerprint", "identity", "code", "off_protocol", "deviations", "evaluation", "predictions")
DATA_KEYS = DataInfo.keys()


def empty_record() -> dict[str, Any]:
    """Every key of the schema, each null or its default (`lra_bench.record.schema.RunRecord`)."""
    return RunRecord().to_dict()


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
    """The record at `path`; a version-1 record gets the version-2 keys as null (in memory only)."""
    with open(path) as fh:
        record = json.load(fh)
    if not isinstance(record, dict) or record.get("schema_version") not in READABLE_VERSIONS:
        version = record.get("schema_version") if isinstance(record, dict) else None
        raise ValueError(f"{path}: schema_version={version!r}, expected one of {READABLE_VERSIONS}")
    if record["schema_version"] == 1:
        for key in V2_KEYS:
            record.setdefault(key, None)
        record.setdefault("stage", "supervised")
        record.setdefault("pretraining", "none")
        record.setdefault("pretrained", None)
        record.setdefault("pretrain", None)
        for section, keys in (("metrics", METRIC_KEYS), ("run", RUN_KEYS)):
            if isinstance(record.get(section), dict):
                for key in keys:
                    record[section].setdefault(key, None)
    if isinstance(record.get("metrics"), dict):
        for key in LATER_METRIC_KEYS:
            record["metrics"].setdefault(key, None)
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
