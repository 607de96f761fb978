"""`python -m lra_bench.reproductions`: `docs/reproductions.md` from the evidence `make reproduce` commits.

Variants: runs the table does not count (`reproductions/variants/<name>/…`, records saying `"variant": "<name>"`) —
of a network the protocol no longer computes, or of its network on another kernel path than the round's — stay
committed in a section of their own, never beside the published numbers, which count only the round's runs of the
current network. Their snapshots keep no checkpoints: the step and segments the last checkpoint held are in
`checkpoint.json`. A kernel-path variant's curves are held against the counted seeds'
(`lra_bench.reproduction_kernels`).

Why "leaves the prior" is recorded: the faithful ListOps schedule learns late and abruptly (a first attempt sat at
the class prior, val accuracy 0.16–0.19, until step ~2,200), so a run cut short, or a schedule shortened "to save
time", reports the prior. It is the first evaluation whose accuracy exceeds the validation set's majority-class
share by `PRIOR_MARGIN`.

Why the rank correlation of accuracy against output error waits for `MIN_ATTENTIONS` attentions: GPA's paper asserts
that better approximation gives better accuracy (a negative ρ), a claim about methods, and seeds of one attention
share its method. It counts only the attentions that compute or estimate softmax attention (`Attention.approximates`):
the error of one that stands for another operator (spectral's value mixer, Skyformer's unnormalised Gaussian kernel,
exact polynomial attention) against softmax is the distance between two operators, not an approximation error; its
rows are shown, marked †. Variants keep no checkpoints, so they have no approx.json.

`--check` fails when the committed page differs from the one rendered; the figures beside it are not compared
(fonts and library versions differ).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from lra_bench.kit.figures import pyplot, save_figure
from lra_bench.kit.markdown import table
from lra_bench.leaderboard.published import TASK_LABELS, load_published
from lra_bench.leaderboard.reproduced import MARGIN_PP, mean_and_interval, reproduction_verdict
from lra_bench.record.checkpoint_file import CHECKPOINT_DIR, LAST, META_KEY, load_checkpoint
from lra_bench.record.curves import VAL_ACC, evaluations
from lra_bench.registry import ATTENTIONS
from lra_bench.reproduce import KERNELS
from lra_bench.reproduction_approx import APPROX_FILE, EXACT
from lra_bench.reproduction_approx import output_error as approx_output_error
from lra_bench.reproduction_approx import read as read_approx
from lra_bench.reproduction_claims import claims_section, seeds_needed
from lra_bench.reproduction_cost import COST_FIGURE, cost_section, plot_cost
from lra_bench.reproduction_kernels import kernels_section
from lra_bench.reproduction_runs import EVIDENCE_ROOT as ROOT
from lra_bench.reproduction_runs import IN_PROGRESS, PRIOR_MARGIN, REPO, Run, recorded_run
from models.attention.base import SOFTMAX

PAGE = REPO / "docs" / "reproductions.md"
FIGURE_NAME = "reproductions_curves.png"
#: what `make reproduce` reproduces by default: its rows are shown even before a run exists
DEFAULT_TARGET = ("nystromformer", "listops")
MIN_ATTENTIONS = 3  # the distinct attentions a rank correlation of accuracy against approximation error needs
ALPHA = 0.05  # the p-value below which the page calls a rank correlation distinguishable from none
VARIANTS = "variants"  # reproductions/variants/<name>/…: runs the table does not count
SNAPSHOT_PROGRESS = "checkpoint.json"  # a variant snapshot's last checkpoint, read before the file was deleted
#: what a variant's runs are and why they are not counted, for its section (its folder's README.md says it in full)
VARIANT_TITLES = {
    "pre-fidelity": (
        "the network before it was matched to the reference code (mlpen/Nystromformer@5689313)",
        "They are another network than the protocol computes today: not counted beside the published rows above, "
        "with no verdict against them, and their snapshots cannot be resumed under today's network.",
    ),
    "fused-encoder": (
        "the protocol's network through the compiled encoder chain (`model.kernels=fused`)",
        f"The same network on another kernel path: not counted, since every seed of this round runs "
        f"`model.kernels={KERNELS}` so that its rows' step times compare; they show whether the path trains as the "
        "counted seeds do.",
    ),
}
UNKNOWN_VARIANT = ("another network than the protocol's current one", "They are not counted.")
CURVES_TITLE = "Every reproduction run (dashed: in progress)"


def collect(root: Path = ROOT) -> list[Run]:
    """Every run under `root/<protocol>/<task>/<attn>/seed-<s>/` (completed, or its `in-progress/` snapshot), then
    every variant's under `root/variants/<name>/<protocol>/<task>/<attn>/seed-<s>/`; each run's `variant` is its
    record's (a record naming a variant is that variant's wherever it lies), else its variant folder's name."""
    runs = [*_collect(root, None)]
    for folder in sorted(p for p in (root / VARIANTS).glob("*") if p.is_dir()):
        runs += _collect(folder, folder.name)
    return sorted(runs, key=lambda r: (r.variant or "", r.protocol, r.task, r.attn, r.seed))


