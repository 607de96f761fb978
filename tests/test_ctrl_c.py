"""Ctrl-C typed at a real terminal (a pty that is `run.py`'s controlling terminal) ends the run with one last line:
the step the checkpoint on disk holds and the command that resumes from it (issue 30, item 9).

It used to say it differently each time: the console never said how to resume (only `results.json` did), a second
Ctrl-C printed a traceback, and a Ctrl-C during the first evaluation printed no "saved" line although the
checkpoint was saved (the evaluation's own save came first, so the stop had nothing left to save).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lra_bench.record import results
from tests.conftest import REPO, STOPPED, TINY_LISTOPS, checkpoint_step, fault
from tests.terminal import read_pty, read_until, start_in_terminal, type_ctrl_c

pytestmark = pytest.mark.slow

MAX_STEPS, VAL_EVERY = 30, 10
ARGS = [
    *[a for a in TINY_LISTOPS if not a.startswith(("trainer.max_steps", "trainer.val_check_interval", "callbacks."))],
    "attn=full",
    f"trainer.max_steps={MAX_STEPS}",
    f"trainer.val_check_interval={VAL_EVERY}",
    "trainer.limit_val_batches=1",  # the first evaluation is one batch: the save after it comes before the stop
    "callbacks.progress_bar=status",
    "callbacks.status_every_s=1e-6",  # a status line every step: the test sees where training is (0.01 s skipped
    # step 10 on CI's CPU, whose steps took 4.6 ms, and the run finished before the Ctrl-C)
    "diagnostics.enabled=false",
]
ECHO = re.compile(r"\^C")  # the terminal echoes each Ctrl-C


def _lines(screen: str) -> list[str]:
    """The screen's lines, the terminal's `^C` echoes and redraws removed, blank ones left out."""
    lines = (ECHO.sub("", line.rsplit("\r", 1)[-1]).strip() for line in screen.replace("\r\n", "\n").split("\n"))
    return [line for line in lines if line]


def _ends_with_the_stopped_line(screen: str) -> re.Match[str]:
    """The screen's last line says the signal, the step saved and the command that resumes; no traceback."""
    assert "Traceback" not in screen and "KeyboardInterrupt" not in screen, screen[-3000:]
    last = _lines(screen)[-1]
    found = STOPPED.fullmatch(last)
    assert found, screen[-3000:]
    return found


@pytest.mark.timeout(600)
def test_ctrl_c_during_the_first_evaluation_says_the_step_saved_and_the_command_resumes_there(tmp_path: Path) -> None:
    """`make demo`'s preset: its folder is named after the clock, so the command that resumes names the folder."""
    args = ["experiment=demo", *ARGS, *fault(eval_sleep_s=6)]
    proc, terminal = start_in_terminal(args, tmp_path, wandb_mode="disabled")
    try:
        read_until(terminal, proc, f"step {VAL_EVERY}/{MAX_STEPS}", 300)  # its evaluation (6 s) starts now
        time.sleep(1.5)
        type_ctrl_c(terminal)
        screen = read_pty(terminal, proc, timeout=120)
        proc.wait(timeout=60)
    finally:
        os.close(terminal)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, screen[-3000:]
    found = _ends_with_the_stopped_line(screen)
    assert found.group(1, 2, 3, 4) == ("SIGINT", str(VAL_EVERY), "checkpoints/last.ckpt", str(VAL_EVERY))
    [out] = (tmp_path / "outputs" / "listops" / "full").glob("demo-*")
    assert checkpoint_step(out / "checkpoints" / "last.ckpt") == VAL_EVERY
    assert results.read_record(out / results.FILENAME)["status"] == "interrupted"

    command = shlex.split(found.group(5))  # typed as printed (only `python` is this interpreter)
    assert command[:2] == ["python", str(REPO / "run.py")] and command[-1] == f"hydra.run.dir={out}", command
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    resumed = subprocess.run([sys.executable, *command[1:]], cwd=REPO, env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [p.name for p in out.parent.glob("demo-*")] == [out.name]  # the same folder, no new one
    record = results.read_record(out / results.FILENAME)
    assert record["status"] == "completed" and record["run"]["resumed_from_step"] == VAL_EVERY
    assert record["metrics"]["train_steps"] == MAX_STEPS


@pytest.mark.timeout(600)
def test_ctrl_c_again_and_again_prints_no_traceback_and_the_same_last_line(tmp_path: Path) -> None:
    """The second Ctrl-C stops the step at once; later ones (while the record is written, while the process exits)
    are told or ignored: the last line still says what is saved and how to resume, and the exit status is 130."""
    out = tmp_path / "outputs" / "listops" / "full" / "ctrl-c"
    args = [*ARGS, "run_name=ctrl-c", *fault(step_sleep_s=0.3)]
    proc, terminal = start_in_terminal(args, tmp_path, wandb_mode="offline")
    chunks = []
    try:
        chunks.append(read_until(terminal, proc, f"step {VAL_EVERY + 2}/{MAX_STEPS}", 300))
        type_ctrl_c(terminal)
        chunks.append(read_until(terminal, proc, "Ctrl-C again to stop at once", 60))
        while proc.poll() is None:  # a user holding Ctrl-C down
            type_ctrl_c(terminal)
            chunks.append(read_pty(terminal, proc, timeout=0.25))
        chunks.append(read_pty(terminal, proc, timeout=5))
    finally:
        os.close(terminal)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    screen = "".join(chunks)
    assert proc.returncode == 130, screen[-3000:]
    found = _ends_with_the_stopped_line(screen)
    saved = checkpoint_step(out / "checkpoints" / "last.ckpt")
    assert found.group(1) == "SIGINT" and int(found.group(4)) == saved >= VAL_EVERY, (found.group(0), saved)
    record = results.read_record(out / results.FILENAME)
    assert record["status"] == "interrupted" and record["run"]["finished_at"]  # the record was written to its end
