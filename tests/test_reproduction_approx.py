"""Approximation quality beside accuracy: `approx.json` (the best-val checkpoint's own attention against exact
softmax attention on a small validation probe) is written for a completed reproduction, full attention's error is 0
by definition and a landmark attention's is not; `make reproduce` keeps its evidence when the study fails; the page
sets accuracy against output error with a Spearman ρ, its n and p-value, read honestly (too few attentions: no ρ)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from lra_bench import reproduce, reproduction_approx, reproductions
from lra_bench.registry import ATTENTIONS
from tests.conftest import TINY_LISTOPS, run_cli
from tests.test_reproductions import _record

KEYS = {
    "schema_version",
    "own_output_error",
    "what",
    "task",
    "attn",
    "checkpoint",
    "probe",
    "rank_tol",
    "output_error",
    "matrix_error",
    "by_definition",
    "rounding",
    "rank",
    "evaluations",
    "layers",
    "command",
    "code",
    "machine",
    "python",
    "threads",
    "created_at",
    "seconds",
}


def _tiny_run(tmp: Path, attn: list[str]) -> Path:
    """A real `run.py` of TINY_LISTOPS where `make reproduce` would put it (work/<protocol>/listops/<attn>/seed-0)."""
    run_cli(
        [
            *TINY_LISTOPS,
            *attn,
            f"output_root={tmp / 'work' / 'nystromformer'}",
            "run_name=seed-0",
            f"data_dir={tmp / 'data'}",
            "threads=1",
        ],
        tmp,
        timeout=300,
    )
    return reproduce.run_dir("nystromformer", "listops", attn[0].split("=")[1], 0, tmp / "work")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_approx_json_of_a_real_checkpoint_full_is_exact_and_nystrom_is_not(tmp_path: Path) -> None:
    """Two tiny real runs: the study of full attention's best-val checkpoint reports error 0 by definition (and the
    rounding it measured is tiny); `--approx-only` of a Nyström run (8 landmarks) writes a small approx.json with
    every key into the evidence folder, its error > 0, its rank within the budget."""
    full = _tiny_run(tmp_path, ["attn=full"])
    out = reproduction_approx.write(full, tmp_path / "full.json", sequences=4, max_len=64)
    data = json.loads(out.read_text())
    assert set(data) == KEYS
    assert data["attn"] == "full" and data["output_error"] == {"mean": 0.0, "median": 0.0}
    assert data["matrix_error"]["mean"] == 0.0 and "by definition" in data["by_definition"]
    assert 0.0 <= data["rounding"]["output_error_max"] < 1e-5
    assert data["probe"]["sequences"] == 4 and data["probe"]["max_len"] == 64
    assert data["checkpoint"]["file"].startswith("best") and data["checkpoint"]["step"] > 0
    assert data["evaluations"] == 4 * 2 * 2  # sequences × layers × heads of the tiny model
    assert [layer["layer"] for layer in data["layers"]] == [0, 1]
    assert all(h["output_error_mean"] == 0.0 for layer in data["layers"] for h in layer["heads"])
    assert data["rank"]["budget_nominal"] is None  # full rank: no budget

    nystrom = _tiny_run(tmp_path, ["attn=nystrom", "attn.num_landmarks=8"])
    evidence = reproduce.evidence_dir("nystromformer", "listops", "nystrom", 0, tmp_path / "evidence")
    evidence.mkdir(parents=True)
    (evidence / "results.json").write_text((nystrom / "results.json").read_text())  # a completed run's evidence
    where = ["--attn", "nystrom", "--evidence-root", str(tmp_path / "evidence"), "--work-root", str(tmp_path / "work")]
    assert reproduce.main(["--approx-only", *where]) == 0
    path = evidence / reproduction_approx.APPROX_FILE
    data = json.loads(path.read_text())
    assert set(data) == KEYS and path.stat().st_size < 16_000
    assert data["attn"] == "nystrom" and data["by_definition"] is None
    assert data["own_output_error"] is None  # an estimate of softmax attention: no other operator to score it on
    assert data["output_error"]["mean"] > 0 and data["matrix_error"]["mean"] > 0
    assert all(h["output_error_mean"] > 0 for layer in data["layers"] for h in layer["heads"])
    assert 1 <= data["rank"]["a_hat_numerical_median"] <= data["rank"]["budget_nominal"] == 8
    assert data["probe"]["sequences"] == reproduction_approx.PROBE_SEQUENCES
    assert data["command"] == (
        "python -m lra_bench.reproduce --approx-only --task listops --attn nystrom --seed 0 --protocol nystromformer"
    )
    assert data["machine"]["cpu"] and data["threads"] == 1
    assert reproductions.read_approx(evidence) == data


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_failed_study_leaves_no_file_and_is_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`make reproduce`'s study on a run without a checkpoint fails as a child process: False, one line saying so,
    no file — the caller keeps the evidence without it; `--approx-only` refuses a run that has not completed."""
    run = tmp_path / "work" / "nystromformer" / "listops" / "gpa" / "seed-0"
    run.mkdir(parents=True)
    args = argparse.Namespace(task="listops", attn="gpa", seed=0, protocol="nystromformer", threads=1)
    out = run / reproduction_approx.APPROX_FILE
    assert reproduce.approx_study(run, out, args) is False
    assert not out.exists() and "the approximation study failed" in capsys.readouterr().out
    where = ["--attn", "gpa", "--evidence-root", str(tmp_path / "evidence"), "--work-root", str(tmp_path / "work")]
    assert reproduce.main(["--approx-only", *where]) == 1


