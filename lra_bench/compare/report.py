"""The comparison as a person reads it (a markdown table, then one verdict per task and for the average, then
efficiency and notes) and as a program reads it (JSON). Nothing here computes a statistic."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lra_bench.compare.pairing import Comparison, Efficiency, TaskComparison
from lra_bench.compare.sides import Side
from lra_bench.leaderboard.published import FIVE_TASKS, TASK_LABELS, TASKS
from lra_bench.stats.paired import MCNEMAR, SIGN_FLIP, T_TEST, WELCH, PairedResult
from lra_bench.stats.verdict import significant, verdict

SHORT_TEST = {T_TEST: "paired t", MCNEMAR: "McNemar", WELCH: "Welch t", SIGN_FLIP: "sign-flip"}


def task_label(task: str) -> str:
    return TASK_LABELS.get(task, task)


def average_label(tasks: Sequence[str]) -> str:
    if set(tasks) == set(FIVE_TASKS):
        return "the LRA 5-task average"
    if set(tasks) == set(TASKS):
        return "the 6-task average"
    return f"the average over {len(tasks)} tasks ({', '.join(task_label(t) for t in tasks)})"


def _pp(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "—"
    return f"{100 * value:+.2f}" if signed else f"{100 * value:.2f}"


def _interval(ci: tuple[float, float] | None) -> str:
    return "—" if ci is None else f"{100 * ci[0]:.2f} to {100 * ci[1]:.2f}"


def _p(p: float | None) -> str:
    return "—" if p is None else (f"{p:.2g}" if p < 0.001 else f"{p:.3f}")


def _x(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio:.2f}×"


def side_line(side: Side, tasks: Sequence[str]) -> str:
    tunings = {t: side.tuning(t) for t in tasks}
    described = {(tu.describe() if tu else "untuned (the protocol's values)") for tu in tunings.values()}
    tuning = "; ".join(sorted(described))
    n_runs = sum(len(side.runs.get(t, {})) for t in tasks)
    return f"**{side.name}** = {side.label} (`{side.spec}`, {n_runs} runs) — {tuning}"


def identity_source(comparison: Comparison) -> str:
    records = [r for side in (comparison.a, comparison.b) for t in side.runs for r in side.records(t)]
    recorded = sum(1 for r in records if r.get("identity"))
    if recorded == len(records):
        return "the runs' recorded experiment identities"
    return f"the resolved configs ({len(records) - recorded} of {len(records)} records predate the identity field)"


def _row(
    name: str,
    seeds: int,
    acc: tuple[float | None, float | None],
    result: PairedResult,
    holm_p: float | None,
    eff: tuple[float | None, float | None],
    marks: str,
) -> list[str]:
    return [
        name,
        str(seeds),
        _pp(acc[0]),
        _pp(acc[1]),
        _pp(result.delta, signed=True),
        _interval(result.ci),
        SHORT_TEST.get(result.test, result.test),
        _p(result.p),
        _p(holm_p),
        _interval(result.bootstrap_ci),
        _x(eff[0]),
        _x(eff[1]),
        marks,
    ]


def _tuning_marks(comparison: Comparison, task: str) -> str:
    return " / ".join("tuned" if side.tuning(task) is not None else "untuned" for side in (comparison.a, comparison.b))


def _efficiency_line(task: str, eff: Efficiency) -> str:
    if not eff.comparable:
        return f"- {task_label(task)}: {eff.note}"
    parts = []
    if eff.step_time_ratio is not None:
        faster = "A" if eff.step_time_ratio < 1 else "B"
        factor = 1 / eff.step_time_ratio if eff.step_time_ratio < 1 else eff.step_time_ratio
        parts.append(
            f"median step time A {1000 * eff.step_time_a_s:.1f} ms vs B {1000 * eff.step_time_b_s:.1f} ms "  # type: ignore[operator]
            f"(A/B {eff.step_time_ratio:.2f}×: {faster} is {factor:.2f}× faster)"
        )
    if eff.memory_ratio is not None:
        parts.append(
            f"peak memory A {eff.peak_memory_a_mib:,.0f} MiB vs B {eff.peak_memory_b_mib:,.0f} MiB "
            f"(A/B {eff.memory_ratio:.2f}×)"
        )
    return f"- {task_label(task)}: " + ("; ".join(parts) if parts else "not measured")


def render_markdown(comparison: Comparison, alpha: float = 0.05) -> str:
    c = comparison
    names = [t.task for t in c.tasks]
    level = round(100 * c.level)
    out = [
        f"# compare: {c.a.label} vs {c.b.label}",
        "",
        side_line(c.a, names),
        "",
        side_line(c.b, names),
        "",
        f"Same experiment apart from the method and seed: checked on {len(names)} task(s) with {identity_source(c)}.",
        f"Accuracies in percent (mean over the paired seeds); Δ = A − B in percentage points. {level}% CI: the "
        "interval of the test in the *test* column (≥ 2 seeds: paired t-test over seeds, covering training-seed "
        "and test-set noise; 1 seed: bootstrap over test examples with the exact McNemar test, test-set noise "
        f"only). *bootstrap CI*: resampling seeds, then test examples within each seed ({c.n_resamples} resamples, "
        f"seed {c.seed}); with few seeds it understates the seed variance and never decides the verdict. Ratios are "
        "A / B, from the same runs.",
        "",
    ]
    header = [
        "task",
        "seeds",
        "A acc",
        "B acc",
        "Δ (pp)",
        f"{level}% CI (pp)",
        "test",
        "p",
        "Holm p",
        "bootstrap CI (pp)",
        "step time A/B",
        "peak mem A/B",
        "tuning A / B",
    ]
    body = [
        _row(
            task_label(t.task),
            len(t.seeds),
            (t.acc_a, t.acc_b),
            t.result,
            t.holm_p,
            (t.efficiency.step_time_ratio, t.efficiency.memory_ratio),
            _tuning_marks(c, t.task),
        )
        for t in c.tasks
    ]
    if c.average is not None:
        acc = (sum(t.acc_a for t in c.tasks) / len(c.tasks), sum(t.acc_b for t in c.tasks) / len(c.tasks))
        body.append(
            _row(f"average ({len(c.tasks)} tasks)", c.average.n_seeds, acc, c.average, None, c.average_efficiency, "")
        )
    out += ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in body]
    out += ["", "## Verdicts", ""]
    out += [f"- {verdict(c.a.label, c.b.label, task_label(t.task), t.result, alpha, c.level)}" for t in c.tasks]
    if c.average is not None:
        out.append(f"- {verdict(c.a.label, c.b.label, average_label(names), c.average, alpha, c.level)}")
    tested = [t for t in c.tasks if t.result.p is not None]
    if len(tested) > 1:
        raw = sum(1 for t in tested if significant(t.result, alpha))
        kept = sum(1 for t in tested if significant(t.result, alpha) and t.holm_p is not None and t.holm_p < alpha)
        out += [
            "",
            f"Multiple comparisons: {len(tested)} tasks tested at α = {alpha}; by chance alone about "
            f"{alpha * len(tested):.2f} would come out significant. {raw} did; {kept} stay significant after Holm's "
            "correction (the *Holm p* column).",
        ]
    out += ["", "## Efficiency (measured in the same runs)", ""]
    out += [_efficiency_line(t.task, t.efficiency) for t in c.tasks]
    notes = _notes(c)
    if notes:
        out += ["", "## Notes", "", *(f"- {n}" for n in notes)]
    return "\n".join(out) + "\n"


def _notes(c: Comparison) -> list[str]:
    notes = []
    for t in c.tasks:
        if t.only_a or t.only_b:
            only = f"only in A: {t.only_a or '-'}; only in B: {t.only_b or '-'}"
            notes.append(f"{task_label(t.task)}: unpaired seeds left out ({only})")
        notes += [f"{task_label(t.task)}: {n}" for n in t.notes]
    if c.unpaired_tasks:
        notes.append(f"no common seed on: {', '.join(map(task_label, c.unpaired_tasks))}")
    if c.only_a or c.only_b:
        notes.append(
            f"tasks on one side only (not compared): A {', '.join(map(task_label, c.only_a)) or '-'}; "
            f"B {', '.join(map(task_label, c.only_b)) or '-'}"
        )
    notes += [f"A: {n}" for n in c.a.notes] + [f"B: {n}" for n in c.b.notes]
    return notes


def _result_json(result: PairedResult) -> dict[str, Any]:
    return {
        "n_seeds": result.n_seeds,
        "delta": result.delta,
        "ci": list(result.ci) if result.ci else None,
        "p": result.p,
        "test": result.test,
        "sd_of_seed_differences": result.sd,
        "bootstrap_ci": list(result.bootstrap_ci) if result.bootstrap_ci else None,
        "note": result.note,
        "per_seed": [
            {
                "seed": o.seed,
                "acc_a": o.acc_a,
                "acc_b": o.acc_b,
                "n10": o.n10,
                "n01": o.n01,
                "n": o.n,
                "mcnemar_p": o.mcnemar_p,
            }
            for o in result.outcomes
        ],
    }


def _task_json(c: Comparison, t: TaskComparison, alpha: float) -> dict[str, Any]:
    e = t.efficiency
    return {
        "task": t.task,
        "seeds": t.seeds,
        "acc_a": t.acc_a,
        "acc_b": t.acc_b,
        **_result_json(t.result),
        "holm_p": t.holm_p,
        "significant": significant(t.result, alpha),
        "verdict": verdict(c.a.label, c.b.label, task_label(t.task), t.result, alpha, c.level),
        "tuned": {"A": c.a.tuning(t.task) is not None, "B": c.b.tuning(t.task) is not None},
        "efficiency": {
            "step_time_a_s": e.step_time_a_s,
            "step_time_b_s": e.step_time_b_s,
            "step_time_ratio": e.step_time_ratio,
            "peak_memory_a_mib": e.peak_memory_a_mib,
            "peak_memory_b_mib": e.peak_memory_b_mib,
            "memory_ratio": e.memory_ratio,
            "comparable": e.comparable,
        },
        "notes": t.notes,
    }


def to_json(comparison: Comparison, alpha: float = 0.05) -> dict[str, Any]:
    c = comparison
    names = [t.task for t in c.tasks]
    average = None
    if c.average is not None:
        average = {
            **_result_json(c.average),
            "significant": significant(c.average, alpha),
            "verdict": verdict(c.a.label, c.b.label, average_label(names), c.average, alpha, c.level),
        }
    return {
        "a": {"label": c.a.label, "spec": c.a.spec},
        "b": {"label": c.b.label, "spec": c.b.spec},
        "level": c.level,
        "alpha": alpha,
        "n_resamples": c.n_resamples,
        "seed": c.seed,
        "tasks": [_task_json(c, t, alpha) for t in c.tasks],
        "average": average,
        "notes": _notes(c),
    }
