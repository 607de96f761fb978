"""What a person sees, from real `run.py` processes: in a terminal (a real pseudo-terminal) the bar counts
`step/max_steps` with the loss and an ETA, not "Epoch 0/-2"; without one a status line every N seconds; and
`run.log` holds the run's log — the status lines, the summary, the error — not only Lightning's few records."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lra_bench.run.terminal import progress_mode
from tests.conftest import TINY_LISTOPS, fault, run_cli
from tests.terminal import run_in_terminal

ARGS = [
    *[a for a in TINY_LISTOPS if not a.startswith(("trainer.max_steps", "callbacks.progress_bar"))],
    "attn=full",
    "trainer.max_steps=12",
    "diagnostics.enabled=false",
    "run_name=p",
]


def test_auto_is_a_bar_in_a_terminal_and_status_lines_otherwise() -> None:
    assert progress_mode("auto", isatty=True) == "bar" and progress_mode("auto", isatty=False) == "status"
    assert progress_mode(True, isatty=False) == "status" and progress_mode(False) == "none"
    assert progress_mode("bar", isatty=False) == "bar"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_without_a_terminal_status_lines_and_run_log_holds_the_run(tmp_path: Path) -> None:
    proc = run_cli([*ARGS, "callbacks.progress_bar=auto", "callbacks.status_every_s=0.001"], tmp_path)
    lines = re.findall(r"\[lra-bench\] step (\d+)/12 \(.*%\) \| loss [\d.]+ .*steps/s", proc.stdout)
    assert lines and lines[-1] == "12", proc.stdout[-3000:]
    assert "ETA " in proc.stdout and "Epoch 0/-2" not in proc.stdout
    log = (tmp_path / "outputs" / "listops" / "full" / "p" / "run.log").read_text()
    assert "[lra-bench] step 12/12" in log  # our prints
    assert "lra-bench — listops · full — completed" in log and "results.json" in log  # the summary
    assert "[pytorch_lightning" in log  # Hydra's logging records still go there
    assert "\x1b[" not in log and "\r" not in log  # no terminal codes, no redraws

    failed = run_cli([*ARGS, "run_name=q", "data.batch_size=128"], tmp_path, check=False)  # refused in the run
    assert failed.returncode == 2
    log = (tmp_path / "outputs" / "listops" / "full" / "q" / "run.log").read_text()
    assert "error: the train split has 64 examples" in log  # the error is in the run's log
    crashed = run_cli([*ARGS, "run_name=n", *fault(nan_loss_at_step=2)], tmp_path, check=False)
    assert crashed.returncode != 0
    log = (tmp_path / "outputs" / "listops" / "full" / "n" / "run.log").read_text()
    assert "Traceback (most recent call last)" in log and "FloatingPointError: loss is nan at step 1" in log


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_in_a_terminal_the_bar_counts_steps_to_max_steps(tmp_path: Path) -> None:
    rc, screen = run_in_terminal([*ARGS, "callbacks.progress_bar=auto", *fault(step_sleep_s=0.1)], tmp_path, "disabled")
    assert rc == 0, screen[-3000:]
    bar = [line for line in re.split(r"[\r\n]", screen) if "train step" in line]
    assert bar and any("12/12" in line for line in bar), screen[-3000:]
    assert any(re.search(r"\d+/12 \[[\d:]+<[\d:?]+", line) for line in bar)  # elapsed<remaining: the ETA
    assert any("train/loss=" in line for line in bar)
    assert "/-2" not in screen  # Lightning's "Epoch 0/-2" of a max_steps run


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_run_projects_its_whole_schedule_evaluations_included(tmp_path: Path) -> None:
    """After its first evaluation a run prints what is left: steps × the time of a step and evaluations × the time of
    an evaluation, timed apart (a steps-only ETA leaves out a third of a faithful LRA schedule)."""
    args = [a for a in ARGS if not a.startswith("trainer.val_check_interval")]
    proc = run_cli(
        [*args, "trainer.val_check_interval=4", "callbacks.progress_bar=status", *fault(step_sleep_s=0.05)], tmp_path
    )
    found = re.findall(
        r"projected: [\d:]+ to the end of the schedule \((\d+) steps × ([\d.]+) s \+ (\d+) evaluations", proc.stdout
    )
    assert len(found) == 1, proc.stdout[-3000:]  # once, after the first evaluation (step 4 of 12)
    steps, step_s, evaluations = found[0]
    assert (int(steps), int(evaluations)) == (8, 2)  # evaluations at steps 8 and 12 are still to come
    assert float(step_s) >= 0.05  # every step slept 0.05 s: a step's time, not an evaluation's share of it