def test_the_best_checkpoint_is_the_best_val_one(tmp_path: Path) -> None:
    """Without last.ckpt to name it, the highest-step best-*.ckpt; with none, a FileNotFoundError."""
    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    with pytest.raises(FileNotFoundError):
        reproduction_approx.best_checkpoint(tmp_path)
    for name in ("best-50.ckpt", "best-400.ckpt", "best-1200.ckpt"):
        (ckpts / name).write_bytes(b"")
    assert reproduction_approx.best_checkpoint(tmp_path).name == "best-1200.ckpt"


def _diag(values: list[float]) -> dict[str, Any]:
    """A diagnostics measurement of one layer and head over len(values) sequences."""
    rows = [
        {"output_residual": v, "matrix_residual": 2 * v, "rank_a_hat": 6, "rank_budget": 8, "rank_a": 30}
        for v in values
    ]
    return {"layers": [{"layer": 0, "heads": [{"head": 0, "sequences": rows}]}], "probe": {}}


def test_the_summary_means_and_full_attention_is_zero_by_definition() -> None:
    measured = {"diag": _diag([0.1, 0.2, 0.6]), "attn": "nystrom"}
    out = reproduction_approx.summarise(measured)
    assert out["output_error"]["mean"] == pytest.approx(0.3) and out["output_error"]["median"] == pytest.approx(0.2)
    assert out["matrix_error"]["mean"] == pytest.approx(0.6) and out["rounding"] is None
    assert out["rank"]["a_hat_numerical_median"] == 6 and out["rank"]["budget_effective_median"] == 8
    exact = reproduction_approx.summarise({"diag": _diag([1e-8, 2e-8]), "attn": "full"})
    assert exact["output_error"] == {"mean": 0.0, "median": 0.0} and "by definition" in exact["by_definition"]
    assert exact["rounding"] == {"output_error_max": 2e-8}
    assert exact["layers"][0]["heads"][0]["output_error_mean"] == 0.0


def _evidence(root: Path, attn: str, seed: int, acc: float, error: float | None, variant: str | None = None) -> None:
    """A completed run's evidence folder, with an approx.json of mean output error `error` (None: without one)."""
    base = root if variant is None else root / reproductions.VARIANTS / variant
    folder = reproduce.evidence_dir("nystromformer", "listops", attn, seed, base)
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(_record(attn, seed, acc)))
    if error is not None:
        approx = {
            "output_error": {"mean": error, "median": error},
            "rank": {"a_hat_numerical_median": 6, "budget_effective_median": None if attn == "full" else 8},
            "probe": {"sequences": 8, "max_len": 1024},
            "checkpoint": {"step": 4000},
        }
        (folder / reproduction_approx.APPROX_FILE).write_text(json.dumps(approx))


