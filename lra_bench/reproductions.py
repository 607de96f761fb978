"""`python -m lra_bench.reproductions`: `docs/reproductions.md` from the evidence `make reproduce` commits.

One row per protocol × task × attention beside the published number (`lra_bench.leaderboard.published`): our mean
and 95% t-interval over the completed seeds, and whether that reproduces the published value
(`lra_bench.leaderboard.reproduced`). Then every run — completed or in progress — with its steps, test accuracy,
best validation step, the step where it left the class prior, precision, wall time, machine and threads; the
validation-accuracy curve of every run in one figure; and, when both sides have completed seeds, what
`python -m lra_bench.compare attn=gpa attn=nystrom` says about them.

Why "leaves the prior" is recorded: the faithful ListOps schedule learns late and abruptly (a first attempt sat at
the class prior, val accuracy 0.16–0.19, until step ~2,200), so a run cut short, or a schedule shortened "to save
time", reports the prior. It is the first evaluation whose accuracy exceeds the validation set's majority-class
share by `PRIOR_MARGIN`.

`--check` regenerates the page in memory and fails when the committed one differs (CI runs it through the tests).
The figure is written next to the page; it is not compared byte for byte (fonts and library versions differ).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lra_bench.leaderboard.published import TASK_LABELS, load_published
from lra_bench.leaderboard.reproduced import reproduction_interval, reproduction_verdict
from lra_bench.registry import ATTENTIONS
from lra_bench.reports.figures import save_figure
from lra_bench.reports.markdown import table
from lra_bench.reproduce import EVIDENCE_ROOT as ROOT
from lra_bench.reproduce import IN_PROGRESS, REPO
from lra_bench.stats.power import seeds_per_arm

PAGE = REPO / "docs" / "reproductions.md"
FIGURE_NAME = "reproductions_curves.png"
DIFFERENCE_PP = 1.0  # the gap the page sizes seeds for: about the spread of the published ListOps rows
PRIOR_MARGIN = 0.05  # val accuracy above the majority-class share that counts as having left the prior


@dataclass
class Run:
    protocol: str
    task: str
    attn: str
    seed: int
    record: dict[str, Any]
    folder: Path
    curve: list[tuple[int, float]] = field(default_factory=list)
    checkpoint_step: int | None = None  # an in-progress snapshot: the step its last.ckpt holds
    segments: list[dict[str, Any]] = field(default_factory=list)  # the training attempts (record, or checkpoint)

    @property
    def completed(self) -> bool:
        return self.record.get("status") == "completed" and self.folder.name != IN_PROGRESS

    @property
    def steps(self) -> int:
        done = self.record["metrics"].get("train_steps")
        if done is not None:
            return int(done)
        return self.checkpoint_step if self.checkpoint_step is not None else max((s for s, _ in self.curve), default=0)

    @property
    def test_acc(self) -> float | None:
        value = self.record["metrics"].get("test_acc")
        return float(value) if value is not None else None

    def left_prior_at(self) -> int | None:
        prior = (self.record.get("data") or {}).get("majority_share")
        if prior is None:
            return None
        return next((step for step, acc in self.curve if acc > prior + PRIOR_MARGIN), None)

    def wall(self) -> tuple[float, bool]:
        """Seconds the attempts that made the weights ran — each segment from its start to its last checkpoint
        (`saved_at`), the last one to the record's end — plus the test of a completed run; and whether every
        segment's end is known (segments written before `saved_at` existed are left out: the time between two
        attempts is no attempt's)."""
        segments, finished = self.segments, self.record["run"].get("finished_at")
        total, known = 0.0, True
        for i, seg in enumerate(segments):
            last = i + 1 == len(segments)
            end = finished if last and (self.completed or not seg.get("saved_at")) else seg.get("saved_at")
            if end is None:
                known = False
                continue
            total += (_time(end) - _time(seg["started_at"])).total_seconds()
        return total, known and bool(segments)

    def wall_s(self) -> float | None:
        """`wall()`'s seconds when every segment's end is known, else None."""
        seconds, known = self.wall()
        return seconds if known else None


def _time(stamp: str) -> dt.datetime:
    return dt.datetime.fromisoformat(stamp)


