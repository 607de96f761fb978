"""The leaderboard against hand-computed numbers, on schema-complete fake records (no training).

The fixture sweep has: a method with all five tasks over seeds 0,1,2 (Path-X absent), a method with all six
tasks on one seed plus a failed Path-X seed, a partial method, an unfinished run, three unreadable files
and one stale duplicate seed. Every expected number below is worked out by hand in the comments.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lra_bench.compare.pairing import efficiency
from lra_bench.leaderboard import build_leaderboard, log_to_wandb
from lra_bench.leaderboard.published import FIVE_TASKS, load_published
from lra_bench.record import results

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# Method A: nystrom / segment_means / m=64, seeds 0,1,2 -> per-task means 38, 62, 79, 41, 71 (std 1,2,1,1,1).
A_TEST = {
    "listops": (0.37, 0.38, 0.39),
    "text": (0.60, 0.62, 0.64),
    "retrieval": (0.78, 0.79, 0.80),
    "image": (0.40, 0.41, 0.42),
    "pathfinder": (0.70, 0.71, 0.72),
}
A_AVG5 = (38 + 62 + 79 + 41 + 71) / 5  # 58.2
A_AVG6 = (38 + 62 + 79 + 41 + 71 + 50) / 6  # 56.833…: Path-X never run, counted as 50
# Method B: full attention, one seed, six tasks (Path-X 55) -> avg5 54.0, avg6 54.1667.
B_TEST = {"listops": 0.36, "text": 0.64, "retrieval": 0.57, "image": 0.42, "pathfinder": 0.71, "pathx": 0.55}
B_AVG5 = (36 + 64 + 57 + 42 + 71) / 5
B_AVG6 = (36 + 64 + 57 + 42 + 71 + 55) / 6


def _record(
    out: Path,
    *,
    task: str,
    attn: str,
    seed: int,
    test: float | None,
    selector: str | None = None,
    landmarks: int | None = None,
    status: str = "completed",
    error: str | None = None,
    finished_at: str = "2026-01-02T00:00:00",
    step_s: float = 0.05,
    peak: float = 500.0,
) -> Path:
    rec = results.empty_record()
    rec.update(
        status=status,
        error=error,
        task=task,
        attn=attn,
        selector=selector,
        protocol="nystromformer",
        rank_budget=landmarks,
        seed=seed,
    )
    rec["run"].update(name=out.name, output_dir=str(out), started_at="2026-01-01T00:00:00", finished_at=finished_at)
    rec["metrics"].update(
        val_acc=None if test is None else test + 0.01,
        test_acc=test,
        best_step=100,
        train_steps=200,
        step_time_median_s=step_s,
        tokens_per_s=1000.0 / step_s,
        peak_memory_mib=peak,
        params=123456,
        data_share=0.1,
    )
    rec["env"] = {"hardware": {"cpu": "test cpu", "gpus": []}}
    results.write_atomic(out / results.FILENAME, rec)
    return out / results.FILENAME


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("lb")
    sweep1, sweep2 = root / "sweep1", root / "sweep2"
    i = 0
    for task, accs in A_TEST.items():
        for seed, acc in enumerate(accs):
            _record(
                sweep1 / f"{i}",
                task=task,
                attn="nystrom",
                selector="segment_means",
                landmarks=64,
                seed=seed,
                test=acc,
                step_s=0.02 + 0.01 * seed,
                peak=300.0 + seed,
            )
            i += 1
    # A stale rerun of (A, listops, seed 0) that finished earlier: superseded, must not enter the mean.
    _record(
        sweep2 / "stale",
        task="listops",
        attn="nystrom",
        selector="segment_means",
        landmarks=64,
        seed=0,
        test=0.10,
        finished_at="2025-12-31T00:00:00",
    )
    for task, acc in B_TEST.items():
        _record(sweep2 / f"full_{task}", task=task, attn="full", seed=0, test=acc, peak=2000.0)
    failed = sweep2 / "full_pathx_seed1"
    _record(
        failed,
        task="pathx",
        attn="full",
        seed=1,
        test=None,
        status="failed",
        error="OutOfMemoryError: CUDA out of memory",
    )
    running = sweep2 / "gpa_running"
    _record(running, task="listops", attn="gpa", selector="kmeans", landmarks=32, seed=2, test=None, status="running")
    for seed, acc in ((0, 0.30), (1, 0.34)):  # method C: ListOps only -> no averages
        _record(
            sweep2 / f"gpa_{seed}", task="listops", attn="gpa", selector="kmeans", landmarks=32, seed=seed, test=acc
        )
    bad = {"corrupt": "{not json", "old_schema": '{"schema_version": 0}', "missing_keys": '{"schema_version": 1}'}
    for name, text in bad.items():
        (sweep2 / name).mkdir(parents=True)
        (sweep2 / name / results.FILENAME).write_text(text)

    out = root / "board"
    proc = subprocess.run(
        [sys.executable, "-m", "lra_bench.leaderboard", str(sweep1), str(sweep2), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "MPLBACKEND": "Agg", "WANDB_MODE": "disabled"},
    )
    assert proc.returncode == 0, proc.stderr
    return {"root": root, "out": out, "failed": failed, "running": running, "stdout": proc.stdout, "bad": bad}


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _f(text: str) -> float | None:
    return float(text) if text != "" else None


def test_group_means_and_stds(sweep: dict[str, Any]) -> None:
    rows = _csv(sweep["out"] / "leaderboard.csv")
    a_listops = next(r for r in rows if r["attn"] == "nystrom" and r["task"] == "listops")
    assert (a_listops["n"], a_listops["seeds"]) == ("3", "0,1,2")  # the stale seed-0 rerun was dropped
    assert _f(a_listops["test_acc_mean"]) == pytest.approx(38.0)
    assert _f(a_listops["test_acc_std"]) == pytest.approx(1.0)  # sample std of 37, 38, 39
    assert _f(a_listops["val_acc_mean"]) == pytest.approx(39.0)
    assert _f(a_listops["step_time_median_ms"]) == pytest.approx(30.0)  # median of 20, 30, 40 ms
    # peak memory over seeds (300, 301, 302 MiB): the median, the statistic compare gives the same runs
    assert _f(a_listops["peak_memory_mib"]) == pytest.approx(301.0)
    listops_a = [r for p in (sweep["root"] / "sweep1").glob(f"*/{results.FILENAME}") if (r := results.read_record(p))
                 ["task"] == "listops"]  # fmt: skip
    assert efficiency(listops_a, listops_a).peak_memory_a_mib == pytest.approx(301.0)
    a_text = next(r for r in rows if r["attn"] == "nystrom" and r["task"] == "text")
    assert _f(a_text["test_acc_mean"]) == pytest.approx(62.0)
    assert _f(a_text["test_acc_std"]) == pytest.approx(2.0)
    b_listops = next(r for r in rows if r["attn"] == "full" and r["task"] == "listops")
    assert b_listops["n"] == "1" and b_listops["test_acc_std"] == ""  # one seed: std unknown, not 0
    assert not any(r["attn"] == "full" and r["task"] == "pathx" and r["n"] != "1" for r in rows)


def test_five_and_six_task_averages(sweep: dict[str, Any]) -> None:
    wide = {r["method"]: r for r in _csv(sweep["out"] / "leaderboard_wide.csv") if r["kind"] == "ours"}
    a = wide["nystrom / segment_means (m=64)"]
    assert _f(a["avg5"]) == pytest.approx(A_AVG5)
    assert _f(a["avg6"]) == pytest.approx(A_AVG6)
    assert a["pathx_counted_as_50"] == "True"
    b = wide["full"]
    assert _f(b["avg5"]) == pytest.approx(B_AVG5)
    assert _f(b["avg6"]) == pytest.approx(B_AVG6)
    assert b["pathx_counted_as_50"] == "False"
    c = wide["gpa / kmeans (m=32)"]
    assert c["avg5"] == "" and c["avg6"] == ""  # four tasks missing: no average, not a partial one
    md = (sweep["out"] / "leaderboard.md").read_text()
    assert "Avg-5" in md and "Avg-6 (Path-X ✗=50)" in md
    assert f"{A_AVG5:.2f}" in md and f"{A_AVG6:.2f}*" in md and f"{B_AVG6:.2f}" in md


def test_failures_and_unreadable_are_listed(sweep: dict[str, Any]) -> None:
    md = (sweep["out"] / "leaderboard.md").read_text()
    failures = md.split("## Failed or unfinished runs (2)")[1].split("## Unreadable records")[0]
    assert str(sweep["failed"]) in failures and "CUDA out of memory" in failures
    assert str(sweep["running"]) in failures and "unfinished (status=running" in failures
    unreadable = md.split("## Unreadable records (3)")[1]
    for name in sweep["bad"]:
        assert f"{name}/{results.FILENAME}" in unreadable
    assert "JSONDecodeError" in unreadable and "schema_version=0" in unreadable and "missing" in unreadable
    assert "Superseded runs" in md and "stale" in md
    assert "29 results.json: 12 groups, 2 failed or unfinished, 3 unreadable" in sweep["stdout"]


def test_published_rows_beside_ours_and_marked(sweep: dict[str, Any]) -> None:
    wide = _csv(sweep["out"] / "leaderboard_wide.csv")
    published = [r for r in wide if r["kind"] == "published"]
    sources = {r["source"] for r in published}
    assert {"Nyströmformer Table 3", "Skyformer Table 1", "LRA (JAX) README/paper table"} <= sources
    assert "xformers BENCHMARKS.md" in sources
    nystrom = next(r for r in published if r["source"] == "Nyströmformer Table 3" and r["attn"] == "nystrom")
    assert _f(nystrom["listops"]) == pytest.approx(37.15) and _f(nystrom["avg5"]) == pytest.approx(58.95)
    lra_transformer = next(r for r in published if r["source"].startswith("LRA") and r["method"] == "Transformer")
    assert _f(lra_transformer["avg6"]) == pytest.approx(53.66, abs=0.005)  # S4's 6-task number for it
    md = (sweep["out"] / "leaderboard.md").read_text()
    protocol_block = md.split("### protocol: nystromformer")[1].split("## Published reference rows")[0]
    assert "published: Nyströmformer Table 3" in protocol_block  # beside ours, same protocol
    assert "## Published reference rows (not ours)" in md


def test_plots_are_png(sweep: dict[str, Any]) -> None:
    for task in (*FIVE_TASKS, "pathx"):
        png = sweep["out"] / f"leaderboard_{task}.png"
        assert png.exists() and png.stat().st_size > 1000, png
        assert png.read_bytes()[:8] == PNG_MAGIC


def test_published_averages_match_their_papers() -> None:
    """Transcription check: the mean of each row's five columns is its paper's Avg (to rounding)."""
    _, rows = load_published()
    for row in rows:
        mean5 = sum(float(row.scores[t]) for t in FIVE_TASKS) / 5  # type: ignore[arg-type]
        if row.avg_note:  # the source's own Avg disagrees with its columns; documented, kept as published
            assert abs(mean5 - row.avg_reported) > 0.011, row
        else:
            assert mean5 == pytest.approx(row.avg_reported, abs=0.011), row


def test_api_returns_paths_and_rows_and_wandb_is_a_no_op_offline(tmp_path: Path) -> None:
    _record(tmp_path / "run0", task="listops", attn="full", seed=0, test=0.4)
    result = build_leaderboard([tmp_path], tmp_path / "board", plots=False)
    assert result["markdown"] == tmp_path / "board" / "leaderboard.md" and result["markdown"].exists()
    assert result["csv"].exists() and result["plots"] == []
    assert [r["test_acc_mean"] for r in result["rows"]] == [pytest.approx(40.0)]
    assert log_to_wandb(result) is None  # WANDB_MODE=disabled (the tests' default): nothing happens, nothing raises
