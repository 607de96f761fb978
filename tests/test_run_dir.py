"""The run dir under stress, with real processes: a second `run.py` on a live run dir refuses with one line naming the
holder's PID and touches nothing; a full disk (a real size-limited tmpfs when we may mount one, a real RLIMIT_FSIZE
otherwise) ends in a `failed` record naming the error, with no temp file left and the next run unhindered; every
output is readable by the group as the umask says (shared cluster leaderboards)."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lra_bench.record import results
from tests.conftest import REPO, TINY_LISTOPS, fault, run_cli, small_tmpfs, start_run, wait_until

ARGS = [
    *[a for a in TINY_LISTOPS if not a.startswith(("trainer.max_steps",))],
    "attn=full",
    "diagnostics.enabled=false",
    "run_name=r",
]


def _run_dir(root: Path) -> Path:
    return root / "listops" / "full" / "r"


def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    """`python run.py ARGS` to the end, output captured (`kwargs`: e.g. a `preexec_fn` limiting the process)."""
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(REPO / "run.py"), *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, **kwargs)


def _files(root: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes()) for p in root.rglob("*") if p.is_file()}


# -- two processes, one run dir -----------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_second_process_on_a_live_run_dir_refuses_naming_the_holder(tmp_path: Path) -> None:
    base = [*ARGS, f"output_root={tmp_path / 'outputs'}", f"data_dir={tmp_path / 'data'}"]
    args = [*base, "trainer.max_steps=40", *fault(step_sleep_s=1.0)]  # ≥ 38 s left: time for the second start
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    out = _run_dir(tmp_path / "outputs")
    first = start_run(args, env)
    try:
        last = out / "checkpoints" / "last.ckpt"
        wait_until(last.exists, first, 300, "last.ckpt (training, after its first validation)")
        before = {k: v for k, v in _files(out).items() if not k.startswith(("checkpoints", "csv", "run.log"))}
        second = _run(args)
        assert second.returncode == 2, second.stderr[-3000:]
        lines = [line for line in second.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: run dir ") and f"in use by PID {first.pid} " in lines[0]
        after = {k: v for k, v in _files(out).items() if not k.startswith(("checkpoints", "csv", "run.log"))}
        assert after == before  # the live run's record, configs and lock were not touched
        assert results.read_record(out / results.FILENAME)["status"] == "running"
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=120)
    assert first.returncode == 143
    # the lock dies with its holder: the same command now runs (and resumes the stopped run)
    run_cli([*base, "trainer.max_steps=40"], tmp_path)
    assert results.read_record(out / results.FILENAME)["status"] == "completed"


# -- a full disk -----------------------------------------------------------------------------------------------
def _limit_file_size(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # Python ignores SIGXFSZ: writes get EFBIG

    return apply


def _stale(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.name.endswith((".tmp",)) or ".tmp" in p.name]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("full", ["tmpfs", "rlimit"])
def test_a_full_disk_fails_the_run_honestly_and_leaves_nothing_that_blocks_the_next(tmp_path: Path, full: str) -> None:
    data = tmp_path / "data"
    run_cli(
        [
            *ARGS,
            "trainer.max_steps=1",
            "trainer.val_check_interval=1",
            f"data_dir={data}",
            f"output_root={tmp_path / 'warm'}",
        ],
        tmp_path,
    )
    outputs = tmp_path / "outputs"
    args = [*ARGS, "trainer.max_steps=4", f"data_dir={data}", f"output_root={outputs}"]
    with contextlib.ExitStack() as stack:
        if full == "tmpfs":  # room for the configs and the record, not for a 130 kB checkpoint: ENOSPC
            stack.enter_context(small_tmpfs(outputs, "96k"))
            proc = _run(args)
        else:  # any file past 64 kB: EFBIG (the data is cached already, the checkpoint is 130 kB)
            proc = _run(args, preexec_fn=_limit_file_size(65536))
        out = _run_dir(outputs)
        assert proc.returncode != 0, proc.stdout[-2000:]
        record = results.read_record(out / results.FILENAME)
        expected = "No space left on device" if full == "tmpfs" else "File too large"
        assert record["status"] == "failed" and expected in record["error"], record["error"]
        print(f"{full}: the record says {record['error']!r}")
        assert not _stale(outputs), _stale(outputs)  # no temp file, no half checkpoint
        for ckpt in (out / "checkpoints").glob("*.ckpt"):
            torch.load(ckpt, map_location="cpu", weights_only=True)  # whatever is there is whole
        if full == "tmpfs":
            subprocess.run(["mount", "-o", "remount,size=16m", str(outputs)], check=True)  # space freed
            run_cli(args, tmp_path)  # the same command, the same dir: nothing stale in the way
            assert results.read_record(out / results.FILENAME)["status"] == "completed"
    if full == "rlimit":
        run_cli(args, tmp_path)
        assert results.read_record(out / results.FILENAME)["status"] == "completed"


# -- group-readable outputs -------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_outputs_and_cache_have_the_umask_mode(tmp_path: Path) -> None:
    """With umask 027 every file the run writes is 0640 and every dir 0750 (results.json was 0600, the cache 0700)."""
    where = [f"data_dir={tmp_path / 'data'}", f"output_root={tmp_path / 'outputs'}"]
    # 4 steps write every kind of file a run writes (checkpoints at each validation, metrics, record, curves)
    args = [*ARGS, *where, "print_config=true", "trainer.max_steps=4"]
    proc = _run(args, preexec_fn=lambda: os.umask(0o027))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = _run_dir(tmp_path / "outputs")
    assert stat.S_IMODE((out / results.FILENAME).stat().st_mode) == 0o640
    wrong = {}
    for root in (out, tmp_path / "data"):
        for path in [root, *root.rglob("*")]:
            mode = stat.S_IMODE(path.stat().st_mode)
            want = 0o750 if path.is_dir() else 0o640
            if mode != want:
                wrong[str(path.relative_to(tmp_path))] = oct(mode)
    assert not wrong, wrong
