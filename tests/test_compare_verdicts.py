"""`python -m lra_bench.compare` verdicts: Holm's p decides when several tasks are tested, and one seed is about
two trained models, never the methods. Records are written by the compare tests' helper (`write_run`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from lra_bench.stats.paired import SeedOutcome, compare_paired
from lra_bench.stats.verdict import Adjustment, significant, verdict
from tests.test_compare import compare, planted, write_run

#: per-seed accuracies of B, and A's leads: ListOps raw p ≈ 0.035 (< 0.05), Holm over 2 tasks ≈ 0.07 (> 0.05)
B_ACC = (0.400, 0.410, 0.420)
LEADS = {"listops": (0.0150, 0.0300, 0.0225), "text": (0.0100, -0.0100, 0.0000)}


def test_several_tasks_decide_on_the_holm_p(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for task, leads in LEADS.items():
        for seed, (b, lead) in enumerate(zip(B_ACC, leads)):
            write_run(tmp_path / f"a_{task}{seed}", attn="gpa", seed=seed, correct=None, acc=b + lead, task=task)
            write_run(tmp_path / f"b_{task}{seed}", attn="nystrom", seed=seed, correct=None, acc=b, task=task)
    out = tmp_path / "c.json"
    code, stdout, stderr = compare(capsys, "attn=gpa", "attn=nystrom", "--in", str(tmp_path), "--json", str(out))
    assert code == 0, stderr
    listops = next(t for t in json.loads(out.read_text())["tasks"] if t["task"] == "listops")
    raw = stats.ttest_rel(np.add(B_ACC, LEADS["listops"]), B_ACC).pvalue
    assert listops["p"] == pytest.approx(raw) and raw < 0.05
    assert listops["holm_p"] == pytest.approx(2 * raw) and listops["holm_p"] > 0.05
    assert listops["significant"] is False and listops["significance_p"] == "holm_p"
    assert listops["verdict"].startswith("no significant difference between")
    assert f"Holm-adjusted over 2 tasks p = {2 * raw:.3f}" in listops["verdict"]
    verdicts = stdout.split("## Verdicts")[1].split("## Efficiency")[0]
    task_lines = [line for line in verdicts.splitlines() if line.startswith("- ") and "average" not in line]
    assert len(task_lines) == 2 and not any(" beats " in line for line in task_lines)
    assert "1 did; 0 stay significant after Holm's correction" in verdicts
    assert "the task verdicts above decide on the Holm p" in verdicts


def test_one_seed_is_about_two_trained_models(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """6 pp on 2000 examples is a clear McNemar win — of one trained model over another, not of a method."""
    a, b = planted(np.random.default_rng(50), 0.46, 0.40)
    write_run(tmp_path / "a", attn="gpa", seed=0, correct=a)
    write_run(tmp_path / "b", attn="nystrom", seed=0, correct=b)
    out = tmp_path / "c.json"
    code, stdout, stderr = compare(capsys, str(tmp_path / "a"), str(tmp_path / "b"), "--json", str(out))
    assert code == 0, stderr
    task = json.loads(out.read_text())["tasks"][0]
    label_a, label_b = json.loads(out.read_text())["a"]["label"], json.loads(out.read_text())["b"]["label"]
    assert task["significant"] is True
    assert task["verdict"].startswith(
        f"this trained {label_a} model (seed 0) beats this trained {label_b} model (seed 0) on ListOps by "
    )
    assert f"{label_a} beats {label_b}" not in stdout
    assert "run ≥ 3 seeds per method" in task["verdict"]
    assert "**One seed** on ListOps" in stdout and "Run ≥ 3 seeds per method" in stdout


def test_verdict_takes_the_adjusted_p() -> None:
    win = compare_paired([SeedOutcome(s, 0.40 + d, 0.40) for s, d in enumerate((0.015, 0.030, 0.0225))])
    assert significant(win) and not significant(win, adjusted=Adjustment(0.07, 2))
    text = verdict("GPA", "Nyström", "ListOps", win, adjusted=Adjustment(0.07, 2))
    assert text.startswith("no significant difference between GPA and Nyström") and "Holm-adjusted over 2 tasks" in text
