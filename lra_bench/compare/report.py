"""The comparison as a person reads it (a markdown table, then one verdict per task and for the average, then
efficiency and notes) and as a program reads it (JSON). Nothing here computes a statistic."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from rich.table import Table

from lra_bench.compare.pairing import Comparison, Efficiency, TaskComparison
from lra_bench.compare.sides import Side
from lra_bench.kit.markdown import table
from lra_bench.kit.terminal import table_console
from lra_bench.leaderboard.published import FIVE_TASKS, TASK_LABELS, TASKS
from lra_bench.stats.paired import MCNEMAR, SIGN_FLIP, T_TEST, WELCH, PairedResult
from lra_bench.stats.speed import MIN_TIMED_STEPS, TOO_FEW, UNMEASURED, SpeedRatio
from lra_bench.stats.verdict import METHOD_SEEDS, p_text, significant, verdict

#: the comparison's main table: its header and one row per task (and the average)
MainTable = tuple[list[str], list[list[str]]]
SHORT_TEST = {T_TEST: "paired t", MCNEMAR: "McNemar", WELCH: "Welch t", SIGN_FLIP: "sign-flip"}
#: what the JSON says of each paired seed (`SeedOutcome`'s fields and its McNemar p)
PER_SEED = ("seed", "acc_a", "acc_b", "n10", "n01", "n", "mcnemar_p")


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
    return "—" if p is None else p_text(p, prefix="")


def setup_text(side: Side, task: str) -> str:
    """How the side's runs on `task` were set up: tuned or not, and whether they kept the protocol's values — an
    untuned run is "the protocol's values" only when its record says it is on protocol."""
    tuning = side.tuning(task)
    protocol = side.protocol(task)
    if tuning is not None:
        off = protocol.describe(skip=tuple(tuning.values))
        return tuning.describe() + (f"; {off}" if off else "")
    off = protocol.describe()
    return f"untuned, {off}" if off else "untuned (the protocol's values)"


def side_line(side: Side, tasks: Sequence[str]) -> str:
    described = {t: setup_text(side, t) for t in tasks}
    if len(set(described.values())) == 1:
        setup = next(iter(described.values()))
    else:
        setup = "; ".join(f"{task_label(t)}: {text}" for t, text in described.items())
    n_runs = sum(len(side.runs.get(t, {})) for t in tasks)
    return f"**{side.name}** = {side.label} (`{side.spec}`, {n_runs} runs) — {setup}"


def identity_source(comparison: Comparison) -> str:
    records = [r for side in (comparison.a, comparison.b) for t in side.runs for r in side.records(t)]
    recorded = sum(1 for r in records if r.get("identity"))
    if recorded == len(records):
        return "the runs' recorded experiment identities"
    return f"the resolved configs ({len(records) - recorded} of {len(records)} records predate the identity field)"


def _speed_cell(speed: SpeedRatio) -> str:
    """The table's step-time cell: the ratio with its interval, or why there is none."""
    if speed.status == UNMEASURED or speed.ratio is None:
        return "—"
    if speed.status == TOO_FEW:
        return "too few steps"
    if speed.ci is None:
        return f"{speed.ratio:.2f}× (no CI)"
    return f"{speed.ratio:.2f}× ({speed.ci[0]:.2f}–{speed.ci[1]:.2f})"


def _row(
    name: str,
    seeds: int,
    acc: tuple[float | None, float | None],
    result: PairedResult,
    holm_p: float | None,
    eff: tuple[SpeedRatio, float | None],
    marks: str,
    level: int,
) -> dict[str, str]:
    """One row of the main table, by column header."""
    return {
        "task": name,
        "seeds": str(seeds),
        "A acc": _pp(acc[0]),
        "B acc": _pp(acc[1]),
        "Δ (pp)": _pp(result.delta, signed=True),
        f"{level}% CI (pp)": _interval(result.ci),
        "test": SHORT_TEST.get(result.test, result.test),
        "p": _p(result.p),
        "Holm p": _p(holm_p),
        "bootstrap CI (pp)": _interval(result.bootstrap_ci),
        "step time A/B": _speed_cell(eff[0]),
        "peak mem A/B": "—" if eff[1] is None else f"{eff[1]:.2f}×",
        "tuning A / B": marks,
    }


def _tuning_marks(comparison: Comparison, task: str) -> str:
    def mark(side: Side) -> str:
        tuned = "tuned" if side.tuning(task) is not None else "untuned"
        conformance = side.protocol(task).conformance
        return tuned + {"off": " (off-protocol)", "unchecked": " (protocol unchecked)"}.get(conformance, "")

    return " / ".join(mark(side) for side in (comparison.a, comparison.b))


