"""`python -m lra_bench.compare` when every seed shows the same difference, and when an accuracy is not a number.

A lead of exactly 10 examples out of 2000 on every seed is one fact whatever the accuracy level, but the float
(c + 10)/2000 − c/2000 is not: it is 0.0050000000000000044 for c = 600 and 0.004999999999999949 for c = 678. On
the float differences the first pair of seeds had no spread ("cannot tell") and the second a spread of 4e-17
("beats …, p = 8.8e-16"). Records are written by the compare tests' helper (`tests.test_compare.write_run`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from lra_bench.stats.paired import NO_TEST, SeedOutcome, compare_paired, correct_count, outcome_from_accuracies
from tests.test_compare import N_TEST, compare, write_run

LEAD = 10
#: correct counts of B on the two seeds: one pair whose float differences agree, one whose differences do not
LEVELS = {"equal floats": (600, 604), "unequal floats": (600, 678)}


def _first(count: int) -> np.ndarray:
    return np.arange(N_TEST) < count


def _write_level(tmp: Path, counts: tuple[int, int], with_predictions: bool) -> None:
    for seed, c in enumerate(counts):
        if with_predictions:
            write_run(tmp / f"a{seed}", attn="gpa", seed=seed, correct=_first(c + LEAD))
            write_run(tmp / f"b{seed}", attn="nystrom", seed=seed, correct=_first(c))
        else:
            extra = {"test_examples": N_TEST}
            write_run(tmp / f"a{seed}", attn="gpa", seed=seed, correct=None, acc=(c + LEAD) / N_TEST, metrics=extra)
            write_run(tmp / f"b{seed}", attn="nystrom", seed=seed, correct=None, acc=c / N_TEST, metrics=extra)


@pytest.mark.parametrize("with_predictions", [True, False], ids=["predictions", "records"])
def test_the_same_lead_on_every_seed_gives_one_verdict_at_every_level(
    tmp_path: Path, capsys: pytest.CaptureFixture, with_predictions: bool
) -> None:
    tasks = {}
    for name, counts in LEVELS.items():
        root = tmp_path / name.replace(" ", "_")
        _write_level(root, counts, with_predictions)
        out = root / "c.json"
        code, _, stderr = compare(capsys, "attn=gpa", "attn=nystrom", "--in", str(root), "--json", str(out))
        assert code == 0, stderr
        tasks[name] = json.loads(out.read_text())["tasks"][0]
    verdicts = {name: task["verdict"].split(" on ListOps")[0] for name, task in tasks.items()}
    assert verdicts["equal floats"] == verdicts["unequal floats"]
    assert verdicts["equal floats"].startswith("cannot tell whether")
    for task in tasks.values():
        assert task["delta"] == LEAD / N_TEST and task["sd_of_seed_differences"] == 0.0
        assert task["p"] is None and task["significant"] is False


def test_nan_accuracy_is_refused_with_one_clear_message(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for seed, acc in enumerate((0.41, math.nan)):
        write_run(tmp_path / f"a{seed}", attn="gpa", seed=seed, correct=None, acc=acc)
        write_run(tmp_path / f"b{seed}", attn="nystrom", seed=seed, correct=None, acc=0.40)
    code, stdout, stderr = compare(capsys, "attn=gpa", "attn=nystrom", "--in", str(tmp_path))
    assert code == 2 and stdout == ""
    assert len(stderr.strip().splitlines()) == 1
    assert "test_acc = nan, not an accuracy" in stderr and str(tmp_path / "a1" / "results.json") in stderr


def test_differences_come_from_counts() -> None:
    """The stats layer: counts recovered from accuracies and test sizes; without sizes a rounding-level spread is
    no spread; a non-finite accuracy is refused."""
    assert correct_count(610 / 2000, 2000) == 610 and correct_count(0.3051, 2000) is None
    assert correct_count(0.5, None) is None
    with_sizes = [outcome_from_accuracies(s, (c + LEAD) / N_TEST, c / N_TEST, N_TEST, N_TEST) for s, c in
                  enumerate(LEVELS["unequal floats"])]  # fmt: skip
    assert {o.diff for o in with_sizes} == {LEAD / N_TEST}
    floats = [SeedOutcome(s, (c + LEAD) / N_TEST, c / N_TEST) for s, c in enumerate(LEVELS["unequal floats"])]
    assert len({o.diff for o in floats}) == 2  # the float differences really differ
    for outcomes in (with_sizes, floats):
        result = compare_paired(outcomes)
        assert result.sd == 0.0 and result.test == NO_TEST and result.p is None
    with pytest.raises(ValueError, match="not a number"):
        outcome_from_accuracies(0, math.nan, 0.4)
    with pytest.raises(ValueError, match="not a number"):
        compare_paired([SeedOutcome(0, math.nan, 0.4), SeedOutcome(1, 0.41, 0.4)])
