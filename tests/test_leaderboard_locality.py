"""The leaderboard's locality parts: per task the best local-window baseline beside the methods (window chosen on
validation, never on test; one conformance class per row), and how far each row's attention reaches.

Records are made the way a run makes them (`tests.test_leaderboard_comparable._write`: the real config tree, the one
record builder, the run's own identity); the validation accuracy and the diagnostics summary a run would measure are
filled in by hand, and the leaderboard is built by the CLI's entry function.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lra_bench.leaderboard.locality import LABEL
from lra_bench.record import results
from tests.test_leaderboard_comparable import _between, _board, _csv, _table_rows, _write


def _run(runs: Path, name: str, overrides: list[str], val: float, test: float, reach: dict | None = None) -> None:
    """One completed run with validation and test accuracy (fractions) and, optionally, its diagnostics summary."""
    folder = _write(runs, name, overrides, test)
    record = json.loads((folder / results.FILENAME).read_text())
    record["metrics"]["val_acc"] = val
    if reach is not None:
        record["diagnostics"]["best"] = {"step": 100, "summary": reach, "layers": []}
    results.write_atomic(folder / results.FILENAME, record)


def _reach(distance: float, exact: float) -> dict[str, float]:
    return {
        "attn_distance": distance,
        "attn_distance_exact": exact,
        **{f"mass_within_{w}": min(1.0, w / (2 * distance)) for w in (16, 64, 256)},
        **{f"mass_within_{w}_exact": min(1.0, w / (2 * exact)) for w in (16, 64, 256)},
    }


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """ListOps: local w=8, 32 and 128 over two seeds — w=32 best on validation, w=128 best on *test* (it must not be
    chosen) —, full (with diagnostics) and gpa; an off-protocol local w=8 (lr changed) above everything; Text: only
    local w=8, one seed."""
    root = tmp_path_factory.mktemp("locality")
    runs = root / "runs"
    for seed in (0, 1):
        s = [f"seed={seed}"]
        _run(runs, f"local8_{seed}", ["attn=local", "attn.window=8", *s], 0.30 + 0.02 * seed, 0.31 + 0.02 * seed)
        _run(runs, f"local32_{seed}", ["attn=local", "attn.window=32", *s], 0.40 + 0.02 * seed, 0.35 + 0.01 * seed)
        _run(runs, f"local128_{seed}", ["attn=local", "attn.window=128", *s], 0.39, 0.50)
        _run(runs, f"full_{seed}", ["attn=full", *s], 0.45, 0.37, _reach(40.0 + 10 * seed, 41.0 + 10 * seed))
        _run(runs, f"gpa_{seed}", ["attn=gpa", *s], 0.41, 0.36)
        _run(runs, f"off_{seed}", ["attn=local", "attn.window=8", "optim.lr=0.01", *s], 0.90, 0.90)
    _run(runs, "text_local8", ["task=text", "attn=local", "attn.window=8", "seed=0"], 0.60, 0.61)
    return _board(runs, root / "board") | {"wide_all": _csv(root / "board" / "leaderboard_wide.csv")}


def test_the_baseline_takes_the_window_best_on_validation(board: dict[str, Any]) -> None:
    (row,) = [r for r in board["wide_all"] if r["kind"] == "locality" and r["conformance"] == "on"]
    assert row["listops_window"] == "32" and float(row["listops"]) == pytest.approx(35.5)  # not w=128's 50 on test
    assert float(row["listops_std"]) == pytest.approx(0.7071, abs=1e-4)
    assert row["text_window"] == "8" and float(row["text"]) == pytest.approx(61.0)
    assert row["method"] == LABEL


def test_the_baseline_sits_beside_the_methods_of_its_protocol(board: dict[str, Any]) -> None:
    summary = _between(board["md"], "### protocol: nystromformer", "#### protocol: nystromformer — not comparable")
    rows = _table_rows(summary)
    assert rows[LABEL][2] == "35.50 ± 0.71 (n=2, w=32)" and rows[LABEL][3] == "61.00 (n=1, w=8)"
    assert {"full", "gpa / gpa (m=11)", "local (w=8)", "local (w=32)", "local (w=128)"} <= set(rows)
    assert "arXiv 2501.14850" in board["md"]


def test_an_off_protocol_window_never_enters_the_on_protocol_baseline(board: dict[str, Any]) -> None:
    (off,) = [r for r in board["wide_all"] if r["kind"] == "locality" and r["conformance"] == "off"]
    assert off["listops_window"] == "8" and float(off["listops"]) == pytest.approx(90.0)
    assert off["deviations"] == "optim.lr"
    apart = _table_rows(_between(board["md"], "#### protocol: nystromformer — not comparable", "## "))
    assert f"{LABEL} ⚠ off-protocol" in apart


def test_how_far_attention_reaches_is_a_column(board: dict[str, Any]) -> None:
    (full,) = [r for r in board["csv"] if r["attn"] == "full"]
    assert float(full["attn_distance"]) == pytest.approx(45.0) and float(full["attn_distance_exact"]) == 46.0
    assert float(full["mass_within_16"]) == pytest.approx((16 / 80 + 16 / 100) / 2)
    groups = _between(board["md"], "## All groups")
    lines = groups.splitlines()
    header = next(line for line in lines if line.startswith("| protocol")).strip("| ").split(" | ")
    full_line = next(line for line in lines if line.startswith("| nystromformer | ListOps | full |"))
    cells = dict(zip(header, full_line.strip("| ").split(" | ")))
    assert cells["attn distance (exact)"] == "45.0 (46.0)"
    assert cells["mass ≤ 16/64/256"] == f"{(16 / 80 + 16 / 100) / 2:.2f}/{(64 / 80 + 64 / 100) / 2:.2f}/1.00"
    gpa = next(r for r in board["csv"] if r["attn"] == "gpa")
    assert gpa["attn_distance"] == ""  # no diagnostics recorded: nothing invented


def test_no_local_runs_no_baseline(tmp_path: Path) -> None:
    _run(tmp_path / "runs", "full", ["attn=full", "seed=0"], 0.4, 0.4)
    got = _board(tmp_path / "runs", tmp_path / "board")
    assert LABEL not in got["md"]
    assert not [r for r in _csv(tmp_path / "board" / "leaderboard_wide.csv") if r["kind"] == "locality"]


def test_compare_names_the_window(tmp_path: Path) -> None:
    """`python -m lra_bench.compare attn=local attn=full`: the local side's label says which window it ran."""
    import subprocess
    import sys

    runs = tmp_path / "runs"
    for seed in (0, 1):
        _run(runs, f"local8_{seed}", ["attn=local", "attn.window=8", f"seed={seed}"], 0.30, 0.31 + 0.01 * seed)
        _run(runs, f"full_{seed}", ["attn=full", f"seed={seed}"], 0.40, 0.37 + 0.01 * seed)
    out = subprocess.run(
        [sys.executable, "-m", "lra_bench.compare", "attn=local", "attn=full", "--in", str(runs)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "**A** = local (w=8)" in out.stdout, out.stdout[:800]
