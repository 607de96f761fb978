"""Time-boxed child processes whose output reaches a log file line by line.

Why its own module: every stage of the GPU check is a real command (pytest, `run.py`, the bench) that must stop
at its budget without taking the rest of the check down. Each child runs in its own process group, so a
timeout ends the whole tree (a training run's data workers, pytest's subprocesses): SIGTERM first (Lightning
stops at a step boundary and records the run as interrupted), SIGKILL after a grace period. Each output line is
written at once to the shared log, prefixed with the stage label, so a check killed from outside still leaves
everything its children printed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

TAIL_LINES = 400


class LogSink:
    """One append-only text file shared by concurrent children; lines are flushed as they come. Each label may
    write at most `cap_bytes` (the output folder's files are size-limited); beyond that only the tail is kept in
    memory and a note says so."""

    def __init__(self, path: Path, cap_bytes: int = 3 * 2**20) -> None:
        self.path = path
        self.cap_bytes = cap_bytes
        self._lock = threading.Lock()
        self._written: dict[str, int] = {}
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "a", encoding="utf-8", errors="replace")

    def write(self, label: str, line: str) -> None:
        text = f"[{label}] {line.rstrip()}\n"
        with self._lock:
            used = self._written.get(label, 0)
            if used > self.cap_bytes:
                return
            if used + len(text) > self.cap_bytes:
                text = f"[{label}] … output beyond {self.cap_bytes // 2**20} MiB not written here (tail in report)\n"
            self._written[label] = used + len(text)
            self._fh.write(text)
            self._fh.flush()

    def close(self) -> None:
        with self._lock:
            self._fh.close()


@dataclass
class Outcome:
    """How a child ended: exit code (None when it had to be killed), whether its time ran out, its wall time,
    and the last lines it printed as (seconds since start, line)."""

    returncode: int | None
    timed_out: bool
    seconds: float
    tail: list[tuple[float, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def text(self, lines: int = 40) -> str:
        return "\n".join(line for _, line in self.tail[-lines:])


class Job:
    """A started child. `wait(deadline)` returns its Outcome, ending it when the deadline passes."""

    def __init__(
        self,
        label: str,
        cmd: Sequence[str],
        sink: LogSink,
        cwd: Path,
        env: dict[str, str],
        grace_s: float = 20.0,
    ) -> None:
        self.label, self.cmd, self.sink, self.grace_s = label, list(cmd), sink, grace_s
        self.started = time.monotonic()
        self._tail: deque[tuple[float, str]] = deque(maxlen=TAIL_LINES)
        sink.write(label, "$ " + " ".join(self.cmd))
        self.proc = subprocess.Popen(
            self.cmd,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,  # its own process group: a timeout ends its children too
        )
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._tail.append((time.monotonic() - self.started, line.rstrip("\n")))
            self.sink.write(self.label, line)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        """SIGTERM the group, then SIGKILL what is left after the grace period."""
        self._signal(signal.SIGTERM)
        if not self._exited_by(time.monotonic() + self.grace_s):
            self._signal(signal.SIGKILL)
            self.proc.wait()

    def wait(self, deadline: float) -> Outcome:
        """Wait until the child exits or `deadline` (time.monotonic()) passes, then stop it."""
        return wait_all([self], deadline)[0]

    def _exited_by(self, deadline: float) -> bool:
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
            return True
        except subprocess.TimeoutExpired:
            return False

    def outcome(self, timed_out: bool) -> Outcome:
        self._reader.join(5)
        seconds = time.monotonic() - self.started
        code = None if timed_out else self.proc.returncode
        self.sink.write(self.label, f"exit {code} after {seconds:.1f} s" + (" (timed out)" if timed_out else ""))
        return Outcome(code, timed_out, seconds, list(self._tail))


def wait_all(jobs: Sequence[Job], deadline: float) -> list[Outcome]:
    """Wait for every job until `deadline`; then SIGTERM all that are left at once, and SIGKILL those still there
    after the grace period — so concurrent children share one grace period instead of queueing for theirs."""
    late = [job for job in jobs if not job._exited_by(deadline)]
    for job in late:
        job.sink.write(job.label, f"time budget spent after {time.monotonic() - job.started:.0f} s: stopping")
        job._signal(signal.SIGTERM)
    grace_end = time.monotonic() + max((job.grace_s for job in late), default=0.0)
    for job in late:
        if not job._exited_by(grace_end):
            job._signal(signal.SIGKILL)
            job.proc.wait()
    return [job.outcome(job in late) for job in jobs]


def run(
    label: str,
    cmd: Sequence[str],
    sink: LogSink,
    cwd: Path,
    env: dict[str, str],
    timeout_s: float,
    grace_s: float = 20.0,
) -> Outcome:
    """Run `cmd` to completion or for at most `timeout_s` seconds."""
    job = Job(label, cmd, sink, cwd, env, grace_s)
    return job.wait(job.started + timeout_s)
