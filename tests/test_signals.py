"""Real signals to real `run.py` processes: SIGTERM and Ctrl-C save `last.ckpt` at the signal's step, record the
run as `interrupted` and exit 143 / 130; a signal before training still records the stop; the same command resumes
from exactly that step, and W&B's two offline parts continue each other's steps (one run once synced).

SIGTERM goes to the process and its children, as SLURM and `kill` of a job's process tree do: W&B's service dies with
it. Ctrl-C (SIGINT) goes to the process only, as a terminal sends it (W&B's service runs in its own session).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from lra_bench.record import results
from tests.conftest import REPO, TINY_LISTOPS, checkpoint_step, fault, run_cli, saved_step, start_run, wait_until
from tests.wandb_log import history_steps, run_ids

pytestmark = pytest.mark.slow

MAX_STEPS, VAL_EVERY = 30, 10
ARGS = [
    *[a for a in TINY_LISTOPS if not a.startswith(("trainer.max_steps", "trainer.val_check_interval", "logger="))],
    "attn=full",
    f"trainer.max_steps={MAX_STEPS}",
    f"trainer.val_check_interval={VAL_EVERY}",  # last.ckpt after the validation at 10; the next at 20
    "trainer.log_every_n_steps=1",  # a W&B call in every step
    *fault(step_sleep_s=0.3),
    "diagnostics.enabled=false",
    "run_name=sig",
]


def _env(tmp_path: Path, logger: str) -> dict[str, str]:
    mode = "offline" if logger == "default" else "disabled"
    return {"WANDB_MODE": mode, "WANDB_DIR": str(tmp_path / "wandb-dir"), "OMP_NUM_THREADS": "1"}


def _args(tmp_path: Path, logger: str, *extra: str) -> list[str]:
    return [*ARGS, f"logger={logger}", f"output_root={tmp_path / 'outputs'}", f"data_dir={tmp_path / 'data'}", *extra]


def _interrupt(tmp_path: Path, logger: str, signum: int, *, tree: bool) -> tuple[int, str, Path, float]:
    """Start the run, wait for the post-validation last.ckpt (step 10), let ~5 more steps pass, send `signum`.
    Returns (exit code, output, run dir, seconds from the signal to the exit)."""
    out = tmp_path / "outputs" / "listops" / "full" / "sig"
    log_path = tmp_path / f"{signal.Signals(signum).name}.log"
    env = {**os.environ, **_env(tmp_path, logger), "PYTHONUNBUFFERED": "1"}
    with open(log_path, "w") as log:
        proc = start_run(_args(tmp_path, logger), env, stdout=log)
        try:
            last = out / "checkpoints" / "last.ckpt"
            wait_until(lambda: checkpoint_step(last) == VAL_EVERY, proc, 300, "last.ckpt at step 10")
            time.sleep(1.5)
            main = psutil.Process(proc.pid)
            children = main.children(recursive=True) if tree else []
            sent = time.monotonic()
            # as SLURM signals a job: every process of it, wandb-core too, at once. Whether the run's next W&B
            # call meets the service alive or dead is a race; either way the run must save at this step
            for p in children:
                p.send_signal(signum)
            main.send_signal(signum)
            proc.wait(timeout=120)
            took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return proc.returncode, log_path.read_text(errors="replace"), out, took


@pytest.mark.timeout(600)
def test_sigterm_saves_at_the_signal_exits_143_and_the_same_command_resumes_there(tmp_path: Path) -> None:
    rc, output, out, took = _interrupt(tmp_path, "default", signal.SIGTERM, tree=True)
    assert rc == 143, output[-3000:]
    step = saved_step(output)
    assert VAL_EVERY < step < 2 * VAL_EVERY  # between two validations: saved because of the signal
    assert checkpoint_step(out / "checkpoints" / "last.ckpt") == step
    record = results.read_record(out / results.FILENAME)
    assert record["status"] == "interrupted" and f"stopped by SIGTERM at step {step}" in record["error"]
    print(f"SIGTERM: saved at step {step} ({step - VAL_EVERY} steps after the last periodic save), exit {took:.1f}s")

    resumed = run_cli(_args(tmp_path, "default"), tmp_path, env=_env(tmp_path, "default"))  # the same command again
    record = results.read_record(out / results.FILENAME)
    assert record["status"] == "completed" and record["run"]["resumed_from_step"] == step
    assert record["metrics"]["train_steps"] == MAX_STEPS

    # one W&B run id, two offline parts whose steps continue each other (W&B's own step is the trainer's)
    wandb_id = (out / "wandb_id.txt").read_text().strip()
    parts = sorted(out.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(parts) == 2 and run_ids(parts) == {wandb_id}
    first, second = (history_steps(p) for p in parts)
    assert first == sorted(first) and second == sorted(second)
    assert first[-1] >= VAL_EVERY and second[0] == step >= first[-1] and second[-1] == MAX_STEPS, (first, second)
    wandb = Path(sys.executable).with_name("wandb")
    sync = subprocess.run(
        [str(wandb), "sync", "--dry-run", "--id", wandb_id, *map(str, (p.parent for p in parts))],
        capture_output=True,
        text=True,
        env={**os.environ, "WANDB_MODE": "offline"},
        timeout=120,
    )
    assert sync.returncode == 0 and "Would sync 2 run(s)" in sync.stderr + sync.stdout, sync.stderr  # the README's
    # and the command the resumed run's summary ends with: both parts, oldest first, under the one id
    both = " ".join(str(p.parent) for p in parts)
    assert f"W&B offline:   wandb sync --id {wandb_id} {both}    # " in resumed.stdout, resumed.stdout[-2000:]


@pytest.mark.timeout(600)
def test_ctrl_c_saves_at_the_signal_and_exits_130(tmp_path: Path) -> None:
    rc, output, out, took = _interrupt(tmp_path, "csv", signal.SIGINT, tree=False)
    assert rc == 130, output[-3000:]
    step = saved_step(output)
    assert VAL_EVERY < step < 2 * VAL_EVERY and checkpoint_step(out / "checkpoints" / "last.ckpt") == step
    record = results.read_record(out / results.FILENAME)
    assert record["status"] == "interrupted" and f"stopped by SIGINT at step {step}" in record["error"]
    assert "Ctrl-C again to stop at once" in output
    print(f"Ctrl-C: saved at step {step}, exit {took:.1f}s after the signal")


@pytest.mark.timeout(600)
def test_sigterm_before_training_records_the_stop_and_exits_143(tmp_path: Path) -> None:
    """While the data is generated (no step to finish): the record says interrupted, not running forever."""
    out = tmp_path / "outputs" / "listops" / "full" / "sig"
    args = _args(tmp_path, "csv", "task.gen_num_train=40000", "task.gen_max_length=64")
    env = {**os.environ, **_env(tmp_path, "csv")}
    proc = start_run(args, env, stdout=subprocess.PIPE)
    try:
        generating = lambda: bool(list((tmp_path / "data").glob(".listops-1000.*.tmp")))  # noqa: E731 (record written)
        wait_until(generating, proc, 120, "ListOps generation")
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=120)[0].decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, output[-3000:]
    record = results.read_record(out / results.FILENAME)
    assert record["status"] == "interrupted" and "SIGTERM" in record["error"], record["error"]
    assert not (out / "checkpoints").exists()  # nothing to save, nothing half-written
    assert record["error"].endswith("no checkpoint was saved: re-running the same command starts from step 0")
    assert not list((tmp_path / "data").glob(".listops-1000.*.tmp"))  # the generation's temp dir went too


STATUS = re.compile(r"\[lra-bench\] step (\d+)/")


def _steps_logged(run_log: Path) -> int:
    """The last step a status line in the run's own `run.log` reports (0 before the first)."""
    found = STATUS.findall(run_log.read_text(errors="replace")) if run_log.exists() else []
    return int(found[-1]) if found else 0


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.timeout(600)
def test_ctrl_c_under_tee_saves_even_though_the_pipe_died_and_the_record_tells_the_truth(tmp_path: Path) -> None:
    """`python run.py … 2>&1 | tee log`, Ctrl-C: the terminal sends SIGINT to the pipeline's process group, tee dies,
    the run's stdout and stderr become a broken pipe. The run still saves at the signal's step, says so in run.log,
    exits 130, and its record's promise holds: the same command resumes there.

    The pipeline is built as a shell builds it: both processes in one process group of their own (the test, like an
    interactive shell, stays out of it); stdout is block-buffered, as it is for `python` without `-u`."""
    out = tmp_path / "outputs" / "listops" / "full" / "sig"
    args = _args(tmp_path, "csv", "callbacks.progress_bar=status", "callbacks.status_every_s=1e-6")  # a line a step
    env = {**os.environ, **_env(tmp_path, "csv")}
    env.pop("PYTHONUNBUFFERED", None)
    cmd = [sys.executable, str(REPO / "run.py"), *args]
    # both with Ctrl-C's default action, as in a terminal's foreground job (a background `pytest &` passes SIG_IGN on)
    run = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        process_group=0,
        preexec_fn=_default_sigint,
    )
    tee = subprocess.Popen(
        ["tee", str(tmp_path / "log")],
        stdin=run.stdout,
        stdout=subprocess.DEVNULL,
        process_group=run.pid,
        preexec_fn=_default_sigint,
    )
    assert run.stdout is not None
    run.stdout.close()  # tee alone reads the pipe: once it is gone, writing to it fails (EPIPE)
    try:
        wait_until(lambda: _steps_logged(out / "run.log") >= 3, run, 300, "3 training steps")
        os.killpg(run.pid, signal.SIGINT)  # Ctrl-C: the whole foreground process group
        run.wait(timeout=120)
        tee.wait(timeout=30)
    finally:
        for proc in (run, tee):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    run_log = (out / "run.log").read_text(errors="replace")
    assert tee.returncode == -signal.SIGINT  # the pipe's reader really died of the Ctrl-C
    assert run.returncode == 130, run_log[-3000:]
    step = saved_step(run_log)
    assert 3 <= step < VAL_EVERY  # no periodic save yet: only the stop saved it
    assert checkpoint_step(out / "checkpoints" / "last.ckpt") == step
    record = results.read_record(out / results.FILENAME)
    assert record["status"] == "interrupted"
    assert record["error"] == (
        f"stopped by SIGINT at step {step}; re-running the same command resumes from checkpoints/last.ckpt "
        f"(step {step})"
    )

    run_cli(args, tmp_path, env=_env(tmp_path, "csv"))  # the same command again
    record = results.read_record(out / results.FILENAME)
    assert record["status"] == "completed" and record["run"]["resumed_from_step"] == step
