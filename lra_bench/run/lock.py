"""One process per run dir: a second `run.py` on the same dir refuses with one line naming the holder's PID.

Two processes training into one dir would interleave `last.ckpt`, `results.json` and the logs — a corrupt resume
and a record that mixes two runs. The lock is filelock's `UnixFileLock` on `<run dir>/.lock`: a kernel `flock`,
released when the holder exits however it exits (SIGKILL, OOM, a node reboot for NFS clients), so a dead run
never leaves a stale lock behind; on NFS, Linux maps `flock` to the server's byte-range locks. The options keep
exactly that: no soft-lock fallback (a marker file outlives a killed holder), the file kept on release, and the
holder (PID, host, start time) written into it through the locked descriptor (`on_acquired`), which is what the
refusal quotes. Taken by rank 0 only (the other DDP ranks of one launch are its own children).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import socket
from pathlib import Path

from filelock import Timeout, UnixFileLock

from lra_bench.errors import ConfigError
from tasks.files import umask

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
    since = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {since}\n".encode(), 0)


def _run_dir_lock(run_dir: Path) -> UnixFileLock:
    return UnixFileLock(
        run_dir / LOCK_FILE,
        timeout=0,  # never wait: a live run is refused at once
        mode=0o666 & ~umask(),  # filelock chmods to `mode`, past the umask: apply it, as every other file does
        thread_local=False,  # the process holds it, whichever thread releases it
        fallback_to_soft=False,
        preserve_lock_file=True,
        on_acquired=_write_holder,
    )


class RunDirLock:
    """`acquire()` or `ConfigError`; held until `release()`, the end of the process, or until this object is
    garbage-collected (filelock releases then), so the caller keeps it for as long as the run lasts."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self._lock = _run_dir_lock(self.run_dir)

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