def _collect(root: Path, variant: str | None) -> list[Run]:
    runs = []
    for seed_dir in sorted(root.glob("*/*/*/seed-*")):
        folder = seed_dir if (seed_dir / "results.json").exists() else seed_dir / IN_PROGRESS
        if not (folder / "results.json").exists() or seed_dir.parts[-4] == VARIANTS:
            continue
        run = recorded_run(seed_dir, folder, variant)
        accuracy = evaluations(folder)[VAL_ACC]
        run.curve = list(zip(accuracy.index.astype(int), accuracy.astype(float)))
        if folder.name == IN_PROGRESS:  # the snapshot's record is from its start: the checkpoint knows how far
            run.checkpoint_step, run.segments = snapshot_progress(folder / CHECKPOINT_DIR / LAST)
        runs.append(run)
    return runs


def snapshot_progress(last: Path) -> tuple[int | None, list[dict[str, Any]]]:
    """The step a snapshot's `last.ckpt` holds and its training segments (`lra_bench.record.checkpoint_file`);
    without the checkpoint, what `checkpoint.json` beside `checkpoints/` kept of it (a variant's snapshot)."""
    if not last.exists():
        kept = last.parent.parent / SNAPSHOT_PROGRESS
        if kept.exists():
            saved = json.loads(kept.read_text())
            return saved.get("global_step"), list(saved.get("segments") or [])
        return None, []
    checkpoint = load_checkpoint(last)
    return int(checkpoint.get("global_step", 0)), list((checkpoint.get(META_KEY) or {}).get("segments") or [])


def published_rows(protocol: str, task: str) -> dict[str, tuple[float, str]]:
    """attn → (published accuracy %, source label) for the protocol's own table."""
    out: dict[str, tuple[float, str]] = {}
    for row in load_published()[1]:
        score = row.scores.get(task)
        if row.protocol == protocol and isinstance(score, (int, float)):
            out.setdefault(row.attn, (float(score), row.source_label))
    return out


