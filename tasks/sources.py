"""Helpers the real-data tasks share: the "three ways to get it" error, HF `datasets` sources, byte packing.

A missing or broken source is ONE `DataSourceError` that names what was expected where, and the three ways
to get the data: the official archive, the Hugging Face dataset, our generator (each task says which of the
three exist for it).

The Hugging Face hub is asked only when the user allows it. `datasets` left to itself goes online whenever no
offline variable is set, and on a machine without network it retries the hub with back-off for 30-60 s (twenty
warnings) before failing — even when the dataset sits in the local HF cache. So the tasks run the hub offline
unless the user set `HF_HUB_OFFLINE` / `HF_DATASETS_OFFLINE` (`offline_unless_allowed`, called when `tasks` is
imported, before `datasets` reads them): local files first, then the local HF cache, and the clear error at once.
`HF_HUB_OFFLINE=0` allows a download; then the hub's host is probed first (a few seconds at most), so an unreachable
hub is one clear line too, not a minute of retries.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Sequence
from enum import Enum
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from tasks.layout import DataSourceError

OFFLINE_VARS = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
HUB_PROBE_S = 3.0  # how long an allowed hub may take to accept a connection before it counts as unreachable


def offline_unless_allowed() -> None:
    """Offline for the HF hub unless the user said otherwise (any of `OFFLINE_VARS` set, e.g. `HF_HUB_OFFLINE=0`).

    Must run before `datasets` / `huggingface_hub` are imported: both read the variables once, at import."""
    if not any(var in os.environ for var in OFFLINE_VARS):
        for var in OFFLINE_VARS:
            os.environ[var] = "1"


def plain(value: Any) -> Any:
    """Enum config values (str-valued) → plain str, so messages and cache keys read `holdout`, not `V.holdout`."""
    return value.value if isinstance(value, Enum) else value


class MissingSourceError(DataSourceError):
    """The one "no usable source" error of a task (already lists the three ways; never wrap it again)."""


def source_error(
    what: str,
    expected: Iterable[str | Path],
    *,
    archive: str | None,
    hf: str | None,
    generator: str | None,
    problem: str | None = None,
) -> MissingSourceError:
    """One error naming the expected files and the three ways to get them (`None` = not available)."""
    lines = [f"{what}: {problem or 'no usable source found'}.", "Expected one of:"]
    lines += [f"  - {p}" for p in expected]
    lines.append("Get it one of three ways:")
    lines.append(f"  1. official archive: {archive or 'not in the official lra_release archive'}")
    lines.append(f"  2. Hugging Face: {hf or 'no Hugging Face dataset known'}")
    lines.append(f"  3. our generator: {generator or 'none (real data is needed)'}")
    return MissingSourceError("\n".join(lines))


def hf_hint(hf_name: str, disk_path: Path) -> str:
    """How to get a Hugging Face dataset onto a machine without network (the 'HF' way of every error)."""
    return (
        f'on a machine with network: `python -c "import datasets; datasets.load_dataset('
        f"'{hf_name}').save_to_disk('{disk_path}')\"` and copy {disk_path} here, or run "
        "once with network and HF_HUB_OFFLINE=0 (lets a run download) to fill the local HF cache"
    )


def offline_state() -> str:
    on = [v for v in OFFLINE_VARS if os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")]
    return f"offline mode ({', '.join(f'{v}=1' for v in on)})" if on else "online mode"


def is_disk_dataset(path: Path) -> bool:
    """A `DatasetDict.save_to_disk` folder (or a single `Dataset`) — recognised by its metadata files."""
    return (path / "dataset_dict.json").exists() or (path / "dataset_info.json").exists()


def load_disk_dataset(path: Path, splits: Sequence[str]) -> dict[str, Any]:
    """The named splits of a `save_to_disk` folder, or a `DataSourceError` naming the folder."""
    from datasets import DatasetDict, load_from_disk  # slow to import: only when a dataset is read

    try:
        loaded = load_from_disk(str(path))
    except Exception as err:  # any failure means the folder is unusable
        raise DataSourceError(f"{path}: not a readable datasets.save_to_disk folder ({err})") from None
    if not isinstance(loaded, DatasetDict):
        raise DataSourceError(f"{path}: holds one Dataset; expected a DatasetDict with splits {list(splits)}")
    missing = [s for s in splits if s not in loaded]
    if missing:
        raise DataSourceError(f"{path}: DatasetDict lacks split(s) {missing}; it has {sorted(loaded)}")
    return {s: loaded[s] for s in splits}


def hub_unreachable(timeout_s: float = HUB_PROBE_S) -> str | None:
    """Why the HF hub cannot be reached within `timeout_s` (a TCP connection to its host), or None if it can."""
    from huggingface_hub import constants  # reads the offline switches at import: after `import tasks` set them

    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=timeout_s).close()
    except OSError as err:
        return f"{constants.ENDPOINT} is not reachable within {timeout_s:g} s ({err})"
    return None


def load_hub_dataset(name: str, splits: Sequence[str]) -> tuple[dict[str, Any] | None, str]:
    """`datasets.load_dataset(name)`: the local HF cache when offline (the default, see the module docstring), the
    hub when the user allowed it and it answers. (splits, "") or (None, why) — never a minute of retries."""
    from datasets import config, load_dataset  # slow to import: only when a dataset is read

    if not config.HF_HUB_OFFLINE:
        unreachable = hub_unreachable()
        if unreachable:
            return None, (
                f"the Hugging Face hub is allowed ({offline_state()}) but {unreachable}; without network, leave "
                "HF_HUB_OFFLINE/HF_DATASETS_OFFLINE unset to read the local HF cache"
            )
    try:
        loaded = load_dataset(name)
    except Exception as err:  # offline and not cached, no network, a broken cache: all mean "not available"
        if config.HF_HUB_OFFLINE:
            return None, (
                f"{name!r} is not readable from the local Hugging Face cache ({type(err).__name__}: {err}), and the "
                f"hub was not asked: {offline_state()}, the default; HF_HUB_OFFLINE=0 lets a run download it"
            )
        return None, f"datasets.load_dataset({name!r}) failed in {offline_state()}: {type(err).__name__}: {err}"
    missing = [s for s in splits if s not in loaded]
    if missing:
        return None, f"datasets.load_dataset({name!r}) has no split(s) {missing}"
    return {s: loaded[s] for s in splits}, ""


def path_stamp(path: Path, pattern: str | None = None) -> list[Any]:
    """Identity of a source for cache keys: resolved path, size and mtime (of the folder's matching files)."""
    path = Path(path)
    if pattern is None:
        st = path.stat()
        return [str(path.resolve()), st.st_size, st.st_mtime_ns]
    files = sorted(path.glob(pattern))
    return [
        str(path.resolve()),
        len(files),
        sum(f.stat().st_size for f in files),
        max((f.stat().st_mtime_ns for f in files), default=0),
    ]


def pack_bytes(
    docs: Sequence[bytes], max_length: int, seq_len: int, offset: int = 1, chunk: int = 8192
) -> tuple[np.ndarray, np.ndarray]:
    """Documents (bytes) → ids `[n, seq_len]` int16 (byte + offset, pad 0) and lengths `[n]` int32.

    Each document is cut to `max_length` bytes; the fill is one boolean-mask assignment per chunk of rows
    (a row-major mask visits positions in the order of the concatenated bytes), no per-byte Python.
    """
    if max_length > seq_len:
        raise ValueError(f"task.max_length={max_length} exceeds task.seq_len={seq_len}; need max_length <= seq_len")
    n = len(docs)
    ids = np.zeros((n, seq_len), dtype=np.int16)
    lengths = np.zeros(n, dtype=np.int32)
    positions = np.arange(seq_len)
    for start in range(0, n, chunk):
        cut = [d[:max_length] for d in docs[start : start + chunk]]
        lens = np.fromiter(map(len, cut), dtype=np.int32, count=len(cut))
        lengths[start : start + len(cut)] = lens
        flat = np.frombuffer(b"".join(cut), dtype=np.uint8)
        if flat.size:
            block = ids[start : start + len(cut)]
            block[positions[None, :] < lens[:, None]] = flat.astype(np.int16) + offset
    return ids, lengths
