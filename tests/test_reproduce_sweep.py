"""The whole table in one command (`python -m lra_bench.reproduce_sweep`): every task × attention × seed of a
protocol as one SLURM job array through the project's launcher (hydra-submitit-launcher), on the real single-node
cluster of tests/slurm_cluster.py, with a tiny schedule. Each job runs in `make reproduce`'s work folder, a job
SLURM requeues mid-run resumes from its own checkpoint, the evidence lands where `make reproduce` puts it, the page
is rebuilt when the sweep ends, and the same command again trains nothing."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lra_bench import reproduce, reproduce_sweep
from tests import conftest_slurm
from tests.conftest import REPO, checkpoint_step, fault, write_listops

local_slurm = conftest_slurm.local_slurm  # the session fixture, visible even if this file runs first

MAX_STEPS = 16
TRIAL = [  # a tiny schedule (off-protocol, as any trial override makes a run)
    f"trainer.max_steps={MAX_STEPS}",
    "trainer.val_check_interval=4",
    "trainer.limit_val_batches=1",
    "task.seq_len=128",
    "task.max_length=120",
    "data.batch_size=8",
    "optim.warmup_steps=4",
]


def _sweep(tmp_path: Path, data: Path, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "lra_bench.reproduce_sweep",
        "--attn",
        "nystrom",
        "gpa",
        "--seed",
        "0",
        "--data-dir",
        str(data),
        "--evidence-root",
        str(tmp_path / "evidence"),
        "--work-root",
        str(tmp_path / "work"),
        "--page",
        str(tmp_path / "docs" / "reproductions.md"),
        "--",
        *TRIAL,
        *extra,
    ]


def test_the_command_is_make_reproduce_swept() -> None:
    """The multirun is `make reproduce`'s command with the lists, its jobs in `make reproduce`'s work folders."""
    parsed = argparse.Namespace(
        protocol="nystromformer",
        task=["listops"],
        attn=["nystrom", "gpa"],
        seed=[0, 1],
        data_dir="data",
        threads=1,
        evidence_root="reproductions",
        work_root="/w",
        page="docs/reproductions.md",
        overrides=["hydra/launcher=slurm"],
    )
    cmd = reproduce_sweep.command(parsed)
    single = reproduce.command("nystromformer", "listops", "nystrom", 0, "data", 1, Path("/w"), [])
    assert cmd[:3] == [sys.executable, str(REPO / "run.py"), "-m"]
    assert "attn=nystrom,gpa" in cmd and "seed=0,1" in cmd and "task=listops" in cmd
    kept = [a for a in single[2:] if not a.startswith(("attn=", "seed=", "data_dir=", "output_root=", "run_name="))]
    assert all(a in cmd for a in kept), (kept, cmd)
    assert "hydra.sweep.dir=/w/nystromformer" in cmd and cmd[-1] == "hydra/launcher=slurm"
    job = Path("/w/nystromformer") / reproduce_sweep.SUBDIR.replace("${task.name}", "listops").replace(
        "${attn.name}", "gpa"
    ).replace("${seed}", "1")
    assert job == reproduce.run_dir("nystromformer", "listops", "gpa", 1, Path("/w"))


def _wait_for_checkpoint(run: Path, master: subprocess.Popen, timeout: float) -> str:
    """The SLURM job id of the job training in `run` once it has a checkpoint well before its last step."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run / "results.json").exists() and (run / "checkpoints" / "last.ckpt").exists():
            job = json.loads((run / "results.json").read_text())["env"].get("slurm_job_id")
            step = checkpoint_step(run / "checkpoints" / "last.ckpt")
            if job and 0 < step < MAX_STEPS - 4:
                return str(job)
            if step >= MAX_STEPS - 4:
                pytest.fail(f"{run} got too far ({step}) before it could be requeued")
        if master.poll() is not None:
            pytest.fail(f"the sweep ended (rc={master.returncode}) before {run} had a checkpoint")
        time.sleep(0.2)
    pytest.fail(f"no checkpoint in {run} within {timeout}s")


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(900)
def test_the_whole_table_as_one_slurm_job_array(local_slurm, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(local_slurm.conf))
    data = write_listops(tmp_path / "data", evaluation=32, max_length=120)
    launcher = [
        "hydra/launcher=slurm",
        "hydra.launcher.partition=debug",
        "hydra.launcher.gpus_per_node=null",
        "hydra.launcher.cpus_per_task=1",
        "hydra.launcher.mem_gb=null",
        "hydra.launcher.timeout_min=20",
        "hydra.launcher.signal_delay_s=30",
        "hydra.callbacks.leaderboard.plots=false",
    ]
    env = {**conftest_slurm.job_env(local_slurm, tmp_path), "WANDB_MODE": "disabled"}
    log_path = tmp_path / "master.log"
    gpa_run = reproduce.run_dir("nystromformer", "listops", "gpa", 0, tmp_path / "work")
    with open(log_path, "w") as log:
        cmd = _sweep(tmp_path, data, [*launcher, *fault(step_sleep_s=0.5)])
        master = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            job = _wait_for_checkpoint(gpa_run, master, timeout=300)
            local_slurm.requeue(job)  # SIGTERM now; SLURM puts the job back, it resumes from its own last.ckpt
            master.wait(timeout=600)
        finally:
            if master.poll() is None:
                master.kill()
                master.wait(timeout=30)
    master_log = log_path.read_text(errors="replace")
    assert master.returncode == 0, master_log[-3000:]

    jobs = set()
    for attn in ("nystrom", "gpa"):
        evidence = reproduce.evidence_dir("nystromformer", "listops", attn, 0, tmp_path / "evidence")
        record = json.loads((evidence / "results.json").read_text())
        assert record["status"] == "completed" and record["metrics"]["train_steps"] == MAX_STEPS, (attn, record)
        assert {p.name for p in evidence.iterdir()} == set(reproduce.EVIDENCE), attn  # approx.json included
        assert not (evidence / reproduce.IN_PROGRESS).exists()
        jobs.add(local_slurm.job_info(record["env"]["slurm_job_id"])[0]["ArrayJobId"])
    assert len(jobs) == 1, f"not one job array: {jobs}"
    resumed = json.loads((reproduce.evidence_dir("nystromformer", "listops", "gpa", 0, tmp_path / "evidence")
                          / "results.json").read_text())  # fmt: skip
    assert 0 < (resumed["run"]["resumed_from_step"] or 0) < MAX_STEPS, resumed["run"]
    page = (tmp_path / "docs" / "reproductions.md").read_text()
    assert "nystromformer/listops/gpa/seed-0 | completed" in page and "nystromformer/listops/nystrom/seed-0" in page

    # the same command again: every evidence folder is complete, nothing trains, the evidence is unchanged
    before = {p: p.read_bytes() for p in (tmp_path / "evidence").rglob("*") if p.is_file()}
    again = subprocess.run(_sweep(tmp_path, data, launcher), cwd=REPO, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert {p: p.read_bytes() for p in (tmp_path / "evidence").rglob("*") if p.is_file()} == before
