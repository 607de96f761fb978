"""The run dir: one process at a time (`RunDirLock`), one experiment (`identity.json`), the `latest` link, and no
folder left by a run that could not start. Light on purpose (no torch): the pre-flight and `lra_bench.runs` use it.

**One process.** Two processes training into one dir would interleave `last.ckpt`, `results.json` and the logs. The
lock is filelock's `UnixFileLock` on `<run dir>/.lock`: a kernel `flock`, released when the holder exits however it
exits (SIGKILL, OOM, a node reboot for NFS clients), so a dead run never leaves a stale lock; on NFS, Linux maps
`flock` to the server's byte-range locks. No soft-lock fallback (a marker file outlives a killed holder), the file
kept on release, and the holder (PID, host, start time) written into it through the locked descriptor, which is
what the refusal quotes. Taken by rank 0 only (the other DDP ranks of one launch are its own children).

**One experiment.** The run dir is named after the command's overrides, and some keys are rightly left out of the
name (`data_dir`, `trainer.devices`, …), so two experiments can meet in one folder. Before anything is written there,
a run compares its fingerprint with the folder's `identity.json` (format `lra-bench/run-identity/1`: `{format,
fingerprint, identity, code, created_at}`, written once by the first run there): the same one resumes or starts over
as asked, and a `completed` record is left byte-identical; another one is refused with one line naming the differing
keys, the folder untouched (refused, not sent to a new folder: a name that silently changed with `data_dir` would
hide that the second command is another experiment; `run_name=<name>` gives it its own). A folder from before
`identity.json` is compared through its `results.json`'s config. A folder whose identity predates `data.tokens` (a
path and a cache key that changed whenever the same files were regenerated) holds this experiment when the rest
agrees and its record's source files are this run's (`legacy_same_data`); its `identity.json` is then renewed.

**`<output_root>/<task>/<attn>/latest`** links to the run of that task and attention started last
(`outputs/listops/gpa/latest/curves.png`): a relative symlink, replaced atomically, made only in the usual
`<output_root>/<task>/<attn>/<name>` layout (not for sweep jobs), and `run_name=latest` is refused
(`lra_bench.config.validate.check_run_name`) so no run lands in the link itself.

**No folder from a run that never started.** Hydra makes the run dir, writes `.hydra/` and opens `run.log` before
the run's code starts, so `python run.py task=text` with no IMDB anywhere left a `failed` run behind, listed beside
the runs that trained. So `run.py` asks `is_new` when a single run starts and, when the run ends on a
`DataSourceError` (before the first step), `remove_unstarted` deletes that folder and the folders above it left
empty, up to the output root. A folder that held anything before (a resume) is never removed, and keeps its record.
A refused config (`ConfigError`) keeps its `failed` record.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from filelock import Timeout, UnixFileLock
from omegaconf import DictConfig

from lra_bench.config.validate import LINK
from lra_bench.errors import ConfigError
from lra_bench.record import results
from lra_bench.record.builder import now
from lra_bench.record.identity import (
    DATA_KEYS,
    LEGACY_DATA_KEYS,
    config_identity,
    data_differs,
    data_identity,
    differing_keys,
    predates_data_tokens,
    under,
)
from tasks.files import umask

LOG_NAME = "run.log"  # Hydra's job log of run.py (`<job name>.log`), which the run's tees append to

LOCK_FILE = ".lock"


def holder(run_dir: Path) -> str:
    """Who holds the lock, as its file says ("PID 123 on host since …"), or "another process"."""
    try:
        text = (Path(run_dir) / LOCK_FILE).read_text().split()
    except OSError:
        return "another process"
    if len(text) >= 3:
        return f"PID {text[0]} on {text[1]} (since {text[2]})"
    return f"PID {text[0]}" if text else "another process"


def in_use_error(run_dir: Path) -> ConfigError:
    return ConfigError(
        f"run dir {run_dir} is in use by {holder(run_dir)}: wait for it to finish, stop it, or set run_name= "
        "for a separate run"
    )


def _write_holder(fd: int) -> None:
    """Replace the file's text with this process's PID, host and start time (the lock is held: no reader races)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {now()}\n".encode(), 0)


