"""The CPU settings a run makes before torch starts (`lra_bench.runtime`), checked on real processes: freed memory is
reused instead of re-faulted, idle OpenMP threads sleep, and threads follow the CPUs the process may use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, TINY_LISTOPS, run_cli

#: the faithful ListOps network's training step (shortened): prints the page faults per step after warm-up
FAULTS = """
import resource, sys
if sys.argv[1] == "prepared":
    from lra_bench.runtime import prepare_process
    prepare_process()
import torch, torch.nn.functional as F
torch.set_num_threads(1)
from lra_bench.bench.step import faithful_network, protocol_config, random_batch
cfg = protocol_config("listops", "nystrom", "nystromformer", ["data.batch_size=4", "task.seq_len=1024",
                                                              "task.max_length=1000"])
model = faithful_network(cfg)
optimizer = torch.optim.AdamW(model.parameters())
batch = random_batch(cfg, 4, torch.Generator().manual_seed(0))
def step():
    optimizer.zero_grad()
    F.cross_entropy(model(batch), batch["label"]).backward()
    optimizer.step()
step(); step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
step(); step(); step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 3)
"""


def page_faults(mode: str) -> float:
    """Page faults per training step in a fresh process, with (`prepared`) or without the runtime settings (and
    with no `MALLOC_*_` variables, which would do the same from outside)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", FAULTS, mode], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_memory_is_reused_not_faulted_in_again() -> None:
    """glibc's defaults give back what a step frees and fault it in again in the next step; the settings keep it."""
    plain, prepared = page_faults("plain"), page_faults("prepared")
    assert plain > 200, plain
    assert prepared < plain / 4, (plain, prepared)  # measured here: 1,600–5,700 → 85–500 per step


def test_threads_follow_the_cpus_the_process_may_use(monkeypatch: pytest.MonkeyPatch) -> None:
    from lra_bench import runtime

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert runtime.usable_cpus() == 1
    monkeypatch.delenv("SLURM_CPUS_PER_TASK")
    assert runtime.usable_cpus() == len(os.sched_getaffinity(0))
    assert runtime.set_threads(None) == len(os.sched_getaffinity(0))
    assert runtime.set_threads(1) == 1


@pytest.mark.slow
def test_a_run_records_the_settings_it_used(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    env["SLURM_CPUS_PER_TASK"] = "1"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "run.py"),
            *TINY_LISTOPS,
            "attn=nystrom",
            "run_name=r",
            f"output_root={tmp_path / 'out'}",
            f"data_dir={tmp_path / 'data'}",
        ],
        cwd=REPO,
        env={**env, "WANDB_MODE": "disabled"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runtime = json.loads((tmp_path / "out/listops/nystrom/r/results.json").read_text())["env"]["runtime"]
    assert runtime["threads"] == 1 and runtime["usable_cpus"] == 1  # SLURM's --cpus-per-task caps the affinity
    assert runtime["omp_wait_policy"] == "PASSIVE"
    assert runtime["malloc"]["M_TRIM_THRESHOLD"] > 1 << 30

    explicit = run_cli([*TINY_LISTOPS, "attn=nystrom", "run_name=t", "threads=2"], tmp_path)
    assert explicit.returncode == 0
    record = json.loads((tmp_path / "outputs/listops/nystrom/t/results.json").read_text())
    assert record["env"]["runtime"]["threads"] == 2 and record["off_protocol"] is not None
    assert "threads" not in record["identity"]  # logistics: the same experiment at any thread count
