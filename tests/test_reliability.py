"""Reliability: NaN/Inf stops the run and keeps the last good checkpoint; an unwritable output dir fails before
training; a corrupt last.ckpt falls back to the previous valid checkpoint; checkpoints are weights-only; no secret
reaches the run dir."""

from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lra_bench.errors import ConfigError
from lra_bench.record import checkpoint_file, results
from lra_bench.run import checkpoints
from tests.conftest import REPO, TINY_LISTOPS, compose, fault, run_cli

SMALL = [
    *[a for a in TINY_LISTOPS if not a.startswith(("trainer.max_steps", "trainer.val_check_interval"))],
    "attn=nystrom",
    "trainer.max_steps=6",
    "trainer.val_check_interval=3",
    "callbacks.checkpoint_every_n_steps=2",
    "diagnostics.enabled=false",
]


def _train(tmp_path: Path, *overrides: str, out: Path | None = None) -> dict:
    from lra_bench.run.entry import run_stage

    cfg = compose([*SMALL, f"data_dir={tmp_path / 'data'}", *overrides])
    return run_stage(cfg, out or tmp_path / "run")


def _finite(path: Path) -> bool:
    sd = checkpoint_file.load_checkpoint(path)["state_dict"]
    tensors = [v for v in sd.values() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    return all(bool(torch.isfinite(v).all()) for v in tensors)


@pytest.mark.parametrize(
    ("knob", "message"),
    [("nan_loss_at_step", "loss is nan at step 4"), ("nan_grad_at_step", "parameters became non-finite")],
)
def test_non_finite_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path: Path, knob: str, message: str) -> None:
    with pytest.raises(FloatingPointError, match=message):
        _train(tmp_path, *fault(**{knob: 5}))
    record = results.read_record(tmp_path / "run" / results.FILENAME)
    assert record["status"] == "failed" and "FloatingPointError" in record["error"] and message in record["error"]
    ckpts = sorted((tmp_path / "run" / "checkpoints").glob("*.ckpt"))
    assert ckpts, "no checkpoint at all"
    assert checkpoint_file.load_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")["global_step"] == 4
    for path in ckpts:  # nothing of the poisoned state was written, anywhere
        assert _finite(path), f"{path.name} holds non-finite weights"
        assert checkpoint_file.load_checkpoint(path)["global_step"] <= 4


def test_unwritable_output_dir_fails_before_training(tmp_path: Path) -> None:
    target = Path("/proc/lra-bench-unwritable/run")  # not creatable, even as root
    with pytest.raises(ConfigError, match="not writable"):
        _train(tmp_path, out=target)
    assert not (tmp_path / "data").exists(), "training (data preparation) started before the check"
    # the CLI fails too (Hydra itself cannot create the run dir), without a traceback-free success
    proc = subprocess.run(
        [sys.executable, str(REPO / "run.py"), "output_root=/proc/lra-bench-unwritable", *SMALL],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode != 0 and "lra-bench-unwritable" in proc.stderr


def test_corrupt_last_ckpt_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    first = _train(tmp_path)
    ckpt_dir = tmp_path / "run" / "checkpoints"
    assert checkpoint_file.load_checkpoint(ckpt_dir / "last.ckpt")["global_step"] == 6
    prev_step = checkpoint_file.load_checkpoint(ckpt_dir / "last-prev.ckpt")["global_step"]
    assert prev_step == 4
    last = ckpt_dir / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # a write cut short, by a kill, which also
    record = results.read_record(tmp_path / "run" / results.FILENAME)  # leaves the record at "running" (a
    record["status"] = "running"  # completed one is left as it is: tests/test_record_e2e.py)
    results.write_atomic(tmp_path / "run" / results.FILENAME, record)
    with pytest.warns(UserWarning, match=r"last\.ckpt is corrupt or unreadable .*resuming from .*last-prev\.ckpt"):
        again = _train(tmp_path)
    assert again["status"] == "completed"
    assert again["run"]["resumed_from_step"] == prev_step
    assert again["metrics"]["train_steps"] == first["metrics"]["train_steps"] == 6
    assert checkpoint_file.checkpoint_problem(last) is None  # rewritten whole


def test_find_resumable_order_and_rejections(tmp_path: Path) -> None:
    good = {"state_dict": {"w": torch.zeros(2)}, "global_step": 3, "loops": {}, "optimizer_states": []}
    torch.save(good, tmp_path / "best-3.ckpt")
    torch.save({**good, "global_step": 1}, tmp_path / "best-1.ckpt")
    (tmp_path / "last.ckpt").write_bytes(b"PK\x03\x04 truncated")
    with open(tmp_path / "last-prev.ckpt", "wb") as fh:  # loadable by pickle, not weights-only: rejected
        torch.save({**good, "evil": _Unsafe()}, fh)
    with pytest.warns(UserWarning) as caught:
        resume = checkpoints.find_resumable(tmp_path)
    assert resume.path == str(tmp_path / "best-3.ckpt") and resume.step == 3
    assert [Path(p).name for p, _ in resume.skipped] == ["last.ckpt", "last-prev.ckpt"]
    assert "Unpickl" in resume.skipped[1][1] or "weights_only" in resume.skipped[1][1]
    assert len(caught) == 2
    empty = checkpoints.find_resumable(tmp_path / "nothing-here")
    assert empty.path is None and not empty.skipped


class _Unsafe:
    """An arbitrary object: `torch.load(weights_only=True)` must refuse it."""


def test_every_load_is_weights_only_and_our_checkpoints_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FloatingPointError):  # stops after step 4 (last.ckpt at 4): the same experiment resumes
        _train(tmp_path, *fault(nan_loss_at_step=5))
    calls: list[object] = []
    real_load = torch.load

    def recording_load(*args, **kwargs):
        calls.append(kwargs.get("weights_only", "unset"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", recording_load)
    record = _train(tmp_path)  # resumes from step 4 (fit), then tests on the best checkpoint
    assert record["run"]["resumed_from_step"] == 4
    assert calls and all(flag is True for flag in calls), calls
    monkeypatch.undo()
    for path in (tmp_path / "run" / "checkpoints").glob("*.ckpt"):
        ckpt = torch.load(path, map_location="cpu", weights_only=True)  # would raise on arbitrary objects
        assert "hyper_parameters" not in ckpt  # no pickled config objects
    with pytest.raises(pickle.UnpicklingError):  # and the loader really is strict
        bad = tmp_path / "bad.ckpt"
        torch.save({"x": _Unsafe()}, bad)
        checkpoint_file.load_checkpoint(bad)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_no_secret_reaches_configs_logs_or_results(tmp_path: Path) -> None:
    secret = "0123456789abcdef0123456789abcdef01234567"  # the shape of a W&B key, fake
    wandb_env = {"WANDB_API_KEY": secret, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wandb-dir")}
    # 3 steps: the validation at step 3 gives the best-val checkpoint a completed run needs
    args = [a for a in SMALL if a != "logger=csv"] + ["logger=default", "trainer.max_steps=3"]
    proc = run_cli(args, tmp_path, timeout=500, check=False, env=wandb_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = list((tmp_path / "outputs").rglob(results.FILENAME))
    assert len(runs) == 1
    out = runs[0].parent
    assert (out / "wandb_id.txt").exists() and list(out.rglob("offline-run-*")), "W&B offline run not written"
    assert secret not in proc.stdout + proc.stderr
    leaked = [str(p) for p in tmp_path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert not leaked, f"the API key was written to {leaked}"
    record = results.read_record(runs[0])
    assert record["status"] == "completed" and not math.isnan(record["metrics"]["train_steps"])
