"""The Hydra side of sweeps: `LeaderboardCallback`, the launcher configs, the local settings example and the
leaderboard experiments."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf, open_dict

from lra_bench.leaderboard import build_leaderboard
from lra_bench.leaderboard.sweep_callback import LeaderboardCallback
from lra_bench.record import results
from lra_bench.registry import ATTENTIONS
from tests.conftest import CONF, REPO, TINY_LISTOPS, compose


def _job_config(output_dir: Path, *overrides: str):
    cfg = compose(["attn=nystrom", "seed=3", *overrides], return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(output_dir)
    return cfg


def _failed(error: BaseException) -> JobReturn:
    ret = JobReturn()
    ret.status, ret.return_value = JobStatus.FAILED, error
    return ret


def test_on_job_end_writes_a_failed_record_when_the_job_raised_before_having_one(tmp_path: Path) -> None:
    LeaderboardCallback().on_job_end(_job_config(tmp_path), _failed(ValueError("selector=x: bad")))
    record = results.read_record(tmp_path / results.FILENAME)
    assert record["status"] == "failed" and record["error"] == "ValueError: selector=x: bad"
    assert (record["task"], record["attn"], record["seed"]) == ("listops", "nystrom", 3)
    assert not results.validate_record(record)


def test_on_job_end_marks_a_running_record_failed_and_leaves_finished_ones(tmp_path: Path) -> None:
    record = results.empty_record()
    record.update(task="listops", attn="nystrom", seed=3)
    results.write_atomic(tmp_path / results.FILENAME, record)
    callback, cfg = LeaderboardCallback(), _job_config(tmp_path)
    callback.on_job_end(cfg, _failed(RuntimeError("worker died")))
    assert results.read_record(tmp_path / results.FILENAME)["error"] == "RuntimeError: worker died"

    record.update(status="failed", error="FloatingPointError: loss is nan")  # train() recorded its own end
    results.write_atomic(tmp_path / results.FILENAME, record)
    callback.on_job_end(cfg, _failed(FloatingPointError("loss is nan")))
    assert results.read_record(tmp_path / results.FILENAME)["error"] == "FloatingPointError: loss is nan"

    ok = JobReturn()
    ok.status, ok.return_value = JobStatus.COMPLETED, 0.5
    (tmp_path / results.FILENAME).unlink()
    callback.on_job_end(cfg, ok)
    assert not (tmp_path / results.FILENAME).exists()


def _fake_sweep(sweep: Path) -> None:
    for seed, status in ((0, "completed"), (1, "completed"), (2, "failed")):
        record = results.empty_record()
        record.update(
            task="listops",
            attn="nystrom",
            protocol="nystromformer",
            seed=seed,
            status=status,
            selector="segment_means",
            error=None if status == "completed" else "DataSourceError: gone",
        )
        record["metrics"].update(val_acc=0.3 + seed / 100, test_acc=0.3)
        record["run"].update(output_dir=str(sweep / f"seed={seed}"))
        results.write_atomic(sweep / f"seed={seed}" / results.FILENAME, record)


def test_multirun_end_builds_the_leaderboard_in_the_sweep_dir(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _fake_sweep(tmp_path)
    cfg = compose([f"hydra.sweep.dir={tmp_path}"], return_hydra_config=True)
    callback = LeaderboardCallback(plots=False)
    callback.on_multirun_start(cfg)
    callback.on_multirun_end(cfg)
    assert "protocol nystromformer:" in capsys.readouterr().out  # the sweep's main table, in the terminal
    text = (tmp_path / "leaderboard.md").read_text()
    assert "## Failed or unfinished runs (1)" in text and "DataSourceError: gone" in text
    assert (tmp_path / "leaderboard.csv").exists()
    (tmp_path / "leaderboard.md").unlink()
    callback._at_exit()  # already built: the exit hook does nothing
    assert not (tmp_path / "leaderboard.md").exists()


def test_exit_hook_builds_the_leaderboard_when_the_sweep_aborted(tmp_path: Path) -> None:
    _fake_sweep(tmp_path)
    callback = LeaderboardCallback(plots=False)
    callback.on_multirun_start(compose([f"hydra.sweep.dir={tmp_path}"], return_hydra_config=True))
    callback._at_exit()  # what atexit runs when Hydra re-raised a job's failure before on_multirun_end
    assert "DataSourceError: gone" in (tmp_path / "leaderboard.md").read_text()


def test_launcher_configs_compose() -> None:
    slurm = compose(["hydra/launcher=slurm"], return_hydra_config=True).hydra.launcher
    s = OmegaConf.to_container(slurm, resolve=True)
    assert s["_target_"].endswith("SlurmLauncher")
    assert s["max_num_timeout"] > 0 and s["signal_delay_s"] >= 60
    assert s["tasks_per_node"] == 1 and s["nodes"] == 1 and s["partition"] is None
    ddp = OmegaConf.to_container(
        compose(["hydra/launcher=slurm", "trainer=ddp"], return_hydra_config=True).hydra.launcher, resolve=True
    )
    assert ddp["tasks_per_node"] == ddp["gpus_per_node"] == 4  # one srun task per device
    # the plugin's own config (a conf/hydra/launcher/joblib.yaml would shadow it with a deprecation warning)
    joblib = compose(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], return_hydra_config=True).hydra.launcher
    assert joblib._target_.endswith("JoblibLauncher") and joblib.n_jobs == 2


def test_local_settings_example_feeds_the_slurm_launcher(tmp_path: Path) -> None:
    (tmp_path / "local").mkdir()
    shutil.copy(CONF / "local" / "default.yaml.example", tmp_path / "local" / "default.yaml")
    cfg = compose(["hydra/launcher=slurm", f"hydra.searchpath=[file://{tmp_path}]"], return_hydra_config=True)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    # as given it runs on any cluster's default CPU partition: no partition, account or GPU asked for, no setup
    assert (launcher["partition"], launcher["account"], launcher["qos"], launcher["gpus_per_node"]) == (None,) * 4
    assert launcher["setup"] == [] and launcher["timeout_min"] == 240 and launcher["tasks_per_node"] == 1
    assert cfg.logger.wandb.entity == "my-team"
    gitignored = subprocess.run(["git", "check-ignore", "-q", "conf/local/default.yaml"], cwd=REPO)
    example = subprocess.run(["git", "check-ignore", "-q", "conf/local/default.yaml.example"], cwd=REPO)
    assert gitignored.returncode == 0 and example.returncode == 1


@pytest.mark.parametrize("protocol", ["nystromformer", "skyformer", "lra_original"])
def test_leaderboard_experiments_sweep_every_task_attention_and_seed(protocol: str) -> None:
    cfg = compose([f"experiment=leaderboard/{protocol}"], return_hydra_config=True)
    assert cfg.hydra.mode.name == "MULTIRUN" and cfg.protocol.name == protocol
    params = cfg.hydra.sweeper.params
    tasks = params.task.split(",")
    attns = params.attn.split(",")
    assert attns == ATTENTIONS.names()  # every registered attention (lra_bench/config/setup.py)
    assert params.seed.split(",") == ["0", "1", "2"]
    assert {"listops", "text", "retrieval", "image", "pathfinder"} <= set(tasks)
    for task in tasks:  # every job of the sweep composes (another engineer owns the recipes and attentions)
        for attn in attns:
            job = compose([f"experiment=leaderboard/{protocol}", f"task={task}", f"attn={attn}"])
            assert job.task.name == task and job.attn.name == attn and job.protocol.name == protocol


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_joblib_sweep_with_a_failing_job_still_gets_its_leaderboard(tmp_path: Path) -> None:
    """Two local jobs in parallel; `trainer=ddp_cpu` inside a local multirun is refused by train() before it writes
    a record (a launch problem the sweeper's config checks cannot see), so the callback's on_job_end writes it; the
    sweep exits non-zero and the exit hook builds the table. (An incompatible combination such as `attn=full
    selector=uniform` no longer launches at all: the sweeper skips it.)"""
    sweep = tmp_path / "sweep"
    args = [
        "-m",
        *TINY_LISTOPS,
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "attn=nystrom",
        "trainer=default,ddp_cpu",
        f"hydra.sweep.dir={sweep}",
        f"data_dir={tmp_path / 'data'}",
        "hydra.callbacks.leaderboard.plots=false",
    ]
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "run.py"), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=500
    )
    assert proc.returncode != 0, "a failed job must fail the sweep"
    assert "[lra-bench] leaderboard:" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = {r["status"]: r for r in map(results.read_record, sweep.rglob(results.FILENAME))}
    assert sorted(records) == ["completed", "failed"], records
    assert "ConfigError" in records["failed"]["error"] and "inside a Hydra multirun" in records["failed"]["error"]
    table = build_leaderboard([sweep], out_dir=tmp_path / "table", plots=False)
    assert [f["attn"] for f in table["failures"]] == ["nystrom"]
    assert "inside a Hydra multirun" in (sweep / "leaderboard.md").read_text()
