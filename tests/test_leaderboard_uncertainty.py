"""The leaderboard's uncertainty columns against numbers computed here by hand (numpy + scipy's t quantiles)."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from scipy import stats

from lra_bench.leaderboard import build_leaderboard
from lra_bench.leaderboard.published import FIVE_TASKS
from lra_bench.record import results

# Three methods × five tasks × three seeds. "best" and "close" overlap everywhere; "far" sits well below both.
OFFSET = {"best": 0.60, "close": 0.595, "far": 0.40}
SPREAD = {"listops": 0.01, "text": 0.02, "retrieval": 0.005, "image": 0.01, "pathfinder": 0.03}
NOISE = (-1.0, 0.2, 0.8)


def _acc(attn: str, task: str, seed: int) -> float:
    return OFFSET[attn] + SPREAD[task] * NOISE[seed]


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("unc")
    for attn in OFFSET:
        for task in FIVE_TASKS:
            for seed in range(3):
                rec = results.empty_record()
                rec.update(status="completed", task=task, attn=attn, protocol="nystromformer", seed=seed)
                rec.update(off_protocol=False, deviations={})  # on-protocol: only these are ranked
                rec["metrics"].update(test_acc=_acc(attn, task, seed), val_acc=0.5)
                rec["run"].update(output_dir=str(root / f"{attn}_{task}_{seed}"), finished_at="2026-01-02T00:00:00")
                results.write_atomic(root / f"{attn}_{task}_{seed}" / results.FILENAME, rec)
    rec = results.empty_record()  # one seed only: no interval, no rank
    rec.update(status="completed", task="listops", attn="solo", protocol="nystromformer", seed=0, off_protocol=False)
    rec["metrics"].update(test_acc=0.9)
    results.write_atomic(root / "solo" / results.FILENAME, rec)
    return build_leaderboard([root], root / "board", plots=False)


def _by_hand(values: list[float]) -> tuple[float, float, float]:
    x = 100 * np.array(values)
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


def test_group_rows_carry_the_t_interval_of_their_seeds(board: dict) -> None:
    for row in board["rows"]:
        if row["attn"] == "solo":
            assert row["test_acc_ci_low"] is None and row["rank"] is None
            continue
        mean, lo, hi = _by_hand([_acc(row["attn"], row["task"], s) for s in range(3)])
        assert (row["test_acc_mean"], row["test_acc_ci_low"], row["test_acc_ci_high"]) == pytest.approx((mean, lo, hi))
    with open(board["csv"], newline="") as fh:
        header = next(csv.reader(fh))
    assert {"test_acc_ci_low", "test_acc_ci_high", "rank"} <= set(header)


def test_ranks_tie_overlapping_methods_and_separate_the_rest(board: dict) -> None:
    ranks = {(r["attn"], r["task"]): r["rank"] for r in board["rows"]}
    for task in FIVE_TASKS:
        assert ranks[("best", task)] == ranks[("close", task)] == 1  # overlapping intervals: a tie
        assert ranks[("far", task)] == 3  # two intervals lie wholly above
    wide = {r["attn"]: r for r in board["wide"]}
    assert wide["best"]["rank_avg5"] == wide["close"]["rank_avg5"] == 1 and wide["far"]["rank_avg5"] == 3


def test_average_intervals_combine_the_tasks_spreads(board: dict) -> None:
    """Avg-5: mean of task means ± t(df)·√(Σ sd²/n)/5, df by Welch–Satterthwaite. Avg-6 adds a constant 50."""
    row = next(r for r in board["wide"] if r["attn"] == "best")
    per_task = {t: 100 * np.array([_acc("best", t, s) for s in range(3)]) for t in FIVE_TASKS}
    v = np.array([x.var(ddof=1) / 3 for x in per_task.values()])
    df = v.sum() ** 2 / np.sum(v**2 / 2)
    avg5 = np.mean([x.mean() for x in per_task.values()])
    half5 = stats.t.ppf(0.975, df) * math.sqrt(v.sum()) / 5
    assert (row["avg5"], row["avg5_ci_low"], row["avg5_ci_high"]) == pytest.approx((avg5, avg5 - half5, avg5 + half5))
    avg6 = (5 * avg5 + 50) / 6
    half6 = stats.t.ppf(0.975, df) * math.sqrt(v.sum()) / 6
    assert (row["avg6"], row["avg6_ci_low"], row["avg6_ci_high"]) == pytest.approx((avg6, avg6 - half6, avg6 + half6))
    md = board["markdown"].read_text()
    section = md.split("## Ranking with uncertainty (ours)")[1].split("## Published reference rows")[0]
    assert f"{avg5:.2f} [{avg5 - half5:.2f}, {avg5 + half5:.2f}] #1" in section
    assert "90.00 (n=1)" in section  # the one-seed method: no interval, no rank