def _section(page: str) -> str:
    return page.split("## Approximation quality and accuracy", 1)[1].split("\n## ", 1)[0]


def test_the_page_sets_accuracy_against_error_with_spearman(tmp_path: Path) -> None:
    """Five runs of five attentions: accuracies (39, 40, 38, 36, 37) % and errors (0, .05, .1, .2, .3) rank as
    (4, 5, 3, 1, 2) and (1, 2, 3, 4, 5): Σd² = 36, ρ = 1 − 6·36/(5·24) = −0.8 (scipy agrees); at n = 5 its p is
    ≈ 0.10, so the page calls it indistinguishable from no link. A completed run without approx.json is named, not
    counted; a variant's run is not in the section."""
    from scipy.stats import spearmanr

    root = tmp_path / "evidence"
    runs = [("full", 0.39, 0.0), ("gpa", 0.40, 0.05), ("nystrom", 0.38, 0.1), ("linformer", 0.36, 0.2)]
    runs.append(("performer", 0.37, 0.3))
    for attn, acc, error in runs:
        _evidence(root, attn, 0, acc, error)
    _evidence(root, "gpa", 1, 0.41, None)
    _evidence(root, "gpa", 2, 0.30, 0.9, variant="old")
    oracle = spearmanr([a for _, a, _ in runs], [e for _, _, e in runs])
    assert oracle.statistic == pytest.approx(-0.8)
    section = _section(reproductions.render(root, figure=None))
    assert f"= {-0.8:+.3f} (n = 5 runs of 5 attentions, two-sided p = {oracle.pvalue:.3g})" in section
    assert "do not distinguish the link from no link" in section and "as GPA's paper asserts" not in section
    row = "| nystromformer/listops/full/seed-0 | full | 0 | 39.00 | 0 (by definition) | 6 | none (full rank) |"
    assert row in section
    row = "| nystromformer/listops/gpa/seed-0 | gpa | 0 | 40.00 | 0.0500 | 6 | 8 | 8 × ≤ 1024 tokens | 4000 |"
    assert row in section
    assert "without `approx.json`" in section and "`nystromformer/listops/gpa/seed-1`" in section
    assert "| nystromformer/listops/gpa/seed-1 |" not in section and "seed-2" not in section
    assert "`old`" in section and "no approximation study" in section


def test_an_attention_that_estimates_another_operator_is_marked_and_not_correlated(tmp_path: Path) -> None:
    """Spectral (a value mixer) and Skyformer (an unnormalised Gaussian kernel) are not estimates of softmax attention:
    their error against it is a distance between operators, so their rows carry a †, the page says what each stands
    for, and ρ is the one of the softmax attentions alone (here a perfect −1 over four; with the other two it is
    not)."""
    from scipy.stats import spearmanr

    root = tmp_path / "evidence"
    softmax = [("gpa", 0.40, 0.05), ("nystrom", 0.39, 0.1), ("linformer", 0.38, 0.2), ("performer", 0.37, 0.3)]
    others = [("spectral", 0.41, 1.6), ("skyformer", 0.42, 184.5)]
    for attn, acc, error in softmax + others:
        _evidence(root, attn, 0, acc, error)
    approx = reproduce.evidence_dir("nystromformer", "listops", "skyformer", 0, root) / reproduction_approx.APPROX_FILE
    with_own = {**json.loads(approx.read_text()), "own_output_error": {"mean": 0.12, "median": 0.1}}
    approx.write_text(json.dumps(with_own))  # its error against its own Gaussian-kernel attention
    every = spearmanr([a for _, a, _ in softmax + others], [e for _, _, e in softmax + others]).statistic
    # ranks (4, 3, 2, 1, 5, 6) against (1, …, 6): Σd² = 20, ρ = 1 − 6·20/(6·35) = 3/7 — counted, they would flip it
    assert every == pytest.approx(3 / 7), "the test's premise"
    section = _section(reproductions.render(root, figure=None))
    assert "= -1.000 (n = 4 runs of 4 attentions" in section
    assert "| spectral | 0 | 41.00 | 1.6000 † |" in section
    assert "| skyformer | 0 | 42.00 | 184.5000 † (own operator: 0.1200) |" in section
    assert "| gpa | 0 | 40.00 | 0.0500 |" in section
    note = next(line for line in section.splitlines() if line.startswith("† "))
    assert f"skyformer: {ATTENTIONS.get('skyformer').approximates}" in note and "spectral: " in note
    assert "not in the correlation" in note


