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


def _bench(labels: list[str], ns: list[int], measured_n: list[int]) -> dict[str, object]:
    """A bench.json as the page reads it: `labels` timed at `measured_n` of `ns`, the speed-up targets summarised."""
    from lra_bench.bench.report import _verdict

    rows = [{"label": lab, "n": n, "mode": "forward_backward", "status": "ok", "time_median_s": 0.01 * (1 + i),
             "peak_mem_bytes": 2**20, "m": 16}
            for i, lab in enumerate(["full", *labels]) for n in measured_n]  # fmt: skip
    speedup = {lab: (1 + i) * 1.0 for i, lab in enumerate(labels)}
    targets = [
        _verdict(f"speed-up vs full at n={n} (forward_backward)", "≥ 10×",
                 speedup if n in measured_n else dict.fromkeys(labels), lambda x: x >= 10, "{:.1f}×")
        for n in ns
    ]  # fmt: skip
    return {"rows": rows, "summary": {"targets": targets, "slopes": []}, "threads": 1, "device": "cpu",
            "env": {"hardware": {"cpu": "cpu", "cpu_count": 2, "memory_gib": 8}, "git_commit": "abc"},
            "output_dir": "outputs/results/bench", "command": "python -m lra_bench.bench", "plots": []}  # fmt: skip


def test_a_target_is_one_line_with_its_verdict_and_deciding_figures() -> None:
    from lra_bench.reports.standing import target_line

    bench = _bench([f"method{i}/m=16" for i in range(22)], [8192, 16384], [1024, 8192])
    missed, unmeasured = (target_line(t, [1024, 8192]) for t in bench["summary"]["targets"])  # type: ignore[index]
    assert missed == (
        "- **missed** — speed-up vs full at n=8192 (forward_backward), ≥ 10×: met by 13 of 22 (best method21/m=16 "
        "22×); missed by 9 (worst method0/m=16 1×)"
    )
    assert unmeasured == (
        "- **not measured** — speed-up vs full at n=16384 (forward_backward), ≥ 10×: none of 22 configurations "
        "measured (this run's n: 1024, 8192)"
    )


def test_the_page_stays_short_however_many_configurations_the_run_has() -> None:
    """Issue 21: a page a person reads in five minutes — ≤ 250 lines, no list of every configuration."""
    from lra_bench.reports.results_doc import PAGE_LINES, render

    labels = [f"method{i}/m={m}" for i in range(40) for m in (16, 64)]
    text = render(_bench(labels, [4096, 8192, 16384], [1024, 4096, 8192]), None, img="img")
    assert len(text.splitlines()) <= PAGE_LINES == 250
    assert max(len(line) for line in text.splitlines()) < 400
    assert "method3/m=16" not in text  # neither the best nor the worst: only in the tables beside the page


def test_a_claim_is_one_line_and_a_reduction_past_minus_100_percent_is_a_ratio() -> None:
    """k-means at 26.6× uniform's error reads as that, not as a reduction of −2564%; the line says on how many inputs
    the claim holds under the reference solve, and under the others in brackets."""
    from lra_bench.reports.claims import claim_lines

    by_stable = [
        {"source": "trained", "mean_reduction": 0.45, "reached_m": [8]},
        {"source": "planted_rank", "mean_reduction": -25.64, "reached_m": []},
        {"source": "clusters"},
    ]
    by_training = [{"source": "trained", "reached_m": [8]}, {"source": "clusters", "reached_m": [16]}]
    verdict = {"claim": "gpa_kmeans", "solve": "stable", "verdict": "…",
               "per_solve": {"stable": {"by_source": by_stable}, "training": {"by_source": by_training}}}  # fmt: skip
    (line,) = claim_lines([verdict])
    assert line.endswith(
        "**partly met** — stable solve: reached on 1/2 inputs (trained); mean error reduction against uniform: "
        "trained +45%, planted_rank none (k-means 26.6× uniform's error); 1 not measurable (uniform worse than "
        "Â = 0) (reached with the other solves: training: 2/2)"
    )
    assert "\n" not in line


def test_a_run_made_elsewhere_is_named_by_the_folder_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bench run made in another checkout records that checkout's absolute path; the page and the JSON beside it
    name the folder they were rendered from, relative to the repository (no path of the machine that made it)."""
    import argparse
    import json

    from lra_bench.reports import results_doc

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(results_doc, "refresh", lambda kind, data: data)  # the summaries are not what is tested
    run = tmp_path / "outputs" / "results" / "bench"
    run.mkdir(parents=True)
    made = {**_bench(["gpa/m=16"], [1024], [1024]), "output_dir": "/another/checkout/outputs/results/bench"}
    (run / "bench.json").write_text(json.dumps(made))
    loaded = results_doc.load_runs(argparse.Namespace(bench=run, approx=None), tmp_path / "img")
    results_doc.write_tables(loaded["bench"], None, tmp_path / "docs" / "results")
    assert "- benchmark: `outputs/results/bench`" in "\n".join(results_doc.inputs_section(loaded["bench"], None))
    beside = json.loads((tmp_path / "docs" / "results" / "bench.json").read_text())
    assert beside["output_dir"] == "outputs/results/bench"