def speed_text(speed: SpeedRatio, level: float) -> str:
    """E.g. "A/B 0.50×, 95% CI 0.47–0.53×: A is 2.00× faster" — a winner only when the interval excludes 1."""
    if speed.ratio is None:
        return "step time not measured on every run"
    ratio = f"A/B {speed.ratio:.2f}×"
    if speed.status == TOO_FEW:
        return f"{ratio}: too few timed steps to tell ({speed.reason})"
    if speed.ci is None:
        return f"{ratio}: no interval, so no speed verdict ({speed.reason})"
    interval = f"{ratio}, {round(100 * level)}% CI {speed.ci[0]:.2f}–{speed.ci[1]:.2f}×"
    faster = speed.faster()
    if faster is None:
        return f"{interval}: no clear speed difference"
    factor = 1 / speed.ratio if faster == "A" else speed.ratio
    return f"{interval}: {faster} is {factor:.2f}× faster"


def _span(values: Sequence[float | None], fmt: str, every: bool) -> str:
    """The known values' range (`lo–hi`, one value when equal); "unknown" when none is known, or when any is
    unknown and `every` is asked for, else the unknown ones counted beside it."""
    known = sorted(v for v in values if v is not None)
    if not known or (every and len(known) < len(values)):
        return "unknown"
    shown = fmt.format(known[0]) if known[0] == known[-1] else f"{fmt.format(known[0])}–{fmt.format(known[-1])}"
    return shown + (f" ({len(values) - len(known)} run(s) unknown)" if len(known) < len(values) else "")


def load_text(eff: Efficiency) -> str:
    """The machine load each side was timed under (1-minute load average), and the timed-step counts."""
    cpus = f", {eff.cpus} CPUs" if eff.cpus else ""
    steps = [_span(side, "{}", every=True) for side in (eff.timed_steps_a, eff.timed_steps_b)]
    loads = [_span(side, "{:.2f}", every=False) for side in (eff.load_a, eff.load_b)]
    return (
        f"timed steps per run A {steps[0]}, B {steps[1]}; machine load while "
        f"timing (1-min load average{cpus}) A {loads[0]}, B {loads[1]}"
    )


def _efficiency_line(task: str, eff: Efficiency, level: float) -> str:
    if not eff.comparable:
        return f"- {task_label(task)}: {eff.note}"
    parts = []
    if eff.step_time_ratio is not None:
        parts.append(
            f"median step time A {1000 * eff.step_time_a_s:.1f} ms vs B {1000 * eff.step_time_b_s:.1f} ms "  # type: ignore[operator]
            f"({speed_text(eff.speed, level)}; {load_text(eff)})"
        )
    if eff.memory_ratio is not None:
        parts.append(
            f"peak memory A {eff.peak_memory_a_mib:,.0f} MiB vs B {eff.peak_memory_b_mib:,.0f} MiB "
            f"(A/B {eff.memory_ratio:.2f}×)"
        )
    return f"- {task_label(task)}: " + ("; ".join(parts) if parts else "not measured")


def _intro_lines(c: Comparison, names: list[str], level: int) -> list[str]:
    """The title, the two sides, what was checked to make them comparable and how to read the numbers; a warning
    when a task has one seed."""
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
        f"A / B, from the same runs; a step-time ratio has an interval only when every run timed ≥ {MIN_TIMED_STEPS} "
        "steps and recorded their spread.",
        "",
    ]
    if any(len(t.seeds) == 1 for t in c.tasks):
        out += [
            f"**One seed** on {', '.join(task_label(t.task) for t in c.tasks if len(t.seeds) == 1)}: one trained model "
            "per method, so a verdict there is about these two models on this test set, not about the methods "
            f"(seed noise of 1–3 pp is not covered). Run ≥ {METHOD_SEEDS} seeds per method to compare the methods.",
            "",
        ]
    return out


def _main_table(c: Comparison, level: int) -> MainTable:
    """One row per task (and the average over tasks): accuracies, Δ with its interval and test, efficiency ratios."""
    rows = [
        _row(
            task_label(t.task),
            len(t.seeds),
            (t.acc_a, t.acc_b),
            t.result,
            t.holm_p,
            (t.efficiency.speed, t.efficiency.memory_ratio),
            _tuning_marks(c, t.task),
            level,
        )
        for t in c.tasks
    ]
    if c.average is not None:
        acc = (sum(t.acc_a for t in c.tasks) / len(c.tasks), sum(t.acc_b for t in c.tasks) / len(c.tasks))
        name = f"average ({len(c.tasks)} tasks)"
        rows.append(_row(name, c.average.n_seeds, acc, c.average, None, c.average_efficiency, "", level))
    return list(rows[0]), [list(row.values()) for row in rows]


