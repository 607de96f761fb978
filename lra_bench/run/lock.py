"""One process per run dir: a second `run.py` on the same dir refuses with one line naming the holder's PID.

Two processes training into one dir would interleave `last.ckpt`, `results.json` and the logs — a corrupt resume
and a record that mixes two runs. The lock is `flock` on `<run dir>/.lock` (the file names the holder: PID, host,
start time). The kernel releases it when the holder exits however it exits (SIGKILL, OOM, a node reboot for NFS
clients), so a dead run never leaves a stale lock behind; on NFS, Linux maps `flock` to the server's byte-range
locks. Taken by rank 0 only (the other DDP ranks of one launch are its own children).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import os
import socket
from pathlib import Path

from lra_bench.config.validate import ConfigError

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


class RunDirLock:
    """`acquire()` or `ConfigError`; held until `release()` or the end of the process."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self._fd: int | None = None

    def acquire(self) -> RunDirLock:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise in_use_error(self.run_dir) from None
        since = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket.gethostname()} {since}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


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
