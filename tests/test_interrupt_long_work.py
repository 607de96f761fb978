"""Ctrl-C in the long work that is not training, with real signals to real process groups (a terminal's Ctrl-C
reaches every process of the foreground job): the bench keeps and renders what it measured; an interrupted ListOps
generation says so, leaves nothing partial, and the next run generates and trains cleanly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, TINY_LISTOPS, _default_sigint, run_cli
from tests.test_bench import TINY

pytestmark = pytest.mark.slow


def _interrupt_when(cmd: list[str], marker: str) -> tuple[int, str]:
    """Run `cmd` in a process group of its own, Ctrl-C the group when a line holds `marker`; (exit status, output)."""
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, preexec_fn=_default_sigint,
    )  # fmt: skip
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if marker in line:
            os.killpg(proc.pid, signal.SIGINT)
            break
    rest, _ = proc.communicate(timeout=300)
    return proc.returncode, "".join(seen) + rest


@pytest.mark.timeout(600)
def test_ctrl_c_in_the_bench_keeps_and_renders_what_finished(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    settings = [a for a in TINY if not a.startswith("seq_lens")]
    cmd = [sys.executable, "-m", "lra_bench.bench", *settings, "seq_lens=[64,128,256,512,1024,2048]", "references=[]"]
    rc, output = _interrupt_when([*cmd, f"hydra.run.dir={out}"], "[bench] n=")  # after the first configuration
    assert rc == 130, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "[bench] stopped by Ctrl-C at n=" in output
    data = json.loads((out / "bench.json").read_text())
    assert data["stopped"].startswith("Ctrl-C at n=")
    measured = [r for r in data["rows"] if r["status"] == "ok"]
    assert measured and len(data["rows"]) < 2 * 6 * 2  # the finished configurations, not the whole sweep
    assert data["matmul"]["end"] is None and data["profiles"] == []  # what did not run is not recorded
    report = (out / "bench.md").read_text()
    assert "**stopped early** by Ctrl-C at n=" in report and measured[0]["label"] in report


@pytest.mark.timeout(900)
def test_ctrl_c_in_listops_generation_says_so_and_the_next_run_starts_clean(tmp_path: Path) -> None:
    data = tmp_path / "data"
    big = [f"data_dir={data}", f"output_root={tmp_path / 'outputs'}", "attn=full", "task.gen_workers=2"]
    rc, output = _interrupt_when([sys.executable, str(REPO / "run.py"), *big], "[listops] no data under")
    assert rc == 130, output[-3000:]
    assert "[listops] generation stopped after" in output and "the next run generates them from the start" in output
    assert "Traceback" not in output, output[-3000:]
    assert not data.exists() or list(data.iterdir()) == []  # no listops-1000/, no temp dir: nothing to take for data

    proc = run_cli([*TINY_LISTOPS, "attn=full", "run_name=next"], tmp_path)
    assert "[listops] no data under" in proc.stdout  # it generated afresh into the same data dir
    record = json.loads((tmp_path / "outputs" / "listops" / "full" / "next" / "results.json").read_text())
    assert record["status"] == "completed"