def test_an_own_operator_error_is_summarised_only_where_the_attention_has_one() -> None:
    """`target_output_residual` (the diagnostics' error against `target_pair`'s operator) becomes `own_output_error`
    (mean and median over every sequence, layer and head); an attention without a target pair gets None."""
    rows = [
        {"output_residual": 150.0, "matrix_residual": 140.0, "target_output_residual": 0.1},
        {"output_residual": 170.0, "matrix_residual": 160.0, "target_output_residual": 0.3},
        {"output_residual": 160.0, "matrix_residual": 150.0, "target_output_residual": 0.5},
    ]
    layers = [{"layer": 0, "heads": [{"head": 0, "sequences": rows[:2]}, {"head": 1, "sequences": rows[2:]}]}]
    out = reproduction_approx.summarise({"diag": {"layers": layers}, "attn": "skyformer"})
    assert out["own_output_error"] == pytest.approx({"mean": 0.3, "median": 0.3})
    assert out["output_error"] == pytest.approx({"mean": 160.0, "median": 160.0})
    plain = [{k: v for k, v in r.items() if not k.startswith("target")} for r in rows]
    layers = [{"layer": 0, "heads": [{"head": 0, "sequences": plain}]}]
    assert reproduction_approx.summarise({"diag": {"layers": layers}, "attn": "nystrom"})["own_output_error"] is None


def test_the_rank_correlation_is_read_honestly() -> None:
    """Fewer than 3 attentions: no ρ, "too few to read a link"; a clear monotone link over 6 runs: ρ = −1, p < 0.05,
    as the paper asserts (an association); the opposite sign is said to be the opposite; seeds are not methods."""
    two = [("gpa", 40.0, 0.1), ("gpa", 39.0, 0.2), ("nystrom", 38.0, 0.3)]
    line = reproductions.rank_correlation(two)
    assert "n = 3 runs of 2 attentions: too few to read a link" in line and "ρ =" not in line
    assert "n = 0 runs of 0 attentions: too few to read a link" in reproductions.rank_correlation([])
    six = [(f"a{i}", 40.0 - i, 0.05 * (i + 1)) for i in range(6)]
    line = reproductions.rank_correlation(six)
    assert "= -1.000 (n = 6 runs of 6 attentions" in line and "as GPA's paper asserts" in line
    assert "not a proof" in line and "independent" not in line
    opposite = [(f"a{i}", 40.0 + i, 0.05 * (i + 1)) for i in range(6)]
    assert "the opposite of what GPA's paper asserts" in reproductions.rank_correlation(opposite)
    seeds = [("gpa", 40.0, 0.1), ("gpa", 41.0, 0.11), ("nystrom", 38.0, 0.3), ("linformer", 37.0, 0.4)]
    assert "not 4 independent methods" in reproductions.rank_correlation(seeds)
    flat = [("a", 40.0, 0.1), ("b", 39.0, 0.1), ("c", 38.0, 0.1)]
    assert "undefined" in reproductions.rank_correlation(flat)


def test_the_section_with_no_run(tmp_path: Path) -> None:
    """No run at all: the section renders, says there is nothing to set against, and computes no ρ."""
    section = _section(reproductions.render(tmp_path / "evidence", figure=None))
    assert "No completed run of the protocol's current network has an `approx.json` yet" in section
    assert "n = 0 runs of 0 attentions: too few to read a link" in section and "| run |" not in section
