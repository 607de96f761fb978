"""Shared fixtures: offline environment, deterministic single-threaded torch, Hydra compose helpers."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_SILENT", "true")


@pytest.fixture(autouse=True)
def _offline_single_thread(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`make test` runs the tiers on parallel workers (pytest-xdist, `--dist loadgroup`), and a fixture wider than
    a test is made once per worker that needs it. So the tests that use the session's SLURM cluster share one
    worker (one cluster starts, as in a serial run), and so do the tests of a module that share one of its
    module-scoped fixtures (a reference run, the data probes under every BLAS kernel: minutes each, made once)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if {"local_slurm", "slurm"} & names:
            item.add_marker(pytest.mark.xdist_group("slurm"))
            continue
        definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        if any(d.scope == "module" for n in names for d in definitions.get(n, ())):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def compose(overrides: list[str] | None = None, return_hydra_config: bool = False):
    """Compose `conf/config.yaml` with overrides, exactly as run.py would (schemas + resolvers registered)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from lra_bench.config.setup import setup

    setup()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose("config", overrides=overrides or [], return_hydra_config=return_hydra_config)


# A tiny run of run.py: a few steps, short sequences, no W&B, generated data in a temp dir.
TINY_LISTOPS = [
    "task.max_length=64",
    "task.seq_len=64",
    "task.gen_num_train=64",
    "task.gen_num_val=16",
    "task.gen_num_test=16",
    "task.gen_min_length=8",
    "task.gen_max_length=64",
    "task.gen_max_depth=4",
    "data.batch_size=8",
    "model.dim=16",
    "model.ffn_dim=32",
    "model.head_dim=8",
    "model.head_hidden=16",
    "trainer.max_steps=4",
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=2",
    "optim.warmup_steps=1",
    "callbacks.progress_bar=false",
    "callbacks.stats_warmup_steps=1",
    "diagnostics.max_len=32",
    "logger=csv",
    "print_config=false",
]


def resumable_tiny_listops(max_steps: int) -> list[str]:
    """`TINY_LISTOPS` on a schedule a resume can be checked against: `max_steps` steps, a validation (and with it
    last.ckpt) every 6 steps, a periodic checkpoint every 5, deterministic kernels."""
    return [
        *[a for a in TINY_LISTOPS if not a.startswith(("trainer.max_steps", "trainer.val_check_interval"))],
        f"trainer.max_steps={max_steps}",
        "trainer.val_check_interval=6",
        "callbacks.checkpoint_every_n_steps=5",
        "trainer.deterministic=true",
        "optim.lr=1e-3",
    ]


def run_cli(
    args: list[str],
    tmp_path: Path,
    timeout: int = 600,
    check: bool = True,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    """Run `python run.py ARGS` in the repo with outputs and data under tmp_path (`env` adds variables)."""
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    cmd = [sys.executable, str(REPO / "run.py"), *args]
    if not any(a.startswith("output_root=") for a in args):
        cmd.append(f"output_root={tmp_path / 'outputs'}")
    if not any(a.startswith("data_dir=") for a in args):
        cmd.append(f"data_dir={tmp_path / 'data'}")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"run.py failed ({proc.returncode}):\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}"
        )
    return proc