def _verdict_lines(c: Comparison, names: list[str], alpha: float) -> list[str]:
    """The verdicts per task and on average, and how many survive Holm's correction when several were tested."""
    out = ["", "## Verdicts", ""]
    out += [f"- {task_verdict(c, t, alpha)}" for t in c.tasks]
    if c.average is not None:
        out.append(f"- {verdict(c.a.label, c.b.label, average_label(names), c.average, alpha, c.level)}")
    tested = [t for t in c.tasks if t.result.p is not None]
    if len(tested) > 1:
        raw = sum(1 for t in tested if significant(t.result, alpha))
        kept = sum(1 for t in tested if significant(t.result, alpha, t.adjusted))
        out += [
            "",
            f"Multiple comparisons: {len(tested)} tasks tested at α = {alpha}; by chance alone about "
            f"{alpha * len(tested):.2f} would come out significant on the raw p. {raw} did; {kept} stay significant "
            "after Holm's correction (the *Holm p* column), and the task verdicts above decide on the Holm p.",
        ]
    return out


def report_parts(comparison: Comparison, alpha: float = 0.05) -> tuple[list[str], MainTable, list[str]]:
    """The report as (lines before the main table, the main table, lines after it): markdown renders the table as
    a pipe table (`render_markdown`), a terminal as a rich table (`print_report`)."""
    c = comparison
    names = [t.task for t in c.tasks]
    level = round(100 * c.level)
    out = _verdict_lines(c, names, alpha)
    out += ["", "## Efficiency (measured in the same runs)", ""]
    out += [_efficiency_line(t.task, t.efficiency, c.level) for t in c.tasks]
    average_speed = c.average_efficiency[0]
    if len(c.tasks) > 1 and average_speed.ratio is not None:
        out.append(f"- average over tasks (geometric mean): {speed_text(average_speed, c.level)}")
    notes = _notes(c)
    if notes:
        out += ["", "## Notes", "", *(f"- {n}" for n in notes)]
    return _intro_lines(c, names, level), _main_table(c, level), out


def render_markdown(comparison: Comparison, alpha: float = 0.05) -> str:
    """The report as markdown: the main table as a pipe table between its surrounding lines."""
    before, main, after = report_parts(comparison, alpha)
    return "\n".join([*before, *table(*main), *after]) + "\n"


def print_report(comparison: Comparison, alpha: float = 0.05, console: Any = None) -> None:
    """The report for a terminal: the same text, the main table drawn by rich (markdown's pipes are hard to read)."""
    console = console or table_console(highlight=False)
    before, (header, body), after = report_parts(comparison, alpha)
    console.print("\n".join(before).rstrip(), markup=False)
    drawn = Table(*header, header_style="bold")
    for row in body:
        drawn.add_row(*row)
    console.print(drawn)
    console.print("\n".join(after).rstrip(), markup=False)


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
        "per_seed": [{key: getattr(o, key) for key in PER_SEED} for o in result.outcomes],
    }


def task_verdict(c: Comparison, t: TaskComparison, alpha: float) -> str:
    """The task's sentence, deciding on the Holm-adjusted p when several tasks are tested."""
    return verdict(c.a.label, c.b.label, task_label(t.task), t.result, alpha, c.level, t.adjusted)


def _task_json(c: Comparison, t: TaskComparison, alpha: float) -> dict[str, Any]:
    e = t.efficiency
    return {
        "task": t.task,
        "seeds": t.seeds,
        "acc_a": t.acc_a,
        "acc_b": t.acc_b,
        **_result_json(t.result),
        "holm_p": t.holm_p,
        "significant": significant(t.result, alpha, t.adjusted),
        "significance_p": "holm_p" if t.adjusted is not None else "p",
        "verdict": task_verdict(c, t, alpha),
        "tuned": {"A": c.a.tuning(t.task) is not None, "B": c.b.tuning(t.task) is not None},
        "protocol": {side.name: asdict(side.protocol(t.task)) for side in (c.a, c.b)},
        "efficiency": {
            "step_time_a_s": e.step_time_a_s,
            "step_time_b_s": e.step_time_b_s,
            "step_time_ratio": e.step_time_ratio,
            "step_time_ratio_ci": list(e.speed.ci) if e.speed.ci else None,
            "speed_status": e.speed.status,
            "speed_reason": e.speed.reason,
            "faster": e.speed.faster(),
            "timed_steps_a": list(e.timed_steps_a),
            "timed_steps_b": list(e.timed_steps_b),
            "load_avg_1m_a": list(e.load_a),
            "load_avg_1m_b": list(e.load_b),
            "cpu_count": e.cpus,
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
