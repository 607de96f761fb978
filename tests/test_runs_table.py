"""One table of runs and one statistic per quantity: the leaderboard and compare show the same number for the same
runs (they once disagreed on peak memory over seeds: a median in compare, a maximum in the leaderboard's plot).

The seeds' numbers are skewed on purpose (one slow, memory-hungry seed), so a mean, a maximum and a median all
differ; `statistics` is the oracle.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from lra_bench.compare.pairing import efficiency
from lra_bench.leaderboard.aggregate import group_rows, load_records
from lra_bench.record import results
from lra_bench.record.table import OVER_SEEDS, over_seeds, runs_table

STEP_S = (0.010, 0.020, 0.090)
PEAK_MIB = (100.0, 200.0, 900.0)
TEST_ACC = (0.30, 0.40, 0.80)


def _records(root: Path) -> list[dict[str, Any]]:
    for seed, (step, peak, acc) in enumerate(zip(STEP_S, PEAK_MIB, TEST_ACC)):
        rec = results.empty_record()
        rec.update(status="completed", task="listops", attn="nystrom", selector="segment_means", seed=seed)
        rec.update(protocol="nystromformer", rank_budget=64)
        rec["run"].update(name=f"s{seed}", output_dir=str(root / f"s{seed}"), finished_at=f"2026-01-0{seed + 1}")
        rec["metrics"].update(
            test_acc=acc, val_acc=acc, step_time_median_s=step, tokens_per_s=1.0 / step, peak_memory_mib=peak,
            params=1000 + seed,
        )  # fmt: skip
        rec["env"] = {"hardware": {"cpu": "test cpu", "gpus": []}}
        results.write_atomic(root / f"s{seed}" / results.FILENAME, rec)
    records, problems = load_records(sorted(root.glob(f"*/{results.FILENAME}")))
    assert not problems and len(records) == 3
    return records


def test_each_quantity_takes_its_one_statistic_over_seeds(tmp_path: Path) -> None:
    table = runs_table(_records(tmp_path))
    assert list(table["test"]) == pytest.approx([100 * a for a in TEST_ACC])  # percent, once, here
    summary = over_seeds(table)
    assert set(summary) == set(OVER_SEEDS)
    assert summary["test"] == pytest.approx(statistics.fmean(100 * a for a in TEST_ACC))
    assert summary["step_time_median_s"] == pytest.approx(statistics.median(STEP_S))
    assert summary["tokens_per_s"] == pytest.approx(statistics.median(1.0 / s for s in STEP_S))
    assert summary["peak_memory_mib"] == pytest.approx(statistics.median(PEAK_MIB))
    assert summary["params"] == 1002


def test_a_quantity_no_run_measured_is_none_not_zero(tmp_path: Path) -> None:
    records = _records(tmp_path)
    for rec in records:
        rec["metrics"]["peak_memory_mib"] = None
    records[0]["metrics"]["step_time_median_s"] = None  # one unknown seed is left out, not counted as 0
    summary = over_seeds(runs_table(records))
    assert summary["peak_memory_mib"] is None
    assert summary["step_time_median_s"] == pytest.approx(statistics.median(STEP_S[1:]))


def test_the_leaderboard_and_compare_show_the_same_numbers_for_the_same_runs(tmp_path: Path) -> None:
    records = _records(tmp_path)
    (row,), _ = group_rows(records)
    side = efficiency(records, records)
    assert row["peak_memory_mib"] == pytest.approx(statistics.median(PEAK_MIB))
    assert side.peak_memory_a_mib == pytest.approx(row["peak_memory_mib"])
    assert row["step_time_median_ms"] == pytest.approx(1000 * statistics.median(STEP_S))
    assert side.step_time_a_s == pytest.approx(row["step_time_median_ms"] / 1000)
