"""`scontrol requeue` of a real SLURM job with the default logger (CSV + W&B offline): the job saves `last.ckpt` at
the signal's step, SLURM requeues it, and the new attempt resumes from exactly that step and continues the same W&B
run with continuous steps.

Why this needs a real cluster: `scontrol requeue` sends SIGTERM to every process of the job — W&B's service
(`wandb-core`) too, which dies before the training process reaches its step boundary. A W&B call after that raised
and the job resumed from the last validation instead of the signal's step. The job is submitted through
`hydra/launcher=slurm` with no GPU override, on the cluster's default CPU-only partition (issue 13: the launcher
must not ask for a GPU unless the trainer uses one).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from lra_bench.record import results
from lra_bench.run.build import build_datamodule
from tests import conftest_slurm
from tests.conftest import REPO, STOPPED, TINY_LISTOPS, checkpoint_step, compose, fault, start_run
from tests.wandb_log import history_steps, run_ids

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

local_slurm = conftest_slurm.local_slurm  # the session fixture, visible even if this file runs first

MAX_STEPS = 30
VAL_EVERY = 10
TINY = [a for a in TINY_LISTOPS if not a.startswith(("trainer.max_steps", "trainer.val_check_interval", "logger="))]


def _example_local_config(tmp_path: Path) -> list[str]:
    """conf/local/default.yaml.example, as a user copies it, on the search path (unless a personal
    conf/local/default.yaml exists, which Hydra would pick first: then the test passes the same values itself)."""
    if (REPO / "conf" / "local" / "default.yaml").exists():
        return ["++cluster.partition=null", "++cluster.account=null", "++cluster.setup=[]"]
    local = tmp_path / "searchpath" / "local"
    local.mkdir(parents=True)
    shutil.copy(REPO / "conf" / "local" / "default.yaml.example", local / "default.yaml")
    return [f"hydra.searchpath=[file://{local.parent}]"]


def _job_log(sweep: Path) -> str:
    """The submitit stdout and stderr logs of every job (a stop says its last line on stderr)."""
    return "\n".join(p.read_text(errors="replace") for p in sorted(sweep.glob(".submitit/*/*_log.*")))


@pytest.mark.timeout(900)
def test_scontrol_requeue_saves_at_the_signal_and_resumes_from_that_step(
    local_slurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(local_slurm.conf))
    data = tmp_path / "data"
    build_datamodule(compose([*TINY, f"data_dir={data}"])).ensure_source()  # generated once, before the job
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        *TINY,
        "attn=full",
        f"data_dir={data}",
        f"trainer.max_steps={MAX_STEPS}",
        f"trainer.val_check_interval={VAL_EVERY}",
        "trainer.log_every_n_steps=1",  # a W&B call in every step: the service's death cannot go unnoticed
        *fault(step_sleep_s=0.5),
        "logger=default",  # CSV + W&B offline, the default
        "hydra/launcher=slurm",  # no partition, no GPU override: the example config on a CPU-only partition
        *_example_local_config(tmp_path),
        "++cluster.cpus_per_task=1",  # sized to the 2-core test node
        "++cluster.mem_gb=1",
        *conftest_slurm.sweep_overrides(sweep),
    ]
    env = conftest_slurm.job_env(local_slurm, tmp_path)
    log_path = tmp_path / "master.log"
    with open(log_path, "w") as log:
        master = start_run(args, env, stdout=log)
        try:
            deadline = time.monotonic() + 400
            last = None
            while last is None or checkpoint_step(last) != VAL_EVERY:  # the post-validation save at step 10
                if master.poll() is not None:
                    pytest.fail(f"the sweep ended early:\n{log_path.read_text()[-3000:]}\n{_job_log(sweep)[-3000:]}")
                assert time.monotonic() < deadline, f"no last.ckpt at step {VAL_EVERY}:\n{_job_log(sweep)[-3000:]}"
                found = list(sweep.glob("*/checkpoints/last.ckpt"))
                last = found[0] if found else None
                time.sleep(0.1)
            time.sleep(2.5)  # ~5 steps past the validation: the signal lands between two saves
            out = last.parent.parent
            job_id = results.read_record(out / results.FILENAME)["env"]["slurm_job_id"]
            local_slurm.requeue(job_id)  # SIGTERM to every process of the job; SLURM requeues it
            master.wait(timeout=600)
        finally:
            if master.poll() is None:
                master.kill()
                master.wait(timeout=30)
    job_log = _job_log(sweep)
    master_log = log_path.read_text(errors="replace")
    assert master.returncode == 0, master_log[-3000:] + job_log[-3000:]
    assert local_slurm.job_info(job_id)[0].get("Restarts") == "1", local_slurm.job_info(job_id)

    saved = STOPPED.findall(job_log)
    assert saved, f"no save at the signal:\n{job_log[-4000:]}"
    signal_step = int(saved[0][3])
    command = saved[0][4].split()  # the job's own overrides into its folder, through the repository's run.py
    assert command[:2] == ["python", str(REPO / "run.py")] and command[-1] == f"hydra.run.dir={out}", command
    assert VAL_EVERY < signal_step < 2 * VAL_EVERY, signal_step  # between two validations: not a periodic save
    record = results.read_record(out / results.FILENAME)
    assert record["status"] == "completed", (record["error"], job_log[-3000:])
    assert record["run"]["resumed_from_step"] == signal_step, (record["run"], job_log[-3000:])
    assert record["metrics"]["train_steps"] == MAX_STEPS
    print(f"scontrol requeue at step {signal_step}: saved there, resumed from step {signal_step}")

    # one W&B run, two offline parts, continuous steps (`wandb sync --id <id>` uploads them in start order)
    wandb_id = (out / "wandb_id.txt").read_text().strip()
    parts = sorted(out.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(parts) == 2 and run_ids(parts) == {wandb_id}, parts
    first, second = (history_steps(p) for p in parts)
    # the first part keeps its rows up to about a second before the signal (W&B's service died with the job's
    # SIGTERM; its log is flushed every second); the second continues at the signal's step
    assert first and first[-1] >= VAL_EVERY and second and second[0] >= first[-1], (first[-3:], second[:3])
    assert second[0] == signal_step and second[-1] == MAX_STEPS, (first[-3:], second[:3], second[-3:])
    shutil.rmtree(tmp_path / "wandb-dir", ignore_errors=True)
