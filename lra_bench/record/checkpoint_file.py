"""Reading a checkpoint file: the names in a run's `checkpoints/`, the one way a checkpoint is loaded (on the CPU,
`weights_only=True`), whether a file can be resumed or tested from, and the metadata the harness stamps into it.

Below the run and the config checks alike: the pre-flight checks an explicit `ckpt_path` with `load_usable`, a
fine-tune's `pretrained=` is located and checked before anything is built (`lra_bench.config.pretrained_run`), the
evaluation entry and the reproduction pages read checkpoints, and the run resumes from them
(`lra_bench.run.checkpoints`, which also writes them and stamps the metadata, `IdentityStamp`). torch loads only
when a file is read, so the pre-flight imports this module without it.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

from lra_bench.errors import ConfigError

CHECKPOINT_DIR = "checkpoints"  # `<run dir>/checkpoints/`: every checkpoint a run writes
LAST = "last.ckpt"
PREV = "last-prev.ckpt"
REQUIRED_KEYS = ("state_dict", "global_step", "loops", "optimizer_states")


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint the way every resume/test in this harness does: on CPU, `weights_only=True`."""
    import torch  # only when a file is read: the pre-flight imports this module, and must not load torch

    return torch.load(str(path), map_location="cpu", weights_only=True)


def best_checkpoint_of(last: Path) -> str | None:
    """The best-val checkpoint file name `last` refers to (its ModelCheckpoint state), if any."""
    state = load_checkpoint(last)
    for key, value in (state.get("callbacks") or {}).items():
        if "BestCheckpoint" in str(key) or "ModelCheckpoint" in str(key):
            path = value.get("best_model_path") if isinstance(value, dict) else None
            if path:
                return Path(path).name
    return None


def read_checkpoint(path: str | Path) -> tuple[dict[str, Any] | None, str | None]:
    """`(checkpoint, None)` when `path` can be resumed or tested from, else `(None, why not)`: unreadable, not
    weights-only, or incomplete. One load; the caller keeps the checkpoint instead of reading the file again."""
    if Path(path).is_file() and not zipfile.is_zipfile(path):  # torch.save's format (Lightning's) is a zip archive
        return None, "not a torch.save zip archive: truncated, or not a checkpoint"
    try:
        ckpt = load_checkpoint(path)
    except Exception as err:  # truncated zip, pickle error, unsafe global, I/O error: all mean "do not use"
        return None, f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
    if not isinstance(ckpt, dict):
        return None, f"not a Lightning checkpoint (a {type(ckpt).__name__})"
    missing = [k for k in REQUIRED_KEYS if k not in ckpt]
    return (None, f"incomplete (missing {missing})") if missing else (ckpt, None)


def checkpoint_problem(path: Path) -> str | None:
    """Why `path` cannot be resumed from (None when it can)."""
    return read_checkpoint(path)[1]


def load_usable(path: str | Path, shown: object = None) -> dict[str, Any]:
    """The checkpoint at `path` (weights-only), or a one-line `ConfigError` when it cannot be resumed or tested from
    (`shown`: the value as the user typed it, for the message). The one check behind an explicit `ckpt_path`
    (pre-flight) and every later load."""
    checkpoint, problem = read_checkpoint(Path(path))
    if checkpoint is None:
        raise ConfigError(
            f"ckpt_path={path if shown is None else shown}: not a usable checkpoint ({problem}); use 'last', null, "
            "or a checkpoint this harness wrote"
        )
    return checkpoint


#: where the harness's metadata sits in every checkpoint it writes (`lra_bench.run.checkpoints.IdentityStamp`)
META_KEY = "lra_bench"
META_FORMAT = "lra-bench/checkpoint-meta/1"


def meta_of(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    meta = checkpoint.get(META_KEY)
    return meta if isinstance(meta, dict) and meta.get("format") == META_FORMAT else None
