"""The claims section of docs/reproductions.md (`lra_bench.reproduction_claims`) on runs written by the tests:
each Δ and interval against scipy's paired t-test, Holm's adjustment by hand, the equivalence reading of
outlier-spectral's criterion at its three outcomes, and what it says before a claim can be read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from lra_bench import reproduce, reproduction_claims, reproductions
from tests.test_reproductions import _record as page_record

EXAMPLES = 2000
HARDWARE = {"cpu": "test CPU", "cpu_count": 2}


def _record(attn: str, seed: int, acc: float, step_s: float = 1.0, memory: float = 1000.0) -> dict[str, Any]:
    """test_reproductions' minimal record, with what the claims read beside it: test size, timing, memory,
    hardware, rank budget and a local window."""
    record = page_record(attn, seed, acc)
    record["metrics"] |= {
        "test_examples": EXAMPLES,
        "step_time_median_s": step_s,
        "timed_steps": 4000,
        "step_time_iqr_s": 0.05 * step_s,
        "peak_memory_mib": memory,
    }
    record["config"]["attn"] = {"window": 64} if attn == "local" else {}
    return record | {"rank_budget": 64, "env": {"hardware": HARDWARE}}


def _runs(tmp_path: Path, accuracies: dict[str, list[float]], **extra: Any) -> list[reproductions.Run]:
    root = tmp_path / "evidence"
    for attn, accs in accuracies.items():
        for seed, acc in enumerate(accs):
            folder = reproduce.evidence_dir("nystromformer", "listops", attn, seed, root)
            folder.mkdir(parents=True)
            kwargs = extra.get(attn, {})
            (folder / "results.json").write_text(json.dumps(_record(attn, seed, acc, **kwargs)))
    return reproductions.collect(root)


def _t_interval(diffs: np.ndarray) -> tuple[float, float, float]:
    """The oracle: scipy's paired t-test p and the 95% interval of the mean difference, in pp."""
    diffs = 100 * diffs
    half = stats.t.ppf(0.975, len(diffs) - 1) * diffs.std(ddof=1) / np.sqrt(len(diffs))
    return diffs.mean() - half, diffs.mean() + half, float(stats.ttest_1samp(diffs, 0.0).pvalue)


@pytest.mark.parametrize(
    ("spectral", "reading"),
    [
        ([0.372, 0.381, 0.366], "**met**: the whole interval lies above −1 pp"),
        ([0.335, 0.346, 0.324], "**missed**: the whole interval lies below −1 pp"),
        ([0.37, 0.35, 0.38], "cannot tell: the interval spans −1 pp"),
    ],
)
def test_spectral_against_full_reads_the_criterion_from_the_interval(
    tmp_path: Path, spectral: list[float], reading: str
) -> None:
    full = [0.370, 0.380, 0.365]
    runs = _runs(tmp_path, {"spectral": spectral, "full": full}, spectral={"step_s": 0.5, "memory": 900.0})
    low, high, p = _t_interval(np.array(spectral) - np.array(full))
    text = "\n".join(reproduction_claims.spectral_claim(runs))
    assert f"[{low:+.2f}, {high:+.2f}]" in text and f"p = {p:.3g}" in text, text
    assert reading in text
    assert "step time ratio 0.50×" in text and "peak memory ratio 0.90×" in text and "meets the 1.5× factor" in text


def test_a_claim_is_not_read_from_one_seed(tmp_path: Path) -> None:
    runs = _runs(tmp_path, {"spectral": [0.30], "full": [0.37, 0.38], "local": [0.2]})
    for claim in (reproduction_claims.spectral_claim, reproduction_claims.locality_claim):
        assert "Cannot be read yet" in "\n".join(claim(runs))
    assert "now `spectral` 1, `full` 2" in "\n".join(reproduction_claims.spectral_claim(runs))


def test_gpa_against_the_others_is_holm_adjusted_and_ranked(tmp_path: Path) -> None:
    accs = {
        "gpa": [0.37, 0.38, 0.372],
        "nystrom": [0.36, 0.372, 0.361],
        "linformer": [0.30, 0.31, 0.305],
        "performer": [0.20],  # one seed: named as not yet comparable
        "full": [0.38, 0.37, 0.375],  # exact attention is not an efficient one: not in GPA's comparisons
    }
    runs = _runs(tmp_path, accs)
    text = "\n".join(reproduction_claims.gpa_claim(runs))
    raw = {a: _t_interval(np.array(accs["gpa"]) - np.array(accs[a]))[2] for a in ("linformer", "nystrom")}
    order = sorted(raw, key=raw.get)
    holm = {order[0]: min(1.0, 2 * raw[order[0]])}
    holm[order[1]] = min(1.0, max(holm[order[0]], raw[order[1]]))
    for attn in ("linformer", "nystrom"):
        assert f"| gpa − {attn} |" in text and f"| {holm[attn]:.3g} |" in text, (attn, text)
    assert "gpa − full" not in text
    assert "Not yet comparable (fewer than 2 paired seeds): performer." in text
    # ranks: linformer's interval lies below the others'; gpa, nystrom and full overlap → rank 1, tied with 2
    assert "Rank: 1 of 4 attentions with ≥ 2 seeds" in text and "tied with 2 other(s)" in text


def test_local_against_full_names_its_window_and_the_share_it_reaches(tmp_path: Path) -> None:
    runs = _runs(tmp_path, {"local": [0.30, 0.32], "full": [0.40, 0.40]})
    text = "\n".join(reproduction_claims.locality_claim(runs))
    assert "Window 64: local reaches 77.5% of full attention's mean ListOps accuracy" in text


def test_pivoted_is_compared_with_nystrom_only_at_equal_rank(tmp_path: Path) -> None:
    runs = _runs(tmp_path, {"pivoted": [0.36, 0.37], "nystrom": [0.365, 0.375]})
    assert "At rank 64:" in "\n".join(reproduction_claims.pivoted_claim(runs))
    runs[0].record["rank_budget"] = 32
    assert "Not at equal rank" in "\n".join(reproduction_claims.pivoted_claim(runs))


def test_the_page_carries_the_claims_section() -> None:
    page = (reproductions.PAGE).read_text()
    assert "## The methods' claims" in page
    for heading in ("Outlier-spectral against full", "GPA against every other", "Residual-pivoted", "Locality"):
        assert f"### {heading}" in page
