"""docs/results.md names its inputs as a reader can use them: run dirs below the repository relative to it (no path
of the machine that rendered it), anything else as given."""

from __future__ import annotations

from pathlib import Path

import pytest

from lra_bench.reports.results_doc import shown_path


def test_inputs_below_the_working_dir_are_named_relative_to_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert shown_path(str(tmp_path / "outputs" / "results" / "bench")) == "outputs/results/bench"
    assert shown_path("/elsewhere/results/bench") == "/elsewhere/results/bench"


def test_the_full_tables_go_beside_the_page_as_csv_and_json(tmp_path: Path) -> None:
    import csv
    import json

    from lra_bench.reports.results_doc import write_tables

    bench = {"rows": [{"label": "gpa/m=16", "n": 1024, "time": {"median_s": 0.5}}, {"label": "full", "n": 1024}]}
    written = write_tables(bench, None, tmp_path / "results")
    assert written == ["bench_rows.csv", "bench.json"]
    with open(tmp_path / "results" / "bench_rows.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["label"] for r in rows] == ["gpa/m=16", "full"] and rows[0]["time.median_s"] == "0.5"
    assert json.loads((tmp_path / "results" / "bench.json").read_text()) == bench