def read_curve(folder: Path) -> list[tuple[int, float]]:
    """(step, val accuracy) of every evaluation in the run's CSV metrics (later attempts win on a repeated step)."""
    points: dict[int, float] = {}
    for path in sorted(folder.glob("csv/version_*/metrics.csv"), key=lambda p: int(p.parent.name.split("_")[1])):
        with open(path, newline="") as fh:
            for row in csv.DictReader(fh):
                if row.get("val/acc"):
                    points[int(row["step"]) + 1] = float(row["val/acc"])  # Lightning logs the step before it
    return sorted(points.items())


def collect(root: Path = ROOT) -> list[Run]:
    """Every run under `root/<protocol>/<task>/<attn>/seed-<s>/` (completed, or its `in-progress/` snapshot)."""
    runs = []
    for seed_dir in sorted(root.glob("*/*/*/seed-*")):
        folder = seed_dir if (seed_dir / "results.json").exists() else seed_dir / IN_PROGRESS
        if not (folder / "results.json").exists():
            continue
        protocol, task, attn = seed_dir.parts[-4:-1]
        record = json.loads((folder / "results.json").read_text())
        run = Run(protocol, task, attn, int(seed_dir.name.split("-")[1]), record, folder, read_curve(folder))
        run.segments = record["run"].get("segments") or []
        if folder.name == IN_PROGRESS:  # the snapshot's record is from its start: the checkpoint knows how far
            run.checkpoint_step, run.segments = snapshot_progress(folder / "checkpoints" / "last.ckpt")
        runs.append(run)
    return sorted(runs, key=lambda r: (r.protocol, r.task, r.attn, r.seed))


def snapshot_progress(last: Path) -> tuple[int | None, list[dict[str, Any]]]:
    """The step a snapshot's `last.ckpt` holds and its training segments (`lra_bench.run.checkpoint_identity`)."""
    from lra_bench.run.checkpoint_identity import META_KEY
    from lra_bench.run.checkpointing import load_checkpoint

    if not last.exists():
        return None, []
    checkpoint = load_checkpoint(last)
    return int(checkpoint.get("global_step", 0)), list((checkpoint.get(META_KEY) or {}).get("segments") or [])


def published_rows(protocol: str, task: str) -> dict[str, tuple[float, str]]:
    """attn → (published accuracy %, source label) for the protocol's own table."""
    _, rows = load_published()
    out: dict[str, tuple[float, str]] = {}
    for row in rows:
        score = row.scores.get(task)
        if row.protocol == protocol and isinstance(score, (int, float)):
            out.setdefault(row.attn, (float(score), row.source_label))
    return out


