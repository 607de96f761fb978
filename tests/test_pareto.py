"""The speed–accuracy–memory bubble chart (the LRA paper's Figure 3) and its Pareto frontier.

Fast tests use schema-complete records written here (numbers worked out by hand); the slow test draws the chart from
a real tiny sweep of run.py and checks its x values against the runs' own step times.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lra_bench.leaderboard import build_leaderboard
from lra_bench.leaderboard.pareto import Point, mark_frontier
from lra_bench.leaderboard.published import FIVE_TASKS
from lra_bench.record import results
from tests.conftest import TINY_LISTOPS, run_cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# step time (s) per method and task; full is the reference. Accuracies (fractions) per method and task.
STEP = {"full": 0.10, "nystrom": 0.05, "gpa": 0.04}
ACC = {"full": 0.50, "nystrom": 0.49, "gpa": 0.45}
PEAK = {"full": 900.0, "nystrom": 300.0, "gpa": 250.0}


def _record(
    out: Path, attn: str, task: str, seed: int, *, seq_len: int = 1024, protocol: str = "nystromformer"
) -> None:
    rec = results.empty_record()
    rec.update(status="completed", task=task, attn=attn, protocol=protocol, seed=seed, off_protocol=False)
    rec["run"].update(output_dir=str(out), finished_at="2026-01-02T00:00:00")
    rec["metrics"].update(
        test_acc=ACC[attn] + 0.002 * seed,
        val_acc=ACC[attn],
        step_time_median_s=STEP[attn] * (1.0 + 0.01 * seed),
        peak_memory_mib=PEAK[attn],
    )
    rec["data"]["seq_len"] = seq_len
    rec["env"] = {"hardware": {"cpu": "test cpu", "gpus": []}}
    results.write_atomic(out / results.FILENAME, rec)


def test_frontier_by_hand() -> None:
    pts = [Point(n, "p", s, a, 1.0) for n, s, a in (("a", 1, 60), ("b", 2, 58), ("c", 3, 55), ("d", 1.5, 57))]
    pts.append(Point("e", "p", 3, 55, 2.0))  # ties c exactly: neither is better, both stay
    mark_frontier(pts)
    # d is beaten by b on both speed (2 > 1.5) and accuracy (58 > 57)
    assert [p.method for p in pts if p.on_frontier] == ["a", "b", "c", "e"]


def test_charts_from_a_five_task_sweep(tmp_path: Path) -> None:
    for task in FIVE_TASKS:
        for attn in STEP:
            for seed in range(2):
                _record(tmp_path / f"{task}_{attn}_{seed}", attn, task, seed)
    # a run with no full-attention run of its protocol, task and length: left out of the chart, with a note
    _record(tmp_path / "odd", "gpa", "listops", 0, seq_len=512, protocol="skyformer")
    table = build_leaderboard([tmp_path], tmp_path / "board")
    charts = {(c.protocol, c.target): c for c in table["pareto"]}
    assert ("nystromformer", "avg5") in charts and ("nystromformer", "listops") in charts
    listops = {p.method: p for p in charts[("nystromformer", "listops")].points}
    # median step over seeds 0,1: s·1.005; full/method = 0.10/0.05 = 2 for nystrom, 2.5 for gpa
    assert listops["nystrom"].speed == pytest.approx(2.0) and listops["gpa"].speed == pytest.approx(2.5)
    assert listops["full"].speed == pytest.approx(1.0) and listops["full"].memory == pytest.approx(900.0)
    assert listops["nystrom"].accuracy == pytest.approx(49.1)  # mean of 49.0 and 49.2
    assert all(p.on_frontier for p in listops.values())  # each is faster or more accurate than the others
    average = {p.method: p for p in charts[("nystromformer", "avg5")].points}
    assert average["gpa"].speed == pytest.approx(2.5)  # geometric mean of five 2.5s
    assert average["gpa"].memory == pytest.approx(250.0 / 900.0)  # relative to full on every task
    assert average["nystrom"].ci is not None and average["nystrom"].ci[0] < 49.1 < average["nystrom"].ci[1]
    for chart in charts.values():
        assert chart.path is not None and chart.path.read_bytes()[:8] == PNG_MAGIC
        assert chart.path in table["plots"]
    md = table["markdown"].read_text()
    section = md.split("## Speed, accuracy and memory")[1].split("## Published reference rows")[0]
    assert "Pareto frontier: full, nystrom, gpa." in section  # listed from slowest to fastest
    assert "| gpa | 2.50× |" in section and "| full | 1.00× | 50.10 |" in section
    assert "left out of the chart, no speed ratio drawn (no on-protocol full-attention run with the same" in section


def test_no_full_attention_run_means_no_chart(tmp_path: Path) -> None:
    for attn in ("nystrom", "gpa"):
        _record(tmp_path / attn, attn, "listops", 0)
    table = build_leaderboard([tmp_path], tmp_path / "board")
    assert table["pareto"] == []
    assert "left out of the chart" in table["markdown"].read_text()


@pytest.mark.slow
def test_a_real_tiny_sweep_draws_no_speed_ratio_without_an_on_protocol_full(tmp_path: Path) -> None:
    """run.py -m attn=full,nystrom on tiny ListOps: both runs changed protocol values (steps, sizes), so there is no
    on-protocol full-attention run to be the speed reference — no chart, no ratio, and the board says why."""
    sweep = tmp_path / "sweep"
    run_cli(["-m", "attn=full,nystrom", *TINY_LISTOPS, f"hydra.sweep.dir={sweep}"],
            tmp_path)  # fmt: skip
    records = {r["attn"]: r for r in (results.read_record(p) for p in sweep.rglob(results.FILENAME))}
    assert {r["off_protocol"] for r in records.values()} == {True}
    assert not list(sweep.glob("leaderboard_pareto_*.png"))
    table = build_leaderboard([sweep], out_dir=tmp_path / "board")
    assert not table["pareto"]
    md = table["markdown"].read_text()
    assert "no on-protocol full-attention run with the same protocol, task, sequence length and device" in md
