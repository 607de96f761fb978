"""Read W&B's offline transaction log (`offline-run-*/run-<id>.wandb`) in tests, without W&B's service.

The file is what `wandb sync` uploads: a 7-byte header (`:W&B`, magic 0xBEE1, version 0), then LevelDB-log framed
records (32 KiB blocks; each chunk: crc32 u32, length u16, type u8 — FULL 1, FIRST 2, MIDDLE 3, LAST 4), each record
a `wandb_internal_pb2.Record` protobuf. wandb 0.31 ships the protobuf classes but no Python reader any more, hence
these few lines. Checksums are not verified (a test reads files W&B has just closed).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[Any]:
    """Every `Record` of one transaction log, in order."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a W&B transaction log (starts with {data[:7]!r})")
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if length == 0 and kind == 0:  # zero padding up to the next block
            pos += left
            continue
        pending += data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def history(path: Path) -> list[dict[str, Any]]:
    """The history rows (`wandb.log` calls) of one log, each as {key: decoded value}."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in record.history.item}
            )
    return rows


def history_steps(path: Path) -> list[int]:
    """The `_step` of every history row: what the W&B server orders (and de-duplicates) a run's rows by."""
    return [int(row["_step"]) for row in history(path)]


def run_ids(paths: Sequence[Path]) -> set[str]:
    """The W&B run ids the logs belong to (one id: `wandb sync` uploads them as one run)."""
    ids = set()
    for path in paths:
        for record in records(path):
            if record.WhichOneof("record_type") == "run":
                ids.add(record.run.run_id)
    return ids