def _pct(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{100 * value:.{digits}f}"


def _wall(run: Run) -> str:
    seconds, known = run.wall()
    return f"{seconds / 3600:.2f} h" if known else f"≥ {seconds / 3600:.2f} h (an earlier attempt's end unrecorded)"


def summary_table(runs: list[Run]) -> list[str]:
    lines = []
    for protocol, task in sorted({(r.protocol, r.task) for r in runs}):
        published = published_rows(protocol, task)
        group = [r for r in runs if (r.protocol, r.task) == (protocol, task)]
        source = next(iter(published.values()))[1] if published else "no published table"
        lines += [f"### {TASK_LABELS.get(task, task)}, protocol `{protocol}` ({source})", ""]
        body = []
        for attn in sorted({r.attn for r in group} | set(published)):
            mine = [r for r in group if r.attn == attn and r.record.get("off_protocol") is False]  # never a trial
            done = [r.test_acc * 100 for r in mine if r.completed and r.test_acc is not None]
            pub = published.get(attn)
            ours = "—"
            if done:
                interval = reproduction_interval(done)
                ours = f"{sum(done) / len(done):.2f}" + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")
            running = sum(not r.completed for r in mine)
            verdict = (
                "—"
                if not pub
                else reproduction_verdict(done, pub[0])
                if done
                else "in progress"
                if running
                else "not run yet"
                if attn in ATTENTIONS.names()
                else "no such attention here"
            )
            body.append([attn, f"{pub[0]:.2f}" if pub else "—", ours, f"{len(done)} / {running}", verdict])
        header = ["attention", "published", "ours: mean ± 95% CI (completed seeds)", "seeds done / in progress"]
        lines += [*table([*header, "verdict"], body), ""]
    lines += [
        "GPA (the seed paper, ICLR 2026 submission 20651) claims the best LRA results among efficient methods but "
        "gives no ListOps number we have: its row has no published value and no verdict; it is compared with "
        "Nyströmformer below instead.",
        "",
    ]
    return lines


RUNS_HEADER = (
    "run",
    "status",
    "steps",
    "test acc %",
    "best val % (step)",
    "left the prior at step",
    "precision",
    "wall time",
    "machine, threads",
    "on protocol",
)


def runs_table(runs: list[Run]) -> list[str]:
    body = []
    for r in runs:
        metrics, env = r.record["metrics"], r.record.get("env") or {}
        planned = r.record["run"].get("planned_steps")
        best_val = max(r.curve, key=lambda p: p[1]) if r.curve else None
        best = (
            f"{_pct(metrics.get('val_acc'))} ({metrics.get('best_step')})"
            if r.completed
            else (f"{_pct(best_val[1])} ({best_val[0]})" if best_val else "—")
        )
        hardware, runtime = env.get("hardware") or {}, env.get("runtime") or {}
        unit = f", {hardware['cpu_capability']}" if hardware.get("cpu_capability") else ""  # not in older records
        cpus = f"{hardware.get('cpu_count', '?')} CPUs{unit}"
        machine = f"{hardware.get('cpu', '?')} ({cpus}), {runtime.get('threads', '?')}"
        on = {False: "yes", True: "**no**", None: "unchecked"}[r.record.get("off_protocol")]
        status = "completed" if r.completed else "in progress (snapshot)"
        body.append(
            [
                f"{r.protocol}/{r.task}/{r.attn}/seed-{r.seed}",
                status,
                f"{r.steps}/{planned}",
                _pct(r.test_acc),
                best,
                r.left_prior_at() or "not yet",
                r.record["config"]["trainer"].get("precision"),
                _wall(r),
                machine,
                on,
            ]
        )
    return table(RUNS_HEADER, body)


def comparison(root: Path, runs: list[Run], a: str = "gpa", b: str = "nystrom") -> list[str]:
    """`python -m lra_bench.compare attn=a attn=b --in <protocol/task>` on the completed runs, as printed."""
    lines = []
    for protocol, task in sorted({(r.protocol, r.task) for r in runs}):
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
        cmd = [
            sys.executable,
            "-m",
            "lra_bench.compare",
            f"attn={a}",
            f"attn={b}",
            "--in",
            str((root / protocol / task).relative_to(REPO) if root.is_relative_to(REPO) else root / protocol / task),
        ]
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
        lines += [f"`{' '.join(['python', *cmd[1:]])}`:", "", "```", (out.stdout or out.stderr).rstrip(), "```", ""]
        lines += [seeds_needed(have[a], have[b], a, b), ""]
    return lines


def seeds_needed(runs_a: list[Run], runs_b: list[Run], a: str, b: str, difference_pp: float = DIFFERENCE_PP) -> str:
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


def render(root: Path = ROOT, figure: str | None = FIGURE_NAME) -> str:
    runs = collect(root)
    lines = [
        "# Reproductions",
        "",
        "Generated by `python -m lra_bench.reproductions` from `reproductions/`, the evidence `make reproduce` "
        "commits (each run's `results.json`, `test_predictions.npz`, CSV metrics and `run.log`); do not edit by hand.",
        "",
        "A published number is **reproduced** when it lies inside the 95% t-interval of our on-protocol seeds "
        "(at least 2 completed seeds); with one seed we cannot tell. Only runs of the protocol's own config (nothing "
        "but logistics overridden) are counted.",
        "",
        "## Beside the published rows",
        "",
        *(summary_table(runs) if runs else ["No runs yet.", ""]),
        "## Every run",
        "",
        *runs_table(runs),
        "",
        f"Left the prior: the first evaluation above the validation majority-class share + {PRIOR_MARGIN:.2f}. Wall "
        "time: the attempts that made the weights (killed steps that were re-run are not counted) plus the test.",
        "",
    ]
    if figure and runs:
        lines += ["## Validation accuracy against step", "", f"![validation accuracy of every run]({figure})", ""]
    lines += ["## GPA against Nyströmformer", "", *comparison(root, runs)]
    return "\n".join(lines).rstrip() + "\n"


def plot(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in runs:
        if r.curve:
            steps, accs = zip(*r.curve)
            style = "-" if r.completed else "--"
            ax.plot(steps, [100 * a for a in accs], style, label=f"{r.attn} seed {r.seed} ({r.task}, {r.protocol})")
    ax.set_xlabel("training step")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title("Every reproduction run (dashed: in progress)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    save_figure(fig, path)


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
    plot(collect(args.root), args.out.parent / FIGURE_NAME)
    print(f"wrote {args.out} and {args.out.parent / FIGURE_NAME}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
