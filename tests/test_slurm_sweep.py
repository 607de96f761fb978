"""A real SLURM sweep through hydra-submitit-launcher (`hydra/launcher=slurm`), on the test cluster of
tests/slurm_cluster.py: 2 attentions × 2 seeds as one job array, where

* (full, seed 0) is requeued with `scontrol requeue` mid-training (SIGTERM, then SLURM requeues it);
* (full, seed 1) gets submitit's USR2 (what a time limit or a preemption sends): the job finishes its step, saves
  last.ckpt, and submitit requeues it — one requeue owner, Lightning's SLURM auto-requeue being off;
* (nystrom, seed 1) fails for real: its data dir is empty and `task.generate_if_missing=false`;
* (nystrom, seed 0) just runs.

Each requeued job must resume from its own last.ckpt in its own sweep subdir, finish all steps, and continue its
W&B run; the failure must leave the other records intact and appear in the leaderboard built in the sweep dir.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from lra_bench.record import results
from lra_bench.run.build import build_datamodule
from tests import conftest_slurm
from tests.conftest import STOPPED, TINY_LISTOPS, checkpoint_step, compose, fault, start_run

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

local_slurm = conftest_slurm.local_slurm  # the session fixture, visible even if this file runs first

MAX_STEPS = 16
TINY = [a for a in TINY_LISTOPS if not a.startswith(("trainer.max_steps", "trainer.val_check_interval", "logger="))]


def _make_data(root: Path, names: list[str]) -> None:
    """The tiny ListOps files, generated once and copied to each job's data dir."""
    template = root / "template"
    dm = build_datamodule(compose([*TINY, f"data_dir={template}"]))
    dm.ensure_source()
    for name in names:
        shutil.copytree(template, root / name)


def _records(sweep: Path) -> dict[tuple[str, int], tuple[Path, dict]]:
    out = {}
    for path in sweep.rglob(results.FILENAME):
        try:
            rec = results.read_record(path)
        except (OSError, ValueError):
            continue
        out[(rec["attn"], rec["seed"])] = (path.parent, rec)
    return out


def _wait_for_checkpoint(sweep: Path, key: tuple[str, int], master: subprocess.Popen, timeout: float) -> tuple:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _records(sweep).get(key)
        if found:
            out, rec = found
            step = checkpoint_step(out / "checkpoints" / "last.ckpt")
            if 0 < step < MAX_STEPS - 4 and rec["env"].get("slurm_job_id"):
                return out, rec["env"]["slurm_job_id"], step
            if step >= MAX_STEPS - 4:
                pytest.fail(f"{key} got too far ({step}) before it could be interrupted")
        if master.poll() is not None:
            pytest.fail(f"the sweep ended (rc={master.returncode}) before {key} had a checkpoint")
        time.sleep(0.2)
    pytest.fail(f"no last.ckpt for {key} within {timeout}s")


def _send_usr2(job_id: str) -> None:
    """USR2 to the job's Python task, directly (the cluster is this host).

    `scancel --signal=USR2 <job>` delivers it too, but on this loaded single-node cluster it can block for tens of
    seconds and, the job meanwhile being requeued by submitit, signal the *next* attempt during its start-up
    (observed: the restarted job died of USR2 before submitit had installed its handler).
    """
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if f"SLURM_JOB_ID={job_id}".encode() in environ and b"submitit" in cmdline and b"python" in cmdline:
            pids.append(int(proc.name))
    assert pids, f"no Python task of job {job_id} found"
    for pid in pids:
        os.kill(pid, signal.SIGUSR2)


def _job_log(cluster, sweep: Path, job_id: str) -> str:
    """The submitit stdout and stderr logs (all attempts) of the array task whose SLURM job id is `job_id` (a stop
    says its last line on stderr)."""
    info = cluster.job_info(job_id)[0]
    task = f"{info['ArrayJobId']}_{info['ArrayTaskId']}"
    return "\n".join(p.read_text(errors="replace") for p in sorted((sweep / ".submitit" / task).glob("*_log.*")))


