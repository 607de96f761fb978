"""The committed reproductions are what they claim (on-protocol, complete, their accuracy is their predictions'),
`docs/reproductions.md` is generated from them, and `make reproduce`'s snapshot/restore/evidence cycle works on
a real run (interrupted, resumed from the committed snapshot, completed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lra_bench import reproduce, reproductions
from lra_bench.stats.power import seeds_per_arm
from tests.conftest import REPO, fault, write_listops

COMMITTED = sorted(p for p in (REPO / "reproductions").glob("*/*/*/seed-*/results.json"))


@pytest.mark.parametrize("record_path", COMMITTED, ids=[str(p.parent.relative_to(REPO)) for p in COMMITTED])
def test_a_committed_reproduction_is_complete_on_protocol_and_its_predictions(record_path: Path) -> None:
    record = json.loads(record_path.read_text())
    protocol, task, attn = record_path.parts[-5:-2]
    assert (record["protocol"], record["task"], record["attn"]) == (protocol, task, attn)
    assert record["status"] == "completed"
    assert record["off_protocol"] is False and record["deviations"] == {}
    assert record["metrics"]["train_steps"] == record["config"]["trainer"]["max_steps"] == 5000
    saved = np.load(record_path.parent / "test_predictions.npz")
    assert len(saved["label"]) == record["metrics"]["test_examples"]
    assert record["metrics"]["test_acc"] == pytest.approx(float(np.mean(saved["pred"] == saved["label"])), abs=1e-9)
    assert not list(record_path.parent.rglob("*.ckpt")), "a completed reproduction keeps no checkpoints"


def test_an_in_progress_snapshot_is_on_protocol_and_resumable() -> None:
    for folder in (REPO / "reproductions").glob("*/*/*/seed-*/in-progress"):
        record = json.loads((folder / "results.json").read_text())
        assert record["off_protocol"] is False, folder
        assert (folder / "checkpoints" / "last.ckpt").exists(), folder
        assert not (folder.parent / "results.json").exists(), f"{folder.parent}: completed and in progress at once"


def test_the_page_is_generated_from_the_evidence() -> None:
    page = REPO / "docs" / "reproductions.md"
    assert page.exists(), "docs/reproductions.md is missing: python -m lra_bench.reproductions"
    assert page.read_text() == reproductions.render(), (
        "docs/reproductions.md is stale: python -m lra_bench.reproductions"
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_make_reproduce_snapshots_resumes_from_the_snapshot_and_keeps_the_evidence(tmp_path: Path) -> None:
    """A real `python -m lra_bench.reproduce` (small trial overrides): SIGTERM mid-run leaves a resumable snapshot;
    with the work dir gone (another machine), the same command restores it, resumes, completes, and leaves only the
    evidence files; the page generator reads them."""
    data = write_listops(tmp_path / "data", evaluation=32, max_length=120)
    trial = [
        "trainer.max_steps=24",
        "trainer.val_check_interval=4",
        "trainer.limit_val_batches=1",
        "task.seq_len=128",
        "task.max_length=120",
        "data.batch_size=8",
        *fault(step_sleep_s=0.3),
    ]
    args = [
        sys.executable,
        "-m",
        "lra_bench.reproduce",
        "--data-dir",
        str(data),
        "--evidence-root",
        str(tmp_path / "evidence"),
        "--work-root",
        str(tmp_path / "work"),
        "--snapshot-every-s",
        "1",
    ]
    args += [f"--override={o}" for o in trial]
    evidence = reproduce.evidence_dir("nystromformer", "listops", "nystrom", 0, tmp_path / "evidence")
    env = {**os.environ, "WANDB_MODE": "disabled"}
    first = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not (evidence / "in-progress" / "checkpoints" / "last.ckpt").exists():
        assert first.poll() is None and time.monotonic() < deadline, first.stdout.read() if first.stdout else ""
        time.sleep(0.2)
    first.send_signal(signal.SIGTERM)
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 143, out[-3000:]
    snapshot = json.loads((evidence / "in-progress" / "results.json").read_text())
    assert snapshot["status"] == "interrupted"
    stopped_at = snapshot["run"]["segments"][-1]["to_step"]
    assert 0 < stopped_at < 24

    import shutil

    shutil.rmtree(tmp_path / "work")  # the run dir is gone: only the committed snapshot is left
    second = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    assert "restored the committed snapshot" in second.stdout
    record = json.loads((evidence / "results.json").read_text())
    assert record["status"] == "completed" and record["metrics"]["train_steps"] == 24
    assert [s["from_step"] for s in record["run"]["segments"]] == [0, stopped_at]
    assert sorted(p.name for p in evidence.iterdir()) == sorted(reproduce.EVIDENCE)
    runs = reproductions.collect(tmp_path / "evidence")
    assert len(runs) == 1 and runs[0].completed and runs[0].wall_s() > 24 * 0.3
    page = reproductions.render(tmp_path / "evidence")
    assert "| nystrom | 37.15 | — | 0 / 0 | not run yet |" in page  # an off-protocol trial never stands beside it
    assert "| nystromformer/listops/nystrom/seed-0 | completed | 24/24 |" in page and "| **no** |" in page


def _completed(attn: str, seed: int, test_acc: float) -> reproductions.Run:
    record = {"status": "completed", "metrics": {"test_acc": test_acc}}
    return reproductions.Run("p", "listops", attn, seed, record, Path(f"seed-{seed}"))


def test_the_page_says_how_many_seeds_a_one_point_difference_needs() -> None:
    """From the pooled seed sd of both methods (here 1 pp in each), the t-test's sample size (G*Power: d = 1 → 17);
    with fewer than 2 seeds of either, it says the spread is not measured yet."""
    gpa = [_completed("gpa", s, a) for s, a in enumerate((0.36, 0.37, 0.38))]
    nystrom = [_completed("nystrom", s, a) for s, a in enumerate((0.365, 0.375))]
    nystrom_sd = float(np.std([36.5, 37.5], ddof=1))
    line = reproductions.seeds_needed(gpa, nystrom, "gpa", "nystrom")
    pooled = ((2 * 1.0**2 + 1 * nystrom_sd**2) / 3) ** 0.5
    assert f"pooled seed sd {pooled:.2f} pp" in line
    assert f"{seeds_per_arm(1.0, pooled)} seeds per method" in line
    line = reproductions.seeds_needed(gpa, nystrom[:1], "gpa", "nystrom")
    assert "unknown until each method has 2 completed seeds" in line and "now 3 and 1" in line