def fault(**knobs: float | int) -> list[str]:
    """The overrides that add `tests.faults.FaultInjection` to a run: `fault(step_sleep_s=0.3)` (slow steps),
    `fault(nan_loss_at_step=5)`, `fault(nan_grad_at_step=5)`."""
    target = "+callbacks.fault._target_=tests.faults.FaultInjection"
    return [target, *(f"+callbacks.fault.{k}={v}" for k, v in knobs.items())]


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` (another filesystem than $TMPDIR, small enough to fill); skips the test
    where mounting needs root or is refused."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a size-limited tmpfs needs root")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode(errors='replace').strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def write_listops(data_dir: Path, train: int = 96, evaluation: int = 64, max_length: int = 200) -> Path:
    """A small ListOps under `data_dir/listops-1000/` in the official format, made by the product's generator (the
    official file names and columns); returns `data_dir`."""
    subprocess.run(
        [sys.executable, "-m", "tasks.generate.listops", "--out", str(data_dir / "listops-1000"),
         "--num-train", str(train), "--num-val", str(evaluation), "--num-test", str(evaluation),
         "--min-length", "10", "--max-length", str(max_length), "--workers", "1", "--no-progress"],
        cwd=REPO, check=True, capture_output=True,
    )  # fmt: skip
    return data_dir


#: a stopped run's last line (`StopSignals.stopped_line`): the signal, its step, the checkpoint saved, its step, and
#: the command that resumes
STOPPED = re.compile(r"\[lra-bench\] stopped by (SIG\w+) at step (\d+): saved (\S+) at step (\d+); to resume: (.+)")


def saved_step(output: str) -> int:
    """The step the checkpoint holds, as the run's last line says (the last such line in `output`)."""
    found = STOPPED.findall(output)
    assert found, output[-3000:]
    return int(found[-1][3])


def checkpoint_step(path: Path) -> int:
    """The `global_step` of a checkpoint file, -1 while it is absent or being replaced."""
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True)["global_step"])
    except Exception:  # not there yet, or being replaced right now
        return -1


def _default_sigint() -> None:
    """In the child: Ctrl-C's default, as in a terminal's foreground job (a pytest started in the background, e.g.
    `nohup pytest &`, hands SIGINT down ignored, and a run keeps an ignored SIGINT ignored, as `nohup` asks)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_run(args: list[str], env: dict[str, str], stdout: Any = subprocess.DEVNULL) -> subprocess.Popen:
    """`python run.py ARGS` as a real child process (signals, locks, timing); its stderr goes where stdout goes."""
    return subprocess.Popen(
        [sys.executable, str(REPO / "run.py"), *args],
        cwd=REPO,
        env=env,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        preexec_fn=_default_sigint,
    )


def wait_until(condition: Callable[[], bool], proc: subprocess.Popen, timeout_s: float, what: str) -> None:
    """Poll `condition` while `proc` runs: fails when the process ends first or `what` does not happen in time."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"run.py exited {proc.returncode} before {what}")
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f} s"
        time.sleep(0.02)


def kill_at_checkpoint(
    args: list[str], tmp_path: Path, ckpt: Path, step: int, log_path: Path, timeout_s: float = 300
) -> subprocess.Popen:
    """Start `python run.py ARGS` (outputs and data under tmp_path, as `run_cli`) and SIGKILL it as soon as `ckpt`
    holds a checkpoint at `step` or later; the run's output goes to `log_path`. Returns the ended process."""
    where = [f"output_root={tmp_path / 'outputs'}", f"data_dir={tmp_path / 'data'}"]
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    with open(log_path, "w") as log:
        proc = start_run([*where, *args], env, stdout=log)
        try:
            wait_until(lambda: checkpoint_step(ckpt) >= step, proc, timeout_s, f"{ckpt} at step >= {step}")
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait(timeout=60)
    return proc


def run_record(run_dir: Path) -> dict:
    """The `results.json` of a run dir."""
    import json

    return json.loads((run_dir / "results.json").read_text())


def last_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The tensors of a run dir's `checkpoints/last.ckpt` state dict."""
    sd = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    return {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}


def max_weight_difference(a: Path, b: Path) -> float:
    """The largest absolute difference between two run dirs' last.ckpt tensors (same names required)."""
    wa, wb = last_weights(a), last_weights(b)
    assert wa.keys() == wb.keys()
    return max((wa[k].double() - wb[k].double()).abs().max().item() for k in wa)


from tests.conftest_slurm import local_slurm  # noqa: E402,F401  (session fixture: a real single-node SLURM cluster)