class RunDirLock:
    """`acquire()` or `ConfigError`; held until `release()`, the end of the process, or until this object is
    garbage-collected (filelock releases then), so the caller keeps it for as long as the run lasts."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self._lock = UnixFileLock(
            self.run_dir / LOCK_FILE,
            timeout=0,  # never wait: a live run is refused at once
            mode=0o666 & ~umask(),  # filelock chmods to `mode`, past the umask: apply it, as every other file does
            thread_local=False,  # the process holds it, whichever thread releases it
            fallback_to_soft=False,
            preserve_lock_file=True,
            on_acquired=_write_holder,
        )

    def acquire(self) -> RunDirLock:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire()
        except Timeout:
            raise in_use_error(self.run_dir) from None
        return self

    def release(self) -> None:
        if self._lock.is_locked:
            self._lock.release(force=True)


def is_held(run_dir: str | Path) -> bool:
    """Whether a live process holds `run_dir`'s lock (a probe: takes and drops a shared lock at once)."""
    path = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # no lock file: never locked
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def check_free(run_dir: str | Path) -> None:
    """Raise `ConfigError` when another process holds `run_dir`'s lock."""
    if is_held(run_dir):
        raise in_use_error(Path(run_dir))


FILENAME = "identity.json"
FORMAT = "lra-bench/run-identity/1"


def read_identity(output_dir: Path) -> dict[str, Any] | None:
    path = Path(output_dir) / FILENAME
    if not path.exists():
        return None
    stored = json.loads(path.read_text())
    if not isinstance(stored, dict) or stored.get("format") != FORMAT:
        raise ConfigError(f"{path}: not an lra-bench run identity (format {stored.get('format')!r}, want {FORMAT!r})")
    return stored


def write_identity(
    output_dir: Path, identity: dict[str, Any], fingerprint: str, code: dict[str, Any], migrated_from: str | None = None
) -> None:
    """`identity.json`; `migrated_from`: the folder's fingerprint before its data identity was renewed
    (`legacy_same_data`, `lra_bench.upgrade_identity`)."""
    payload = {"format": FORMAT, "fingerprint": fingerprint, "identity": identity, "code": code, "created_at": now()}
    if migrated_from:
        payload["migrated_from"] = migrated_from
    results.write_atomic(Path(output_dir) / FILENAME, payload)


def read_existing_record(output_dir: Path) -> dict[str, Any] | None:
    """The folder's `results.json`, or None when there is none or it cannot be read (then nothing is kept)."""
    path = Path(output_dir) / results.FILENAME
    try:
        return results.read_record(path) if path.exists() else None
    except (OSError, ValueError):
        return None


def _changes(before: dict[str, Any], after: dict[str, Any], keys: list[str], limit: int = 5) -> str:
    def show(view: dict[str, Any], key: str) -> str:
        return json.dumps(view[key], default=str) if key in view else "<unset>"

    parts = [f"{k}: {show(before, k)} → {show(after, k)}" for k in keys[:limit]]
    return "; ".join(parts) + (f"; … ({len(keys) - limit} more)" if len(keys) > limit else "")