def _pct(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{100 * value:.{digits}f}"


def _seeds(runs: list[Run]) -> tuple[list[float], int]:
    """The completed runs' test accuracies (%) and how many runs are in progress."""
    done = [100 * r.test_acc for r in runs if r.completed and r.test_acc is not None]
    return done, sum(not r.completed for r in runs)


def _verdict(published: tuple[float, str] | None, done: list[float], running: int, attn: str) -> str:
    if published is None:
        return "—"
    if done:
        return reproduction_verdict(done, published[0])
    if running:
        return "in progress"
    return "not run yet" if attn in ATTENTIONS.names() else "no such attention here"


def summary_table(runs: list[Run], targets: Iterable[tuple[str, str]] = ()) -> list[str]:
    """One table per protocol × task (those of `runs`, and `targets` even without a run): each published row, and
    each attention with a run (a variant's too), beside our mean and interval over the completed on-protocol seeds
    of the current network (`Run.counted`), and the verdict."""
    lines = []
    for protocol, task in sorted({(r.protocol, r.task) for r in runs} | set(targets)):
        published = published_rows(protocol, task)
        group = [r for r in runs if (r.protocol, r.task) == (protocol, task)]
        source = next(iter(published.values()))[1] if published else "no published table"
        lines += [f"### {TASK_LABELS.get(task, task)}, protocol `{protocol}` ({source})", ""]
        body, completed, judged, learned = [], 0, 0, 0
        for attn in sorted({r.attn for r in group} | set(published)):
            mine = [r for r in group if r.attn == attn and r.counted]
            done, running = _seeds(mine)
            known = [r for r in mine if r.completed and r.test_acc is not None and r.prior is not None]
            left = sum(r.left_prior_at() is not None for r in known)
            completed, judged, learned = completed + len(done), judged + len(known), learned + left
            pub = published.get(attn)
            row = [attn, f"{pub[0]:.2f}" if pub else "—", mean_and_interval(done), f"{len(done)} / {running}"]
            body.append([*row, f"{left} of {len(known)}" if known else "—", _verdict(pub, done, running, attn)])
        if not completed:
            lines += ["No completed seed yet of the protocol's current network: no row has a number of ours.", ""]
        header = ["attention", "published", "ours: mean ± 95% CI (completed seeds)", "seeds done / in progress"]
        lines += [*table([*header, "left the prior", "verdict"], body), ""]
        lines += _learning_note(judged, learned)
    lines += [
        "GPA (the seed paper, ICLR 2026 submission 20651) claims the best LRA results among efficient methods but "
        "gives no ListOps number we have: its row has no published value and no verdict; it is compared with "
        "Nyströmformer below instead.",
        "",
    ]
    return lines


def _learning_note(judged: int, learned: int) -> list[str]:
    """Say so when some completed seeds never learned the task: their mean then mixes two outcomes (the class
    prior and a learned accuracy), and its interval is wide because of which seeds learned, not small noise.
    `judged`: the completed seeds whose record gives the prior."""
    if learned == judged:
        return []
    return [
        f"Of the {judged} completed seeds above, {judged - learned} never left the class prior (*left the "
        "prior*: see the runs below): under this protocol whether a seed learns the task at all varies from seed to "
        "seed, so a mean over two seeds can mix a learned run with an unlearned one and its interval then holds "
        "every published number — which is why such rows say *cannot tell*.",
        "",
    ]


def variant_table(runs: list[Run], variant: str) -> list[str]:
    """A variant's rows: mean and interval over its completed on-protocol seeds (on-protocol as the protocol was
    then), without the published number or a verdict — it is another network."""
    lines = []
    mine = [r for r in runs if r.variant == variant and r.record.get("off_protocol") is False]
    for protocol, task in sorted({(r.protocol, r.task) for r in mine}):
        group = [r for r in mine if (r.protocol, r.task) == (protocol, task)]
        body = []
        for attn in sorted({r.attn for r in group}):
            done, running = _seeds([r for r in group if r.attn == attn])
            body.append([attn, mean_and_interval(done), f"{len(done)} / {running}"])
        header = ["attention", f"variant `{variant}`: mean ± 95% CI (completed seeds)", "seeds done / in progress"]
        lines += [f"#### {TASK_LABELS.get(task, task)}, protocol `{protocol}` as it was", "", *table(header, body), ""]
    return lines or ["No on-protocol run in this variant.", ""]


def _best_val(r: Run) -> str:
    """The record's best val accuracy and its step; for a run in progress, the best point of its curve so far."""
    if r.completed:
        metrics = r.typed.metrics
        return f"{_pct(metrics.val_acc)} ({metrics.best_step})"
    best = max(r.curve, key=lambda p: p[1], default=None)
    return f"{_pct(best[1])} ({best[0]})" if best else "—"


def _machine(r: Run) -> str:
    hardware, runtime = r.typed.env_part("hardware"), r.typed.env_part("runtime")
    unit = f", {hardware['cpu_capability']}" if hardware.get("cpu_capability") else ""  # not in older records
    return f"{hardware.get('cpu', '?')} ({hardware.get('cpu_count', '?')} CPUs{unit}), {runtime.get('threads', '?')}"


def _wall(run: Run) -> str:
    seconds, known = run.wall()
    return f"{seconds / 3600:.2f} h" if known else f"≥ {seconds / 3600:.2f} h (an earlier attempt's end unrecorded)"


#: the table of every run: each column's header and its cell of a run
RUN_COLUMNS: tuple[tuple[str, Callable[[Run], Any]], ...] = (
    ("run", lambda r: r.name),
    ("status", lambda r: "completed" if r.completed else "in progress (snapshot)"),
    ("steps", lambda r: f"{r.steps}/{r.typed.run.planned_steps}"),
    ("test acc %", lambda r: _pct(r.test_acc)),
    ("best val % (step)", _best_val),
    ("left the prior at step", lambda r: r.left_prior_at() or "not yet"),
    ("precision", lambda r: r.typed.config_at("trainer.precision")),
    ("wall time", _wall),
    ("machine, threads", _machine),
    ("on protocol", lambda r: {False: "yes", True: "**no**", None: "unchecked"}[r.record.get("off_protocol")]),
    ("data", lambda r: r.origin),
)


def runs_table(runs: list[Run]) -> list[str]:
    if not runs:
        return ["No runs yet."]
    return table([name for name, _ in RUN_COLUMNS], [[cell(r) for _, cell in RUN_COLUMNS] for r in runs])


def comparison(
    root: Path, runs: list[Run], a: str = "gpa", b: str = "nystrom", targets: Iterable[tuple[str, str]] = ()
) -> list[str]:
    """`python -m lra_bench.compare attn=a attn=b --in <root/protocol/task>` on the completed runs, as printed
    (`runs`: one section's, all from `root`)."""
    lines = []
    for protocol, task in sorted({(r.protocol, r.task) for r in runs} | set(targets)):
        have = {
            x: [r for r in runs if (r.protocol, r.task, r.attn) == (protocol, task, x) and r.completed] for x in (a, b)
        }
        if not all(have.values()):
            lines += [
                f"`{a}` vs `{b}` on {task} ({protocol}): needs completed runs of both "
                f"(now {len(have[a])} and {len(have[b])}).",
                "",
            ]
            continue
        where = _shown(root / protocol / task)
        cmd = [sys.executable, "-m", "lra_bench.compare", f"attn={a}", f"attn={b}", "--in", where]
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
        lines += [f"`{' '.join(['python', *cmd[1:]])}`:", "", "```", (out.stdout or out.stderr).rstrip(), "```", ""]
        lines += [seeds_needed(have[a], have[b], a, b), ""]
    return lines


def _shown(path: Path) -> str:
    """`path` relative to the repository when it is inside it (as the page shows it), else as given."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def data_paragraph(runs: list[Run]) -> list[str]:
    """Which ListOps the runs used: the generator's trees of the release's distribution, not the release's test set
    (each record's `data.origin`)."""
    from tasks.listops import ListOpsConfig  # the task (torch): only when the page is rendered, not for --help

    cfg = ListOpsConfig()
    listops = [r for r in runs if r.task == "listops"]
    kinds = {kind: sum(r.origin == kind for r in listops) for kind in ("generated", "official", "unrecorded")}
    counts = ", ".join(f"{n} {kind}" for kind, n in kinds.items() if n) or "none yet"
    sizes = f"{cfg.gen_num_train:,}/{cfg.gen_num_val:,}/{cfg.gen_num_test:,}"
    said = (
        "The ListOps reproductions train and test on trees generated by `tasks.generate.listops` (the official "
        f"distribution, sizes {sizes} train/val/test, seed {cfg.gen_seed}), not on the LRA release's test set"
        if not kinds["official"]
        else "The ListOps reproductions are on two kinds of data: trees generated by `tasks.generate.listops` "
        f"(the official distribution, sizes {sizes}, seed {cfg.gen_seed}) and the LRA release's files"
    )
    return [
        "## Data",
        "",
        f"{said}, so a published number and ours are measured on different test sets of the same distribution. "
        "A record's `data.origin` says which (`generated`, with the generator's knobs, or `official`; the runs' "
        f"*data* column below). ListOps runs on this page by data origin: {counts}.",
        "",
    ]


def figure_name(variant: str | None) -> str:
    return FIGURE_NAME if variant is None else f"{Path(FIGURE_NAME).stem}_{variant}.png"


def render(root: Path = ROOT, figure: str | None = FIGURE_NAME) -> str:
    """The page: the current protocol's rows, runs, curves and comparison, then each variant's (not counted)."""
    runs = collect(root)
    faithful = [r for r in runs if r.variant is None]
    variants = sorted({r.variant for r in runs if r.variant})
    targets = {(r.protocol, r.task) for r in runs} | {DEFAULT_TARGET}
    lines = [
        "# Reproductions",
        "",
        "Generated by `python -m lra_bench.reproductions` from `reproductions/`, the evidence `make reproduce` "
        "commits (each run's `results.json`, `test_predictions.npz`, CSV metrics and `run.log`); do not edit by hand.",
        "",
        f"A published number is **reproduced** when the 95% t-interval of our on-protocol seeds (at least 2 "
        f"completed seeds) lies within the published number ± {MARGIN_PP:g} pp — the noise of a single published run "
        "on its test set "
        "(`lra_bench.leaderboard.reproduced`) — and **not reproduced** when it lies outside that interval; between "
        "the two, and with one seed, we cannot tell. Only runs of the protocol's own config (nothing "
        "but logistics overridden) and of its current network are counted: runs of an earlier network stay "
        "committed as a named variant (`reproductions/variants/<name>/`, their records say `variant`) and are shown "
        "in a section of their own below, never beside a published row.",
        "",
        *data_paragraph(runs),
        "## Beside the published rows",
        "",
        *summary_table(runs, targets),  # a variant's runs give their attention a row, never a count
        "## Every run",
        "",
        *runs_table(faithful),
        "",
        f"Left the prior: the first evaluation above the validation majority-class share + {PRIOR_MARGIN:.2f}. Wall "
        "time: the attempts that made the weights (killed steps that were re-run are not counted) plus the test. "
        "Data: the record's `data.origin`.",
        "",
    ]
    if figure and any(r.curve for r in faithful):
        lines += ["## Validation accuracy against step", "", f"![validation accuracy of every run]({figure})", ""]
    lines += ["## GPA against Nyströmformer", "", *comparison(root, faithful, targets=targets)]
    table_runs = [r for r in faithful if (r.protocol, r.task) == DEFAULT_TARGET]
    lines += cost_section(table_runs, figure and COST_FIGURE)
    lines += claims_section(table_runs)
    lines += approximation_section(faithful, variants)
    for variant in variants:
        lines += variant_section(root, [r for r in runs if r.variant == variant], variant, figure, faithful)
    return "\n".join(lines).rstrip() + "\n"


def rank_correlation(points: list[tuple[str, float, float]]) -> str:
    """Spearman's ρ of test accuracy against output error over (attention, accuracy, error) points, read honestly:
    only with runs of `MIN_ATTENTIONS` attentions or more; a verdict only when p < `ALPHA`, and then as an
    association across these runs, not as a cause."""
    n, attentions = len(points), len({a for a, _, _ in points})
    counted = f"n = {n} run{'s' * (n != 1)} of {attentions} attention{'s' * (attentions != 1)}"
    if attentions < MIN_ATTENTIONS:
        return (
            f"Rank correlation of test accuracy against output error: {counted}: too few to read a link (it needs "
            f"runs of at least {MIN_ATTENTIONS} attentions; no ρ is computed)."
        )
    from scipy.stats import spearmanr  # slow to import: only when there is a correlation to compute

    accs, errors = [p[1] for p in points], [p[2] for p in points]
    rho = p = math.nan
    if len(set(accs)) >= 2 and len(set(errors)) >= 2:
        result = spearmanr(accs, errors)
        rho, p = float(result.statistic), float(result.pvalue)
    if not math.isfinite(rho):
        return f"Spearman ρ of test accuracy against output error: undefined ({counted}: one of them does not vary)."
    said = f"Spearman ρ of test accuracy against output error = {rho:+.3f} ({counted}, two-sided p = {p:.3g})"
    if p >= ALPHA:
        reading = (
            f"p ≥ {ALPHA:g}: these runs do not distinguish the link from no link — no support for, and no evidence "
            "against, the claim that lower approximation error gives higher accuracy"
        )
    elif rho < 0:
        reading = (
            f"p < {ALPHA:g}: across these runs lower output error goes with higher test accuracy, as GPA's paper "
            "asserts — an association over these methods and seeds, not a proof that one causes the other"
        )
    else:
        reading = (
            f"p < {ALPHA:g}: across these runs higher output error goes with higher test accuracy — the opposite "
            "of what GPA's paper asserts"
        )
    shared = (
        f" The {n} runs are of {attentions} attentions: seeds of one attention share its method, so they are not "
        f"{n} independent methods."
        if n > attentions
        else ""
    )
    return f"{said}. {reading}.{shared}"


def _number(value: Any) -> str:
    if not isinstance(value, int | float):
        return "—"
    return f"{value:g}" if float(value).is_integer() else f"{value:.1f}"


def _budget(r: Run, data: dict[str, Any]) -> str:
    budget = (data.get("rank") or {}).get("budget_effective_median")
    return "none (full rank)" if budget is None or r.attn == EXACT else _number(budget)


def _probe(data: dict[str, Any]) -> str:
    probe = data.get("probe") or {}
    return f"{probe.get('sequences', '?')} × ≤ {probe.get('max_len', '?')} tokens"


def estimates_softmax(attn: str) -> bool:
    """Whether attention `attn` computes or estimates softmax attention (`Attention.approximates`), so that its
    error against softmax is an approximation error; an attention this checkout does not know counts as one."""
    return attn not in ATTENTIONS.names() or ATTENTIONS.get(attn).approximates == SOFTMAX


def _own(data: dict[str, Any]) -> str:
    """A † row's mark, with its error against the operator it stands for where its `approx.json` has one."""
    own = approx_output_error(data, "own_output_error")
    return " †" if own is None else f" † (own operator: {own:.4f})"


#: the approximation table: each column's header and its cell of a run and its `approx.json`
APPROX_COLUMNS: tuple[tuple[str, Callable[[Run, dict[str, Any]], Any]], ...] = (
    ("run", lambda r, _: r.name),
    ("attention", lambda r, _: r.attn),
    ("seed", lambda r, _: r.seed),
    ("test acc %", lambda r, _: _pct(r.test_acc)),
    (
        "output error",
        lambda r, d: (
            "0 (by definition)"
            if r.attn == EXACT
            else f"{approx_output_error(d):.4f}" + ("" if estimates_softmax(r.attn) else _own(d))
        ),
    ),
    ("rank of Â", lambda _, d: _number((d.get("rank") or {}).get("a_hat_numerical_median"))),
    ("rank budget", _budget),
    ("probe", lambda _, d: _probe(d)),
    ("checkpoint step", lambda _, d: (d.get("checkpoint") or {}).get("step", "?")),
)


def not_softmax_note(attns: Iterable[str]) -> list[str]:
    """The † line under the approximation table: what each of `attns` that is no estimate of softmax stands for."""
    others = sorted({a for a in attns if not estimates_softmax(a)})
    stands = "; ".join(f"{a}: {ATTENTIONS.get(a).approximates}" for a in others)
    note = (
        f"† Not an estimate of softmax attention ({stands}): its error against softmax is the distance between two "
        "operators, not an approximation error, so its runs are not in the correlation below; *own operator*: its "
        "error against the operator it stands for, where the study measured one."
    )
    return [note, ""] if others else []


def approximation_section(runs: list[Run], variants: Iterable[str] = ()) -> list[str]:
    """Accuracy beside approximation error for every completed on-protocol run of the current network with an
    `approx.json`; the rank correlation across them, read honestly; which completed runs lack the file."""
    have, missing = [], []
    for r in (r for r in runs if r.counted and r.completed):
        data = read_approx(r.folder)
        if data is not None and approx_output_error(data) is not None and r.test_acc is not None:
            have.append((r, data))
        else:
            missing.append(r)
    lines = [
        "## Approximation quality and accuracy",
        "",
        "GPA's paper asserts that \"superior approximation quality translates directly to improved downstream "
        'performance". For each completed run, `approx.json` beside its evidence holds the approximation study of '
        "its best-val checkpoint (`python -m lra_bench.reproduce --approx-only …`, made by `make reproduce` when "
        "the run completes): each layer and head's own trained attention Â against exact softmax attention A on the "
        "same inputs of a small fixed probe of validation sequences (the file says which), fp64. *Output error*: "
        "the mean over sequences, layers and heads of ‖(A − Â)V‖_F / ‖AV‖_F; *rank of Â*: the median numerical "
        "rank (σ_i > 10⁻³·σ_1), beside the effective rank budget the method spent. Full attention's error is 0 by "
        "definition (Â = A).",
        "",
    ]
    if have:
        have.sort(key=lambda x: (x[0].protocol, x[0].task, x[0].attn, x[0].seed))
        body = [[cell(r, data) for _, cell in APPROX_COLUMNS] for r, data in have]
        lines += [*table([name for name, _ in APPROX_COLUMNS], body), ""]
        lines += not_softmax_note(r.attn for r, _ in have)
        points = [
            (r.attn, 100 * float(r.test_acc or 0.0), float(approx_output_error(d) or 0.0))
            for r, d in have
            if estimates_softmax(r.attn)
        ]
        lines += [rank_correlation(points), ""]
    else:
        lines += [
            "No completed run of the protocol's current network has an `approx.json` yet: nothing to set accuracy "
            "against. " + rank_correlation([]),
            "",
        ]
    if missing:
        names = ", ".join(f"`{r.name}`" for r in missing)
        lines += [
            f"Completed runs without `{APPROX_FILE}` (the study failed or was not run; not in the table or the "
            f"correlation): {names}. `python -m lra_bench.reproduce --approx-only --task <t> --attn <a> --seed <s>` "
            "makes it while the run's work folder still holds its best-val checkpoint.",
            "",
        ]
    if variants:
        said = ", ".join(f"`{v}`" for v in variants)
        lines += [
            f"The variants' runs ({said}, below) kept no checkpoints, so they have no approximation study and are not "
            "in this section.",
            "",
        ]
    return lines


def variant_section(
    root: Path, runs: list[Run], variant: str, figure: str | None, faithful: Sequence[Run] = ()
) -> list[str]:
    """A variant's rows, runs, curves and comparison, labelled as not counted; a kernel path's curves against the
    counted seeds of the current network (`faithful`)."""
    folder = root / VARIANTS / variant
    readme = folder / "README.md"
    where = _shown(folder)
    said = f" (see [its README](../{where}/README.md))" if readme.exists() and where != str(folder) else ""
    title, why = VARIANT_TITLES.get(variant, UNKNOWN_VARIANT)
    lines = [
        f"## Variant: {variant} (not counted)",
        "",
        f"Runs of {title}, kept in `{where}/`{said}. {why}",
        "",
        f"### Its rows (variant `{variant}`, not compared with the published numbers)",
        "",
        *variant_table(runs, variant),
        f"### Its runs (variant `{variant}`)",
        "",
        *runs_table(runs),
        "",
    ]
    if figure and any(r.curve for r in runs):
        name = figure_name(variant)
        lines += [f"### Validation accuracy against step (variant `{variant}`)", "", f"![{variant} runs]({name})", ""]
    lines += kernels_section(runs, faithful)
    if {"gpa", "nystrom"} <= {r.attn for r in runs}:
        lines += [f"### GPA against Nyströmformer (variant `{variant}`, within the variant)", ""]
        lines += comparison(folder, runs)
    return lines


def plot(runs: list[Run], path: Path, title: str = CURVES_TITLE) -> None:
    """Every run's validation curve. The legend sits beside the axes, never over a curve (inside, in any corner, it
    hid the curves that reach there); a column of it per 20 runs keeps it within the figure's height, and the
    figure widens by a column's width, so the axes keep their size."""
    plt = pyplot()

    rows_per_column = 20
    columns = max(1, math.ceil(sum(1 for r in runs if r.curve) / rows_per_column))
    fig, ax = plt.subplots(figsize=(6.5 + 2.6 * columns, 4.5))
    for r in runs:
        if r.curve:
            steps, accs = zip(*r.curve)
            style = "-" if r.completed else "--"
            ax.plot(steps, [100 * a for a in accs], style, label=f"{r.attn} seed {r.seed} ({r.task}, {r.protocol})")
    ax.set_xlabel("training step")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if any(r.curve for r in runs):
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, ncols=columns)
    save_figure(fig, path)


def write_figures(runs: list[Run], folder: Path) -> list[Path]:
    """One figure per section with curves (the current protocol's, each variant's); a section without curves gets
    none, and a stale figure of it is removed (the page does not show it)."""
    written = []
    for variant in [None, *sorted({r.variant for r in runs if r.variant})]:
        section = [r for r in runs if r.variant == variant]
        path = folder / figure_name(variant)
        if not any(r.curve for r in section):
            path.unlink(missing_ok=True)
            continue
        plot(section, path, CURVES_TITLE + ("" if variant is None else f" — variant {variant}, not counted"))
        written.append(path)
    faithful = [r for r in runs if r.variant is None and (r.protocol, r.task) == DEFAULT_TARGET]
    cost = plot_cost(faithful, folder / COST_FIGURE)
    return [*written, *([cost] if cost else [])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--out", type=Path, default=PAGE)
    parser.add_argument("--check", action="store_true", help="fail when the committed page differs")
    args = parser.parse_args(argv)
    text = render(args.root)
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            print(f"{args.out} is out of date: run python -m lra_bench.reproductions", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    figures = write_figures(collect(args.root), args.out.parent)
    print(f"wrote {args.out}" + "".join(f" and {p}" for p in figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
