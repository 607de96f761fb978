"""The run-dir lock (`lra_bench.run.rundir`, on filelock): one holder per run dir, the refusal names the holder's
PID, a refusal leaves the holder's file alone, and the kernel frees the lock when the holder is killed. The
two-`run.py` case through the CLI is `tests/test_run_dir.py` (slow tier)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lra_bench.errors import ConfigError
from lra_bench.run.rundir import LOCK_FILE, RunDirLock, check_free
from tests.conftest import REPO

HOLD = (
    "import sys, time; sys.path.insert(0, {repo!r}); from lra_bench.run.rundir import RunDirLock; "
    "lock = RunDirLock({run_dir!r}).acquire(); print('held', flush=True); time.sleep(120)"
)


def test_a_second_holder_in_this_process_is_refused_naming_the_pid(tmp_path: Path) -> None:
    first = RunDirLock(tmp_path).acquire()
    written = (tmp_path / LOCK_FILE).read_text()
    assert written.split()[0] == str(os.getpid())
    with pytest.raises(ConfigError, match=rf"^run dir {tmp_path} is in use by PID {written.split()[0]} on "):
        RunDirLock(tmp_path).acquire()
    with pytest.raises(ConfigError, match="is in use by PID"):
        check_free(tmp_path)
    assert (tmp_path / LOCK_FILE).read_text() == written  # the refusals did not touch the holder's file
    first.release()
    check_free(tmp_path)  # free again
    RunDirLock(tmp_path).acquire().release()


def test_the_lock_dies_with_a_killed_holder(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD.format(repo=str(REPO), run_dir=str(tmp_path))], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError) as refused:
            RunDirLock(tmp_path).acquire()
        assert str(refused.value).count("\n") == 0 and f"in use by PID {holder.pid} on " in str(refused.value)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    mine = RunDirLock(tmp_path).acquire()  # no stale lock: the kernel released the killed holder's flock
    mine.release()
