"""The test SLURM cluster itself: a job runs, `scontrol requeue` restarts a job, preemption signals it.

These guard the ground the submitit launcher tests stand on (DESIGN §6): if they fail, the launcher tests
would fail for reasons that have nothing to do with our code.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests import conftest_slurm

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

# The session fixture, made visible here so this file runs before tests/conftest.py imports it.
local_slurm = conftest_slurm.local_slurm


def _wait_file(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.1)


def test_cluster_starts_fast_and_runs_a_wrap_job(local_slurm, tmp_path: Path) -> None:
    assert local_slurm.startup_s is not None and local_slurm.startup_s < 60
    out = tmp_path / "hello.txt"
    job = local_slurm.submit(wrap=f"echo hello from $SLURM_JOB_ID > {out}")
    assert local_slurm.wait(job, timeout=60) == "COMPLETED"
    assert out.read_text().strip() == f"hello from {job}"


REQUEUE_SCRIPT = """#!/bin/bash
#SBATCH --job-name=requeue-me
#SBATCH --requeue
cd {workdir}
echo "start ${{SLURM_RESTART_COUNT:-0}}" >> starts.txt
if [ "${{SLURM_RESTART_COUNT:-0}}" -ge 1 ]; then echo done > done.txt; exit 0; fi
touch running.flag
sleep 300
"""


def test_scontrol_requeue_restarts_the_job(local_slurm, tmp_path: Path) -> None:
    job = local_slurm.submit(REQUEUE_SCRIPT.format(workdir=tmp_path))
    local_slurm.wait_state(job, ["RUNNING"], timeout=60)
    _wait_file(tmp_path / "running.flag")
    local_slurm.requeue(job)
    assert local_slurm.wait(job, timeout=120) == "COMPLETED"
    assert local_slurm.job_info(job)[0]["Restarts"] == "1"
    assert (tmp_path / "starts.txt").read_text().split("\n")[:2] == ["start 0", "start 1"]
    assert (tmp_path / "done.txt").exists()


PREEMPTEE_SCRIPT = """#!/bin/bash
#SBATCH --signal=B:USR2@3600
#SBATCH --cpus-per-task={cpus}
cd {workdir}
trap 'echo "usr2 ${{SLURM_RESTART_COUNT:-0}}" >> signals.txt' USR2
echo "start ${{SLURM_RESTART_COUNT:-0}}" >> starts.txt
if [ "${{SLURM_RESTART_COUNT:-0}}" -ge 1 ]; then exit 0; fi
touch running.flag
for i in $(seq 1200); do sleep 0.25; done
"""


def test_preemption_sends_the_user_signal_then_requeues(local_slurm, tmp_path: Path) -> None:
    """The submitit path: `--signal=USR2@…` arrives at preemption time, then the job is requeued."""
    cpus = local_slurm.node_cpus
    job = local_slurm.submit(PREEMPTEE_SCRIPT.format(workdir=tmp_path, cpus=cpus))
    local_slurm.wait_state(job, ["RUNNING"], timeout=60)
    _wait_file(tmp_path / "running.flag")
    urgent = local_slurm.submit(wrap="true", args=["--partition=urgent", f"--cpus-per-task={cpus}"])
    _wait_file(tmp_path / "signals.txt", timeout=60)
    assert local_slurm.wait(urgent, timeout=120) == "COMPLETED"
    assert local_slurm.wait(job, timeout=120) == "COMPLETED"
    assert local_slurm.job_info(job)[0]["Restarts"] == "1"
    assert (tmp_path / "signals.txt").read_text().split("\n")[0] == "usr2 0"
    assert (tmp_path / "starts.txt").read_text().split("\n")[:2] == ["start 0", "start 1"]