@pytest.mark.timeout(900)
def test_slurm_sweep_requeue_resume_and_failure(local_slurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(local_slurm.conf))  # submitit's sbatch/scontrol use the test cluster
    data = tmp_path / "data"
    _make_data(data, ["full-0", "full-1", "nystrom-0"])  # nystrom-1: no data, and not allowed to generate it
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        *TINY,
        "attn=full,nystrom",
        "seed=0,1",
        f"data_dir='{data}/${{attn.name}}-${{seed}}'",
        "task.generate_if_missing=false",
        f"trainer.max_steps={MAX_STEPS}",
        "trainer.val_check_interval=8",
        "callbacks.checkpoint_every_n_steps=3",
        *fault(step_sleep_s=0.5),  # slow steps, so the signals land mid-training
        "logger=default",  # CSV + W&B offline: the W&B run must continue after a requeue
        "hydra/launcher=slurm",
        "hydra.launcher.partition=debug",
        "hydra.launcher.gpus_per_node=null",
        "hydra.launcher.cpus_per_task=1",
        "hydra.launcher.mem_gb=null",
        *conftest_slurm.sweep_overrides(sweep),
    ]
    env = conftest_slurm.job_env(local_slurm, tmp_path)
    log_path = tmp_path / "master.log"
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        master = start_run(args, env, stdout=log)
        try:
            out0, job0, step0 = _wait_for_checkpoint(sweep, ("full", 0), master, timeout=300)
            local_slurm.requeue(job0)  # SIGTERM now, SIGKILL after KillWait; SLURM requeues the job
            out1, job1, step1 = _wait_for_checkpoint(sweep, ("full", 1), master, timeout=300)
            _send_usr2(job1)  # what SLURM sends before a time limit or at preemption (--signal=USR2@...)
            master.wait(timeout=600)
        finally:
            if master.poll() is None:
                master.kill()
                master.wait(timeout=30)
    elapsed = time.monotonic() - t0
    master_log = log_path.read_text(errors="replace")
    print(f"sweep of 4 jobs with 2 requeues took {elapsed:.0f}s; signals at steps {step0} and {step1}")

    # a failed job fails the sweep, but not the other jobs
    assert master.returncode != 0, master_log[-3000:]
    records = _records(sweep)
    assert set(records) == {("full", 0), ("full", 1), ("nystrom", 0), ("nystrom", 1)}, master_log[-3000:]
    for key in (("full", 0), ("full", 1), ("nystrom", 0)):
        out, rec = records[key]
        job_log = _job_log(local_slurm, sweep, str(rec["env"]["slurm_job_id"]))
        assert rec["status"] == "completed", (key, rec["error"], job_log[-3000:])
        assert rec["metrics"]["train_steps"] == MAX_STEPS, key
        assert rec["metrics"]["test_acc"] is not None and rec["metrics"]["val_acc"] is not None, key
        assert out.parent == sweep, f"{key} ran in {out}, not in a subdir of the sweep"
    failed_out, failed = records[("nystrom", 1)]
    assert failed["status"] == "failed" and "DataSourceError" in failed["error"]

    # both interrupted jobs were requeued by SLURM and resumed from their own last.ckpt, in their own dirs
    for key, out, job in ((("full", 0), out0, job0), (("full", 1), out1, job1)):
        rec = records[key][1]
        assert records[key][0] == out
        assert local_slurm.job_info(job)[0].get("Restarts") not in (None, "0"), (key, local_slurm.job_info(job))
        assert rec["run"]["resumed_from_step"] and 0 < rec["run"]["resumed_from_step"] < MAX_STEPS, key
        wandb_runs = sorted(p.name for p in out.rglob("offline-run-*") if p.is_dir())
        wandb_id = (out / "wandb_id.txt").read_text().strip()
        assert rec["run"]["wandb_id"] == wandb_id and len(wandb_runs) == 2, (key, wandb_runs)
        assert all(name.endswith(wandb_id) for name in wandb_runs), wandb_runs  # one W&B run, continued

    # the USR2 job saved last.ckpt at its step boundary before submitit requeued it
    usr2_log = _job_log(local_slurm, sweep, str(job1))
    saved = STOPPED.search(usr2_log)
    assert "caught SIGUSR2" in usr2_log and saved, usr2_log[-4000:]
    assert int(saved.group(4)) == records[("full", 1)][1]["run"]["resumed_from_step"]
    assert "Requeued job" in usr2_log  # submitit did the requeueing

    # exactly one requeue owner: submitit; Lightning's SLURM environment has auto_requeue off, no USR1 handler
    owner_lines = re.findall(r"\[lra-bench\] requeue owner: .*", usr2_log)
    assert owner_lines, usr2_log[-3000:]
    for line in owner_lines:
        assert "requeue owner: submitit" in line and "SLURMEnvironment auto_requeue=False" in line, line
        assert "SIGUSR1=SIG_DFL" in line and "_slurm_sigusr_handler_fn" not in line, line
        assert "_sigterm_handler_fn" not in line, line  # Lightning's requeue-time SIGTERM bypass is not installed

    # the leaderboard, built in the sweep dir although a job failed, lists the failure
    board = (sweep / "leaderboard.md").read_text()
    assert "## Failed or unfinished runs (1)" in board and "DataSourceError" in board
    assert str(failed_out) in board
