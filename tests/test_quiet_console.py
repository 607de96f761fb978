"""What a person sees, from real processes: a run's terminal shows what runs, its progress and its summary;
Lightning's chatter, the model summary and the config tree go to run.log only; a status line never lands inside the
progress bar's line (a real pseudo-terminal); `--help` starts with our examples."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, TINY_LISTOPS, fault, run_cli
from tests.terminal import run_in_terminal

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ARGS = [
    *[a for a in TINY_LISTOPS if not a.startswith(("trainer.max_steps", "callbacks.progress_bar", "logger", "print_"))],
    "attn=full",
    "trainer.max_steps=8",
    "trainer.val_check_interval=4",
    "diagnostics.enabled=false",
    "run_name=q",
]
NOISE = ("GPU available", "Total FLOPs", "Total Flops", "Trainable params", "wandb: WARNING", "├── task", "Seed set")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_in_a_terminal_shows_what_a_person_reads(tmp_path: Path) -> None:
    rc, screen = run_in_terminal([*ARGS, "callbacks.progress_bar=auto", *fault(step_sleep_s=0.1)], tmp_path)
    assert rc == 0, screen[-3000:]
    text = ANSI.sub("", screen)  # rich and wandb colour their words
    shown = [noise for noise in NOISE if noise in text]
    assert not shown, screen[-4000:]
    assert "lra-bench — listops · full — completed" in text  # the summary
    # the status line printed after the first evaluation starts a line of its own, not inside the bar's line
    before = screen.split("[lra-bench] projected:")[0].rsplit("\n", 1)[-1]
    assert not ANSI.sub("", before.rsplit("\r", 1)[-1]).strip(), repr(before[-300:])

    run_dir = tmp_path / "outputs" / "listops" / "full" / "q"
    log = (run_dir / "run.log").read_text()
    for kept in ("GPU available", "Trainable params", "├── task", "[lra-bench] projected:"):
        assert kept in log, kept  # nothing is lost: the terminal's leftovers are in the run's log

    best = next((run_dir / "checkpoints").glob("best-*.ckpt"))
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    evaluated = subprocess.run(
        [sys.executable, "-m", "lra_bench.evaluate", str(best), f"data_dir={tmp_path / 'data'}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    said = evaluated.stdout + evaluated.stderr
    assert "lra-bench — listops · full — evaluated" in said
    assert "callbacks used to create the checkpoint" not in said and "GPU available" not in said, said[-3000:]
    eval_log = (run_dir / "eval" / best.stem / "run.log").read_text()
    assert "callbacks used to create the checkpoint" in eval_log and "GPU available" in eval_log


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_tuning_search_prints_no_plugin_setup(tmp_path: Path) -> None:
    """Hydra loading the Optuna sweeper made alembic log seven "setup plugin alembic.…" lines."""
    args = [a for a in ARGS if not a.startswith("run_name")]
    proc = run_cli(
        ["hparams_search=optuna", "tuning.budget=1", *args, f"hydra.sweep.dir={tmp_path / 'sweep'}"], tmp_path
    )
    assert "Study name" in proc.stdout + proc.stderr  # the search really ran through the Optuna sweeper
    assert "setup plugin" not in proc.stdout + proc.stderr


def test_help_starts_with_our_examples() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "run.py"), "--help"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("lra-bench: ") and "is powered by Hydra" not in proc.stdout
    assert "python run.py task=listops attn=gpa" in proc.stdout and "HF_HUB_OFFLINE=0" in proc.stdout
    assert re.search(r"^attn: .*nystrom", proc.stdout, re.M)  # the groups, listed from conf/ by Hydra
