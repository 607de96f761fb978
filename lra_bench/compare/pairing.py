"""Pair the two sides' runs by task and seed, their test examples by position, and compute the answer.

Per-example outputs (`test_predictions.npz`) are used when both runs of a seed have them; their labels must be
identical (same test split, same order), else the pairing would be meaningless and the comparison is refused.
Without them the comparison falls back to seed-level accuracies and says so. Efficiency comes from the same runs,
and is marked not comparable when they ran on different hardware; the machine load each side was timed under goes
beside the step-time ratio (`lra_bench.stats.speed`: what no interval covers).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lra_bench.compare.sides import CompareError, Side
from lra_bench.leaderboard.aggregate import task_order
from lra_bench.record import predictions
from lra_bench.record.identity import MEASUREMENT, differing_keys, identity_of, under
from lra_bench.record.reader import typed
from lra_bench.record.schema import Metrics
from lra_bench.record.table import over_seeds, runs_table
from lra_bench.stats.paired import (
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    PairedResult,
    SeedOutcome,
    compare_average,
    compare_paired,
    outcome_from_accuracies,
    outcome_from_predictions,
)
from lra_bench.stats.speed import UNMEASURED, SpeedRatio, Timing, average_speed_ratio, speed_ratio
from lra_bench.stats.summary import holm
from lra_bench.stats.verdict import Adjustment


@dataclass(frozen=True)
class Efficiency:
    """Medians over the paired seeds; ratios are A / B (a step-time ratio < 1 = A is faster).

    `speed`: the step-time ratio (of the geometric means of the runs' medians) with its interval, or why there is
    none; `load_*`: each run's 1-minute load average while it was timed and `timed_steps_*` its number of timed
    steps (None: unknown); `cpus`: the CPU count of the (one) machine."""

    step_time_a_s: float | None
    step_time_b_s: float | None
    peak_memory_a_mib: float | None
    peak_memory_b_mib: float | None
    comparable: bool
    note: str = ""
    speed: SpeedRatio = SpeedRatio(None, None, UNMEASURED)
    load_a: tuple[float | None, ...] = ()
    load_b: tuple[float | None, ...] = ()
    timed_steps_a: tuple[int | None, ...] = ()
    timed_steps_b: tuple[int | None, ...] = ()
    cpus: int | None = None

    @property
    def step_time_ratio(self) -> float | None:
        return self.speed.ratio

    @property
    def memory_ratio(self) -> float | None:
        a, b = self.peak_memory_a_mib, self.peak_memory_b_mib
        return a / b if a is not None and b not in (None, 0.0) else None


@dataclass
class TaskComparison:
    task: str
    seeds: list[Any]
    only_a: list[Any]
    only_b: list[Any]
    result: PairedResult
    efficiency: Efficiency
    holm_p: float | None = None
    notes: list[str] = field(default_factory=list)
    adjusted: Adjustment | None = None  # the Holm-adjusted p the verdict decides on, when several tasks are tested

    @property
    def acc_a(self) -> float:
        return float(np.mean([o.acc_a for o in self.result.outcomes]))

    @property
    def acc_b(self) -> float:
        return float(np.mean([o.acc_b for o in self.result.outcomes]))


def seed_outcome(seed: Any, rec_a: dict[str, Any], rec_b: dict[str, Any], notes: list[str]) -> SeedOutcome:
    """Per-example outcomes when both runs saved them (labels checked equal), else the records' accuracies."""
    pa, pb = (Path(rec["_path"]).with_name(predictions.FILENAME) for rec in (rec_a, rec_b))
    if pa.exists() and pb.exists():
        try:
            a, b = predictions.load_predictions(pa), predictions.load_predictions(pb)
        except (OSError, ValueError, KeyError) as err:
            raise CompareError(f"unreadable test predictions ({err}): {pa} / {pb}") from None
        if a.label.shape != b.label.shape or not np.array_equal(a.label, b.label):
            what = f"{a.label.size} vs {b.label.size} examples"
            if a.label.shape == b.label.shape:
                what = f"labels differ at {int(np.sum(a.label != b.label))} of {a.label.size} positions"
            raise CompareError(f"test predictions are not on the same test examples ({what}): {pa} and {pb}")
        for rec, pred, path in ((rec_a, a, pa), (rec_b, b, pb)):
            recorded = typed(rec).metrics.test_acc
            if recorded is not None and abs(float(recorded) - pred.accuracy) > 1e-6:
                notes.append(f"{path}: accuracy {pred.accuracy:.4f} ≠ the record's test_acc {float(recorded):.4f}")
        return outcome_from_predictions(seed, a.correct, b.correct)
    return _outcome_from_records(seed, rec_a, rec_b)


def _outcome_from_records(seed: Any, rec_a: dict[str, Any], rec_b: dict[str, Any]) -> SeedOutcome:
    """The seed's outcome from the two records' accuracies and test sizes (a size that differs: another test set)."""
    ma, mb = typed(rec_a).metrics, typed(rec_b).metrics
    na, nb = ma.test_examples, mb.test_examples
    if na is not None and nb is not None and na != nb:
        raise CompareError(
            f"seed {seed}: A was tested on {na} examples and B on {nb}: not the same test set "
            f"({rec_a['_path']} / {rec_b['_path']})"
        )
    try:
        if ma.test_acc is None or mb.test_acc is None:  # never paired: `sides` leaves such records out
            raise ValueError(f"seed {seed}: a record without a test accuracy")
        return outcome_from_accuracies(seed, float(ma.test_acc), float(mb.test_acc), na, nb)
    except ValueError as err:
        raise CompareError(f"{err} ({rec_a['_path']} / {rec_b['_path']})") from None


def timing(metrics: Metrics) -> Timing:
    """The run's step-time measurement (`timed_steps`, `step_time_iqr_s`: None in older records)."""
    return Timing(metrics.step_time_median_s, metrics.timed_steps, metrics.step_time_iqr_s)


def efficiency(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]], level: float = 0.95) -> Efficiency:
    machines = [typed(r).env_part("hardware") for r in (*a, *b)]
    hardware = {json.dumps(machine, sort_keys=True, default=str) for machine in machines}
    cpus = {machine.get("cpu_count") for machine in machines}
    comparable = len(hardware) == 1
    note = "" if comparable else f"measured on {len(hardware)} different hardware setups: not comparable"
    measured = ("step_time_median_s", "peak_memory_mib")
    sa, sb = over_seeds(runs_table(a), measured), over_seeds(runs_table(b), measured)  # the leaderboard's statistic
    ma, mb = [typed(r).metrics for r in a], [typed(r).metrics for r in b]
    return Efficiency(
        sa["step_time_median_s"],
        sb["step_time_median_s"],
        sa["peak_memory_mib"],
        sb["peak_memory_mib"],
        comparable,
        note,
        speed_ratio([timing(m) for m in ma], [timing(m) for m in mb], level),
        tuple(m.load_avg_1m for m in ma),
        tuple(m.load_avg_1m for m in mb),
        tuple(m.timed_steps for m in ma),
        tuple(m.timed_steps for m in mb),
        cpus.pop() if len(cpus) == 1 else None,
    )