def check_same_experiment(
    output_dir: Path, identity: dict[str, Any], fingerprint: str, data: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """Refuse (`ConfigError`, one line) when `output_dir` holds another experiment. Returns the stored identity
    (None for a new folder); a folder from before `data.tokens` that holds this experiment returns the new identity
    with `migrated_from` (`legacy_same_data`). `data`: the run's record's `data` section (its source's fingerprint)."""
    stored = read_identity(output_dir)
    if stored is not None:
        if stored.get("fingerprint") == fingerprint:
            return stored
        if legacy_same_data(output_dir, stored, identity, data or {}):
            print(
                f"[lra-bench] {output_dir / FILENAME} predates data.tokens (fingerprint {stored.get('fingerprint')}): "
                f"the same config on the same source files (sha256 {(data or {})['origin']['fingerprint']}), so "
                f"the same experiment; its identity becomes {fingerprint}",
                flush=True,
            )
            return {**stored, "identity": identity, "fingerprint": fingerprint, "migrated_from": stored["fingerprint"]}
        before, keys = stored.get("identity") or {}, differing_keys([stored.get("identity") or {}, identity])
    else:
        record = read_existing_record(output_dir)
        if record is None or not record.get("config"):
            return None
        # a folder from before identity.json: compare what its record holds (the config part)
        before = config_identity(record["config"])
        after = {k: v for k, v in identity.items() if not under(k, DATA_KEYS)}
        keys = differing_keys([before, after])
        if not keys:
            return None
    holder = f"fingerprint {stored.get('fingerprint')}" if stored else "its results.json predates fingerprints"
    raise ConfigError(
        f"run dir {output_dir} holds another experiment ({holder}); this run differs in "
        f"{_changes(before, identity, keys)}. Nothing was changed there: give this run its own folder with "
        "run_name=<name> (or delete that folder to start it over)"
    )


def legacy_same_data(
    output_dir: Path, stored: Mapping[str, Any], identity: Mapping[str, Any], data: Mapping[str, Any]
) -> bool:
    """Whether a run dir whose `identity.json` predates `data.tokens` (its data part `LEGACY_DATA_KEYS`) holds this
    experiment: the same identity outside the data keys, and the same source files by content (`data_differs` of
    its record's `data` and this run's)."""
    old = stored.get("identity") or {}
    if not predates_data_tokens(old) or differing_keys([old, dict(identity)], ignore=(*DATA_KEYS, *LEGACY_DATA_KEYS)):
        return False
    return data_differs((read_existing_record(output_dir) or {}).get("data") or {}, data) is None


def finished_record(output_dir: Path, fingerprint: str, *also: str) -> dict[str, Any] | None:
    """The folder's record when it is `completed` for this fingerprint or one of `also` (the folder's fingerprint
    before `legacy_same_data` renewed it; a record from before fingerprints counts when `check_same_experiment`
    accepted the folder), else None."""
    record = read_existing_record(output_dir)
    if record is None or record.get("status") != "completed":
        return None
    return record if record.get("fingerprint") in (fingerprint, *also, None) else None


def data_identity_of(dm: Any) -> dict[str, Any]:
    """The data part of a run's identity, from its prepared data module: the digest of its tokenized splits."""
    return data_identity(dm.tokens)


def point_latest(cfg: DictConfig, output_dir: Path) -> Path | None:
    """Point `<output_root>/<task>/<attn>/latest` at `output_dir`; return the link, or None outside that layout."""
    group = Path(str(cfg.output_root)) / str(cfg.task.name) / str(cfg.attn.name)
    if output_dir.parent.resolve() != group.resolve() or output_dir.name == LINK:
        return None
    link, tmp = group / LINK, group / f".{LINK}-{os.getpid()}"
    try:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        tmp.symlink_to(output_dir.name, target_is_directory=True)
        os.replace(tmp, link)  # atomic: a reader sees the old link or the new one
    except OSError:  # a filesystem without symlinks, or a real folder named `latest`: the run goes on without
        with contextlib.suppress(OSError):
            tmp.unlink()
        return None
    return link


def is_new(output_dir: Path, hydra_subdir: str | None) -> bool:
    """Whether `output_dir` holds nothing but what Hydra wrote for this job: its `hydra_subdir` (`.hydra`) and an
    empty `run.log`. Asked before the run writes anything."""
    try:
        entries = list(output_dir.iterdir())
    except FileNotFoundError:
        return True
    for entry in entries:
        hydra_own = entry.name == hydra_subdir and entry.is_dir() and not entry.is_symlink()
        empty_log = entry.name == LOG_NAME and entry.is_file() and entry.stat().st_size == 0
        if not (hydra_own or empty_log):
            return False
    return True


def remove_unstarted(output_dir: Path, output_root: Path) -> None:
    """Delete `output_dir`, a new run folder whose run never started, and the folders above it that this leaves
    empty, up to `output_root` (kept). A folder with anything else in it (another run, the `latest` link) stays."""
    shutil.rmtree(output_dir, ignore_errors=True)
    root = output_root.expanduser().resolve()
    folder = output_dir.parent.resolve()
    while folder != root and root in folder.parents:
        try:
            folder.rmdir()  # only an empty folder
        except OSError:
            return
        folder = folder.parent
