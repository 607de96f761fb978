"""Tokenized splits cached with HF `datasets` (`save_to_disk`), keyed by every preprocessing parameter.

Directory: `<cache_dir>/<task>/<version>-<sha1 of the params>/<split>/`, with `params.json` beside it so a
person can see what a cache holds, and `tokens.json`: the digest of the tokenized splits (`tokens_digest`), which is
the data's part of a run's identity — what the model reads, wherever the source lies and whenever it was written
(the cache key covers the source files' paths and mtimes, so it is only a cache's business).

Building writes into a temp dir and renames, so an interrupted build never leaves a half cache; reloading
memory-maps the Arrow files (cheap in every DataLoader worker).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from datasets import Dataset, load_from_disk
from datasets.utils.logging import disable_progress_bar

from tasks.files import atomic_path, make_readable

disable_progress_bar()  # our own messages say what is being cached

CACHE_VERSION = 1
#: the file in a cache folder that holds its tokens' digest
TOKENS_FILE = "tokens.json"
#: the rows hashed at a time (bounded memory on a 400 MB split)
_DIGEST_ROWS = 4096


def cache_key(params: dict[str, Any]) -> str:
    blob = json.dumps({"cache_version": CACHE_VERSION, **params}, sort_keys=True, default=str)
    return f"v{CACHE_VERSION}-{hashlib.sha1(blob.encode()).hexdigest()[:12]}"


def arrays_to_dataset(columns: dict[str, np.ndarray]) -> Dataset:
    """Columns of equal length; 2-D arrays become fixed-size lists (zero-copy numpy batches on reload)."""
    arrays, names = [], []
    for name, values in columns.items():
        values = np.ascontiguousarray(values)
        if values.ndim == 2:
            flat = pa.array(values.reshape(-1))
            arrays.append(pa.FixedSizeListArray.from_arrays(flat, values.shape[1]))
        else:
            arrays.append(pa.array(values))
        names.append(name)
    return Dataset(pa.Table.from_arrays(arrays, names=names))


def cache_path(cache_dir: str | Path, task: str, params: dict[str, Any]) -> Path:
    return Path(cache_dir).expanduser() / task / cache_key(params)


def exists(path: Path, splits: tuple[str, ...]) -> bool:
    return all((path / split / "dataset_info.json").exists() for split in splits) and (path / "params.json").exists()


def save_splits(path: Path, splits: dict[str, Dataset], params: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        make_readable(tmp)  # mkdtemp's 0700 would survive the rename: a shared cache must be readable
        for name, ds in splits.items():
            ds.save_to_disk(str(tmp / name))
        (tmp / "params.json").write_text(json.dumps(params, indent=2, sort_keys=True, default=str) + "\n")
        if path.exists():  # another process finished first: keep theirs
            shutil.rmtree(tmp)
            return
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_split(path: Path, split: str) -> Dataset:
    return load_from_disk(str(path / split)).with_format("numpy")


def digest_splits(path: Path, splits: tuple[str, ...]) -> str:
    """sha256 (16 hex digits) of the cached splits as the model reads them: per split, per column (sorted), its
    name, numpy dtype and row shape, then its values row block by row block. Arrays and names only — no Arrow
    metadata, no library version — so the same tokens give the same digest on every machine and build."""
    whole = hashlib.sha256()
    for split in splits:
        data = load_split(path, split)
        for column in sorted(data.column_names):
            whole.update(f"{split}/{column}/{len(data)}".encode())
            values = data.select_columns([column])  # a block decodes this column alone
            for start in range(0, len(data), _DIGEST_ROWS):
                block = np.ascontiguousarray(values[start : start + _DIGEST_ROWS][column])
                if start == 0:
                    whole.update(f"{block.dtype.str}{block.shape[1:]}".encode())
                whole.update(block.tobytes())
    return whole.hexdigest()[:16]


def tokens_digest(path: Path, splits: tuple[str, ...]) -> str:
    """The cache's `digest_splits`, read from its `tokens.json`; a cache from before the file gets it computed and
    written beside its splits (skipped silently where the cache is read-only: the digest is still returned)."""
    stored = path / TOKENS_FILE
    if stored.exists():
        return str(json.loads(stored.read_text())["digest"])
    digest = digest_splits(path, splits)
    with contextlib.suppress(OSError):
        write_tokens(path, digest)
    return digest


def write_tokens(path: Path, digest: str) -> None:
    """`tokens.json` into the cache folder `path`, atomically (a reader never sees half a file)."""
    with atomic_path(path / TOKENS_FILE) as tmp:
        tmp.write_text(json.dumps({"digest": digest, "of": "tasks.cache.digest_splits"}) + "\n")
