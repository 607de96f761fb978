"""The claims section of `docs/reproductions.md`: what the committed runs say about the accuracy claims of the
methods this harness exists to test, each read with the seeds it would take to tell.

Every comparison pairs the two attentions' completed on-protocol seeds of the current network by seed and goes
through the same statistics as `python -m lra_bench.compare` (`lra_bench.compare.pairing.seed_outcome` →
`lra_bench.stats.paired.compare_paired`: a paired t-test over ≥ 2 seeds, with its 95% interval; one seed has only
test-set noise, which never settles a claim about methods). The claims:

- **outlier-spectral against full** — its paper's criterion is "at least 1.5× lower attention memory or latency with
  less than one percentage point accuracy loss". The accuracy half is read as an equivalence statement on Δ =
  spectral − full: *met* when the whole interval lies above −1 pp, *missed* when it lies below, otherwise *cannot
  tell*; the efficiency half from the same runs' median step time and peak memory (whole training step and process,
  so a conservative view of the attention's own saving).
- **GPA against every other efficient attention** with ≥ 2 seeds, Holm-adjusted over those comparisons, and where it
  ranks among all attentions (tie-aware: below another only when their mean intervals do not overlap).
- **residual-pivoted against Nyström at equal rank** (the rank budget each record states).
- **locality**: how much of full attention's ListOps accuracy a bounded window reaches, with the window it used.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from lra_bench.compare.pairing import efficiency, seed_outcome
from lra_bench.kit.markdown import table
from lra_bench.reproduction_approx import EXACT
from lra_bench.reproduction_cost import cost_rows
from lra_bench.reproduction_runs import Run, completed
from lra_bench.stats.paired import NO_TEST, PairedResult, compare_paired
from lra_bench.stats.power import seeds_per_arm
from lra_bench.stats.summary import holm, tie_aware_ranks

DIFFERENCE_PP = 1.0  # the gap the page sizes seeds for: about the spread of the published ListOps rows
EQUIVALENCE_PP = 1.0  # outlier-spectral's margin: "less than one percentage point accuracy loss"
EFFICIENCY_FACTOR = 1.5  # and "at least 1.5× lower attention memory or latency"
MIN_SEEDS = 2  # a claim about methods needs the seed spread: at least 2 paired seeds


def _with_path(run: Run) -> dict[str, Any]:
    """The record as `compare` reads it: with `_path`, where its test predictions lie beside it."""
    return {**run.record, "_path": str(run.folder / "results.json")}


def paired(a: Sequence[Run], b: Sequence[Run]) -> PairedResult | None:
    """Δ = a − b over the seeds both have (per-example outcomes where both runs saved them); None with fewer than
    `MIN_SEEDS` of them."""
    b_by_seed = {r.seed: r for r in b}
    notes: list[str] = []
    outcomes = [
        seed_outcome(r.seed, _with_path(r), _with_path(b_by_seed[r.seed]), notes) for r in a if r.seed in b_by_seed
    ]
    return compare_paired(outcomes) if len(outcomes) >= MIN_SEEDS else None


def seeds_needed(
    runs_a: Sequence[Run], runs_b: Sequence[Run], a: str, b: str, difference_pp: float = DIFFERENCE_PP
) -> str:
    """How many seeds per method a `difference_pp` gap needs, from the seed spread measured so far (pooled sd)."""
    accs = {
        a: [100 * r.test_acc for r in runs_a if r.test_acc is not None],
        b: [100 * r.test_acc for r in runs_b if r.test_acc is not None],
    }
    if min(len(v) for v in accs.values()) < 2:
        return (
            f"Seeds needed for a {difference_pp:g} pp difference: unknown until each method has 2 completed seeds "
            f"(the seed spread is not measured yet; now {len(accs[a])} and {len(accs[b])})."
        )
    pooled = math.sqrt(
        sum((len(v) - 1) * statistics.variance(v) for v in accs.values()) / sum(len(v) - 1 for v in accs.values())
    )
    n = seeds_per_arm(difference_pp, pooled)
    spreads = ", ".join(f"{k} {statistics.stdev(v):.2f} pp over {len(v)} seeds" for k, v in accs.items())
    need = f"{n} seeds per method" if n is not None else "more seeds than is practical"
    return (
        f"Seeds needed for a {difference_pp:g} pp difference: {need} (two-sided t-test, α 0.05, power 0.80, pooled "
        f"seed sd {pooled:.2f} pp; measured seed sd: {spreads})."
    )


def _delta_text(result: PairedResult) -> str:
    ci = f" [{100 * result.ci[0]:+.2f}, {100 * result.ci[1]:+.2f}]" if result.ci else ""
    p = f", p = {result.p:.3g}" if result.p is not None else ""
    how = result.note if result.test == NO_TEST else result.test
    seeds = f"{result.n_seeds} paired seed{'s' * (result.n_seeds != 1)}"
    return f"Δ {100 * result.delta:+.2f} pp{ci} ({seeds}, {how}{p})"


def _waiting(a: str, b: str, runs_a: Sequence[Run], runs_b: Sequence[Run]) -> str:
    return (
        f"Cannot be read yet: it needs ≥ {MIN_SEEDS} completed seeds of each with the same seeds "
        f"(now `{a}` {len(runs_a)}, `{b}` {len(runs_b)})."
    )


def equivalence(result: PairedResult, margin_pp: float = EQUIVALENCE_PP) -> str:
    """met / missed / cannot tell for "less than `margin_pp` accuracy loss", from the interval of Δ."""
    if result.ci is None:
        return "cannot tell (no interval over seeds)"
    low, high = 100 * result.ci[0], 100 * result.ci[1]
    if low > -margin_pp:
        return f"**met**: the whole interval lies above −{margin_pp:g} pp"
    if high < -margin_pp:
        return f"**missed**: the whole interval lies below −{margin_pp:g} pp"
    return f"cannot tell: the interval spans −{margin_pp:g} pp"


def spectral_claim(runs: Sequence[Run]) -> list[str]:
    spectral, full = completed(runs, "spectral"), completed(runs, EXACT)
    lines = [
        "### Outlier-spectral against full attention",
        "",
        f"Criterion: at least {EFFICIENCY_FACTOR:g}× lower memory or latency with less than {EQUIVALENCE_PP:g} pp "
        "accuracy loss.",
        "",
    ]
    result = paired(spectral, full)
    if result is None:
        return [*lines, _waiting("spectral", EXACT, spectral, full), ""]
    eff = efficiency([_with_path(r) for r in spectral], [_with_path(r) for r in full])
    speed, memory_ratio = eff.speed, eff.memory_ratio
    latency = (
        f"step time ratio {speed.ratio:.2f}× [{speed.ci[0]:.2f}, {speed.ci[1]:.2f}]"
        if speed.ratio is not None and speed.ci
        else f"step time ratio not measured ({speed.reason or speed.status})"
    )
    memory = f"peak memory ratio {memory_ratio:.2f}×" if memory_ratio is not None else "peak memory unknown"
    saving = any(ratio is not None and ratio <= 1 / EFFICIENCY_FACTOR for ratio in (speed.ratio, memory_ratio))
    where = "" if eff.comparable else f" ({eff.note})"
    return [
        *lines,
        f"Accuracy: {_delta_text(result)} — {equivalence(result)}.",
        "",
        f"Efficiency (spectral / full, whole training step and process, median over seeds){where}: {latency}, "
        f"{memory} — {'meets' if saving else 'does not meet'} the {EFFICIENCY_FACTOR:g}× factor.",
        "",
        seeds_needed(spectral, full, "spectral", EXACT, EQUIVALENCE_PP),
        "",
    ]


def gpa_claim(runs: Sequence[Run]) -> list[str]:
    """GPA against each other efficient attention (Holm-adjusted), and its tie-aware rank among all attentions."""
    lines = ["### GPA against every other efficient attention", ""]
    rows, gpa = cost_rows(runs)[0], completed(runs, "gpa")
    others = [r.attn for r in rows if r.attn not in ("gpa", EXACT)]
    tested = [(a, result) for a in others if (result := paired(gpa, completed(runs, a))) is not None]
    waiting = [a for a in others if a not in dict(tested)]
    if tested:
        body = []
        for (attn, result), p_holm in zip(tested, holm([r.p for _, r in tested])):
            if p_holm is None or p_holm >= 0.05:
                tell = "cannot tell"
            else:
                tell = "GPA better" if result.delta > 0 else "GPA worse"
            holm_text = f"{p_holm:.3g}" if p_holm is not None else "—"
            body.append([f"gpa − {attn}", _delta_text(result), holm_text, tell])
        lines += [*table(["comparison", "Δ (95% CI)", "Holm-adjusted p", "reading (α 0.05)"], body), ""]
    else:
        lines += [f"No other efficient attention has ≥ {MIN_SEEDS} completed seeds paired with GPA's yet.", ""]
    if waiting:
        lines += [f"Not yet comparable (fewer than {MIN_SEEDS} paired seeds): {', '.join(waiting)}.", ""]
    ranked = [r for r in rows if r.seeds >= MIN_SEEDS]
    ranks = tie_aware_ranks([r.interval for r in ranked])
    place = next((rank for row, rank in zip(ranked, ranks) if row.attn == "gpa"), None)
    if place is None:
        return [*lines, f"Rank: GPA has fewer than {MIN_SEEDS} completed seeds.", ""]
    tied = sum(rank == place for rank in ranks) - 1
    return [
        *lines,
        f"Rank: {place} of {len(ranked)} attentions with ≥ {MIN_SEEDS} seeds (tie-aware: below another only when "
        f"the 95% intervals of the means do not overlap){f', tied with {tied} other(s)' if tied else ''}.",
        "",
    ]


def pivoted_claim(runs: Sequence[Run]) -> list[str]:
    lines = ["### Residual-pivoted against Nyström at equal rank", ""]
    pivoted, nystrom = completed(runs, "pivoted"), completed(runs, "nystrom")
    result = paired(pivoted, nystrom)
    if result is None:
        return [*lines, _waiting("pivoted", "nystrom", pivoted, nystrom), ""]
    budgets = {r.record.get("rank_budget") for r in (*pivoted, *nystrom)}
    if len(budgets) != 1:
        return [*lines, f"Not at equal rank: the runs' rank budgets are {sorted(map(str, budgets))}.", ""]
    return [*lines, f"At rank {budgets.pop()}: {_delta_text(result)} (pivoted − nystrom).", ""]


def locality_claim(runs: Sequence[Run]) -> list[str]:
    lines = ["### Locality: a bounded window against full attention", ""]
    local, full = completed(runs, "local"), completed(runs, EXACT)
    result = paired(local, full)
    if result is None:
        return [*lines, _waiting("local", EXACT, local, full), ""]
    windows = {r.typed.config_at("attn.window") for r in local}
    share = statistics.fmean(r.test_acc or 0.0 for r in local) / statistics.fmean(r.test_acc or 0.0 for r in full)
    return [
        *lines,
        f"Window {', '.join(map(str, sorted(windows, key=str)))}: local reaches {share:.1%} of full attention's mean "
        f"ListOps accuracy; {_delta_text(result)} (local − full).",
        "",
    ]


def claims_section(runs: Sequence[Run]) -> list[str]:
    """The page's claims section from `runs` (one protocol × task: ListOps under the Nyströmformer protocol)."""
    return [
        "## The methods' claims",
        "",
        "Each comparison pairs completed on-protocol seeds of the current network by seed (`python -m "
        "lra_bench.compare`'s statistics); a claim about methods is read only with ≥ 2 paired seeds.",
        "",
        *spectral_claim(runs),
        *gpa_claim(runs),
        *pivoted_claim(runs),
        *locality_claim(runs),
    ]