def measurement_note(records: Sequence[dict[str, Any]]) -> str | None:
    """A note when the runs differ in `MEASUREMENT` keys (allowed: they never change a weight or a prediction)."""
    keys = [k for k in differing_keys([identity_of(r) for r in records]) if under(k, MEASUREMENT)]
    if not keys:
        return None
    return (
        f"the runs differ in {', '.join(keys)}: measurement settings that never change a weight or a test "
        "prediction (compared as the protocol check does); a peak memory may include their probe"
    )


def common_tasks(a: Side, b: Side) -> tuple[list[str], list[str], list[str]]:
    """(tasks on both sides, tasks only in A, tasks only in B), in LRA column order."""
    both = sorted(set(a.runs) & set(b.runs), key=task_order)
    return both, sorted(set(a.runs) - set(b.runs), key=task_order), sorted(set(b.runs) - set(a.runs), key=task_order)


def compare_task(
    a: Side, b: Side, task: str, index: int, level: float, n_resamples: int, seed: int
) -> TaskComparison | None:
    runs_a, runs_b = a.runs[task], b.runs[task]
    seeds = sorted(set(runs_a) & set(runs_b), key=str)
    only_a, only_b = sorted(set(runs_a) - set(runs_b), key=str), sorted(set(runs_b) - set(runs_a), key=str)
    if not seeds:
        return None
    notes: list[str] = []
    outcomes = [seed_outcome(s, runs_a[s], runs_b[s], notes) for s in seeds]
    without = [str(o.seed) for o in outcomes if not o.has_examples]
    if without:
        notes.append(
            f"no per-example test outputs ({predictions.FILENAME}) for both runs of seed(s) {', '.join(without)}: "
            "seed-level statistics only"
        )
    # each task its own random stream, so the tasks' bootstrap draws are independent (the average relies on it)
    result = compare_paired(outcomes, level=level, n_resamples=n_resamples, seed=(seed, index))
    paired_a, paired_b = [runs_a[s] for s in seeds], [runs_b[s] for s in seeds]
    eff = efficiency(paired_a, paired_b, level)
    measured = measurement_note([*paired_a, *paired_b])
    if measured:
        notes.append(measured)
    return TaskComparison(task, seeds, only_a, only_b, result, eff, notes=notes)


@dataclass
class Comparison:
    a: Side
    b: Side
    tasks: list[TaskComparison]
    average: PairedResult | None
    unpaired_tasks: list[str]
    only_a: list[str]
    only_b: list[str]
    level: float
    n_resamples: int
    seed: int

    @property
    def average_efficiency(self) -> tuple[SpeedRatio, float | None]:
        """Over comparable tasks: the geometric-mean step-time ratio (with its interval when every task has one) and
        the geometric mean of the memory ratios."""
        ok = [t.efficiency for t in self.tasks if t.efficiency.comparable]
        memory = [e.memory_ratio for e in ok if e.memory_ratio is not None and e.memory_ratio > 0]
        geo = statistics.geometric_mean(memory) if memory else None
        return average_speed_ratio([e.speed for e in ok], self.level), geo


def compare_sides(
    a: Side, b: Side, level: float = 0.95, n_resamples: int = DEFAULT_RESAMPLES, seed: int = DEFAULT_SEED
) -> Comparison:
    tasks, only_a, only_b = common_tasks(a, b)
    if not tasks:
        raise CompareError(
            f"A and B share no task (A: {', '.join(sorted(a.runs)) or '-'}; B: {', '.join(sorted(b.runs)) or '-'})"
        )
    items = [compare_task(a, b, task, index, level, n_resamples, seed) for index, task in enumerate(tasks)]
    compared = [item for item in items if item is not None]
    unpaired = [task for task, item in zip(tasks, items) if item is None]
    if not compared:
        raise CompareError(f"A and B share no seed on any common task ({', '.join(tasks)})")
    family = sum(1 for t in compared if t.result.p is not None)
    for item, p in zip(compared, holm([t.result.p for t in compared])):
        item.holm_p = p
        item.adjusted = Adjustment(p, family) if family > 1 and p is not None else None
    average = compare_average([t.result for t in compared], level, n_resamples, seed) if len(compared) > 1 else None
    return Comparison(a, b, compared, average, unpaired, only_a, only_b, level, n_resamples, seed)
