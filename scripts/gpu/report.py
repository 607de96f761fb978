"""The GPU check's verdicts and report: scripts/gpu/check.sh runs the stages, this reads what they left.

Why Python beside the bash: a stage's verdict needs its files read (run records, junit XML, CSV metrics, bench
JSON), and the report is rewritten atomically after every stage, so a check stopped at any moment leaves a
complete report of what ran. `render` turns the exit codes check.sh recorded in WORK/stages.tsv (0 passed, 124 or
137 `timeout` stopped it, else failed) and each stage's files into report.json and report.md; `env` records the
device and versions. The ListOps table puts each run beside the published Nyströmformer Table 3 number.

The harness (and torch) is imported inside the stage that reads its files, never at the top: the report is
rendered after every stage, the first of which (`wheels`) installs the packages the harness needs, and a node where
that failed still gets its report.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TIMED_OUT = (124, 137)  # `timeout`: SIGTERM at the budget; SIGKILL after the grace period
CURVE_KEYS = ("step", "val/acc", "val/loss", "train/loss", "train/acc")
SETTINGS = (
    "Each run: `{}` (one seed). The three runs shared the device, concurrently with the gpu_tests, fast_tier and "
    "bf16_smoke stages, so their step times include that contention. Test accuracy is that of the best-val "
    "checkpoint; a run stopped by the budget shows its best validation so far and no test."
)
Stage = dict[str, Any]


def load(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def metrics(run_dir: Path) -> list[dict[str, str]]:
    """The rows of a run's CSV logger (Lightning writes csv/version_<k>/metrics.csv)."""
    files = sorted(run_dir.glob("csv/version_*/metrics.csv"))
    return list(csv.DictReader(files[-1].open())) if files else []


def series(run_dir: Path, key: str) -> list[tuple[int, float]]:
    return [(int(float(r["step"] or 0)), float(r[key])) for r in metrics(run_dir) if r.get(key)]


class Judge:
    """`stage_<name>(s)` refines a finished stage from its files: `s` arrives with the status and summary its exit
    code implies and leaves with the stage's own verdict, summary and details."""

    def __init__(self, work: Path, out: Path, data: dict[str, Any]) -> None:
        self.work, self.out, self.data = work, out, data
        self.rc = {p.name: [int(x) for x in p.read_text().split()] for p in (work / "rc").glob("*")}
        listed = (work / "commands.tsv").read_text().splitlines() if (work / "commands.tsv").exists() else []
        self.commands = dict(line.split("\t", 1) for line in listed)
        self.runs = {k[8:]: self.run(k[8:]) for k in self.commands if k.startswith("listops-") and k in self.rc}

    def log(self, label: str, lines: int = 30) -> str:
        path = self.work / "log" / f"{label}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def run(self, attn: str) -> dict[str, Any]:
        """A ListOps run from its record; stopped early, with the best validation its CSV holds."""
        from lra_bench.record.reader import typed  # a record read as the harness reads it (inside: module docstring)

        code, ms = self.rc[f"listops-{attn}"]
        run_dir = self.work / "runs" / "listops" / attn / attn
        record = load(run_dir / "results.json") or {}
        read = typed(record)
        m = read.metrics
        best = max(series(run_dir, "val/acc"), key=lambda sv: sv[1], default=(None, None))
        status = record.get("status") or "no record"
        if code in TIMED_OUT and status in ("running", "no record"):  # killed before it could record the stop
            status = f"stopped by the budget ({status})"
        return {
            "status": status, "error": record.get("error"), "exit": code, "wall_s": round(ms / 1e3, 1),
            "steps": m.train_steps or max((s for s, _ in series(run_dir, "train/loss")), default=None),
            "max_steps": read.config_at("trainer.max_steps"), "precision": read.config_at("trainer.precision"),
            "val_acc": best[1] if m.val_acc is None else m.val_acc,
            "best_step": best[0] if m.best_step is None else m.best_step, "test_acc": m.test_acc,
            "step_time_median_s": m.step_time_median_s, "peak_memory_mib": m.peak_memory_mib,
            "run_dir": str(run_dir),
        }  # fmt: skip

    def stage_env(self, s: Stage) -> None:
        env = load(self.work / "env.json") or {}
        self.data.update(env=env, hardware=env.get("hardware_line"))
        s["summary"] = env.get("hardware_line", s["summary"])
        if self.data["mode"] == "gpu" and "device" not in env:
            s["status"], s["summary"] = "failed", "GPU mode but torch sees no CUDA device"

    def stage_listops_data(self, s: Stage) -> None:
        text = self.log("listops_data", 10**6)  # `prepare --json` prints its summary after the generator's lines
        summary = json.JSONDecoder().raw_decode(text[text.index("\n{") + 1 :])[0] if "\n{" in text else {}
        s["details"]["splits"] = {k: v["count"] for k, v in (summary.get("splits") or {}).items()}
        s["details"]["cache"] = summary.get("cache")
        if s["status"] == "passed":
            s["summary"] = f"{'/'.join(map(str, s['details']['splits'].values()))} trees in {s['seconds']:.0f} s"

    def stage_listops_train(self, s: Stage) -> None:
        s["details"]["runs"] = self.runs
        s["log_tail"] = "\n".join(f"--- {a}\n{self.log(f'listops-{a}', 12)}" for a in self.runs)
        if all(r["status"] == "completed" for r in self.runs.values()):
            s["status"] = "passed"
        elif any(r["exit"] in TIMED_OUT for r in self.runs.values()):
            s["status"] = "timeout"
        else:
            s["status"] = "failed"
        s["summary"] = ", ".join(f"{a}: {r['status']} at step {r['steps']}" for a, r in self.runs.items())

    def stage_fast_tier(self, s: Stage) -> int:
        """pytest's junit XML: totals and failing ids into the details; returns how many tests ran (not skipped)."""
        path, keys = self.work / f"junit_{s['name']}.xml", ("tests", "failures", "errors", "skipped")
        root = ET.parse(path).getroot() if path.exists() else ET.Element("testsuites")
        counts = {k: sum(int(suite.get(k, 0)) for suite in root.iter("testsuite")) for k in keys}
        bad = [c for c in root.iter("testcase") if c.find("failure") is not None or c.find("error") is not None]
        failed = [f"{c.get('classname')}::{c.get('name')}" for c in bad]
        s["details"].update(counts, failed=failed, device="cuda" if "device" in self.data["env"] else "cpu")
        ran = counts["tests"] - counts["skipped"]
        if s["status"] == "passed":
            s["summary"] = f"{ran} passed, {counts['skipped']} skipped ({s['details']['device']})"
        elif failed:
            s["summary"] = f"{len(failed)} failed: {', '.join(failed[:6])}"
        return ran

    def stage_gpu_tests(self, s: Stage) -> None:
        if self.stage_fast_tier(s) == 0 and s["status"] == "passed":  # all skipped: expected only without a device
            cuda = "device" in self.data["env"]
            s["status"] = "failed" if cuda else "skipped"
            s["summary"] = f"all {s['details']['skipped']} gpu tests skipped" + (" on a CUDA machine" if cuda else "")

    def stage_bf16_smoke(self, s: Stage) -> None:
        """Each attention's record: completed, every planned step, in bf16-mixed, every logged loss finite."""
        from lra_bench.record.reader import typed  # (inside: see the module docstring)

        results = {}
        for path in sorted((self.work / "smoke").rglob("results.json")):
            record, losses = load(path), [v for _, v in series(path.parent, "train/loss")]
            read = typed(record)
            steps, precision = read.metrics.train_steps, read.config_at("trainer.precision")
            checks = {
                f"status {record.get('status')}: {record.get('error')}": record.get("status") == "completed",
                f"{steps} steps": steps == read.config_at("trainer.max_steps"),
                f"train/loss not all finite: {losses[:5]}": bool(losses) and all(map(math.isfinite, losses)),
                f"precision {precision}": precision == "bf16-mixed",
            }
            problems = [text for text, ok in checks.items() if not ok]
            results[record.get("attn")] = {"ok": not problems, "problems": problems, "last_loss": losses[-1:]}
        s["details"]["attentions"] = results
        attns = sorted(p.stem for p in (REPO / "conf" / "attn").glob("*.yaml"))  # what check.sh passed as attn=
        missing, bad = [a for a in attns if a not in results], [a for a, r in results.items() if not r["ok"]]
        if missing or bad:
            s["status"] = "timeout" if s["status"] == "timeout" else "failed"
            s["summary"] = f"not run: {', '.join(missing) or '—'}; failed: {', '.join(bad) or '—'}"
        elif s["status"] == "passed":
            s["summary"] = f"{len(results)} attentions trained in bf16-mixed with finite loss (fp32: tests/test_gpu.py)"

    def stage_bench_bfloat16(self, s: Stage, dtype: str = "bfloat16") -> None:
        data = load(self.out / f"bench_{dtype}.json")
        if data is None:
            return
        from lra_bench.bench.report import render_markdown  # (inside: see the module docstring)

        self.data["sections"][f"Attention benchmark on the device, {dtype}"] = render_markdown(data, h="###")
        rows = data["rows"]
        bad = [f"{r['label']} n={r['n']} {r['mode']}: {r['status']} {r.get('error') or ''}".strip()
               for r in rows if r["status"] not in ("ok", "skipped")]  # fmt: skip
        skipped, ns = sum(r["status"] == "skipped" for r in rows), sorted({r["n"] for r in rows})
        s["details"].update(rows=len(rows), not_ok=bad[:20])
        s["summary"] = (
            f"{len(rows) - len(bad) - skipped}/{len(rows)} rows ok, {skipped} over budget, n {ns[0]}…{ns[-1]}"
        )
        if bad:
            s["status"], s["summary"] = "failed", f"{s['summary']}; {len(bad)} failed: {bad[0]}"

    def stage_bench_float32(self, s: Stage) -> None:
        self.stage_bench_bfloat16(s, "float32")

    def stage_train_step(self, s: Stage) -> None:
        data = load(self.out / "train_step.json")
        if data is None:
            return
        from lra_bench.bench.step import StepTiming, markdown  # imports torch: only once this stage has run

        rows = [StepTiming(**row) for row in data["rows"]]
        title = "The faithful training step against the matmul limit"
        self.data["sections"][title] = "\n".join([data["title"], "", *markdown(rows)])
        s["summary"] = ", ".join(f"{r.attn} {r.precision} {r.step_s:.3f} s/step ({r.ratio:.2f}× limit)" for r in rows)

    def stage_table(self, s: Stage) -> None:
        rows = self.data["listops"]["rows"]
        s["details"]["leaderboard"] = self.log("table", 6) or s["summary"]  # the harness's own reader of the runs
        if not rows:
            s["status"], s["summary"] = "skipped", "no ListOps run to tabulate"
        elif s["status"] == "passed":
            beside = ", ".join(f"{r['published_model']} {r['published']:.2f}" for r in rows if r["published"])
            s["summary"] = f"{sum(r['test_acc'] is not None for r in rows)}/{len(rows)} runs with a test accuracy; "
            s["summary"] += f"published: {beside}"

    def listops_rows(self) -> list[dict[str, Any]]:
        """The ListOps runs beside the published Nyströmformer Table 3 number of their attention."""
        if not self.runs:
            return []  # (and pandas, under the leaderboard's import, not loaded for nothing)
        from lra_bench.leaderboard.published import load_published
        from lra_bench.record.table import as_percent  # (inside: see the module docstring)

        pub = {r.attn: r for r in load_published()[1] if r.source == "nystromformer_t3" and r.scores.get("listops")}
        return [{
            "attn": a, "status": r["status"], "steps": r["steps"], "max_steps": r["max_steps"],
            "val_acc": as_percent(r["val_acc"]), "best_step": r["best_step"], "test_acc": as_percent(r["test_acc"]),
            "published": float(pub[a].scores["listops"]) if a in pub else None,
            "published_model": pub[a].model if a in pub else None,
            "step_ms": 1e3 * r["step_time_median_s"] if r["step_time_median_s"] else None,
            "peak_mib": r["peak_memory_mib"], "wall_s": r["wall_s"],
        } for a, r in self.runs.items()]  # fmt: skip


def fmt(value: Any, spec: str = ".2f") -> str:
    return "—" if value is None else format(value, spec)


def listops_table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| attention | status | steps | best val acc % (step) | test acc % | published test acc % "
           "| Δ test − published | median step ms | peak GPU/RSS MiB | wall s |", "|---" * 10 + "|"]  # fmt: skip
    for r in rows:
        pub = f"{r['published']:.2f} ({r['published_model']})" if r["published"] is not None else "— (none published)"
        delta = r["test_acc"] - r["published"] if r["published"] is not None and r["test_acc"] is not None else None
        best = f"{fmt(r['val_acc'])} ({fmt(r['best_step'], 'd')})" if r["val_acc"] is not None else "—"
        out.append(
            f"| `{r['attn']}` | {r['status']} | {fmt(r['steps'], 'd')}/{fmt(r['max_steps'], 'd')} | {best} "
            f"| {fmt(r['test_acc'])} | {pub} | {fmt(delta, '+.2f')} | {fmt(r['step_ms'], '.1f')} "
            f"| {fmt(r['peak_mib'], '.0f')} | {fmt(r['wall_s'], '.0f')} |"
        )
    return out


def markdown(data: dict[str, Any]) -> str:
    """report.md: what ran and how it ended, the ListOps row, the bench and step tables, the failures' output."""
    lines = [
        f"# GPU check — {data['mode']} mode", "", f"- hardware: {data['hardware'] or 'not read yet'}",
        f"- command: `{data['command']}`; git commit `{data['env'].get('git_commit')}`",
        f"- {'finished' if data['finished'] else 'NOT finished (partial report)'} {data['updated_at']}: "
        f"{data['elapsed_s']:.0f} s of the {data['budget_s']:.0f} s budget; load average (1/5/15 min) at the "
        f"start {data['load_average']['start']}, at the end {data['load_average'].get('end')}",
        "", "## Stages", "", "| stage | status | seconds | budget s | summary |", "|---|---|---|---|---|",
        *(f"| {s['name']} | **{s['status']}** | {fmt(s['seconds'], '.1f')} | {s['budget_s']:.0f} | "
          f"{s['summary'].replace('|', '/')} |" for s in data["stages"]),
        "", "## ListOps, Nyströmformer protocol (published: Xiong et al. 2021, Table 3)", "",
        *listops_table(data["listops"]["rows"]), "", data["listops"]["settings"],
    ]  # fmt: skip
    for title, body in data["sections"].items():
        lines += ["", f"## {title}", "", body]
    for s in data["stages"]:
        if s["status"] in ("failed", "timeout"):
            lines += ["", f"## {s['name']}: {s['status']}", "", s["summary"], "", "```", s["log_tail"], "```"]
    return "\n".join(lines + ["", "## Notes", "", *(f"- {n}" for n in data["notes"])]) + "\n"


def write(path: Path, text: str) -> None:
    """Atomically: a reader (or a check killed mid-write) sees the old report or the new one, never half."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)  # mkstemp makes it private; the report is for anyone who can read the folder
    os.replace(tmp, path)


def judged(line: str, judge: Judge) -> Stage:
    """One line of WORK/stages.tsv (name, exit code or run/skip, budget s, milliseconds, note) as a stage."""
    name, rc, budget, ms, note = line.split("\t")
    status = {"": "pending", "run": "running", "skip": "skipped"}.get(rc)
    s: Stage = {"name": name, "budget_s": float(budget), "seconds": int(ms) / 1e3 if ms else None, "status": status,
                "summary": note, "details": {}, "log_tail": ""}  # fmt: skip
    if s["status"] is None:
        code = int(rc)
        s["status"] = "passed" if code == 0 else "timeout" if code in TIMED_OUT else "failed"
        if code and not note:
            s["summary"] = f"stopped after {s['seconds']:.0f} s (budget spent)" if code in TIMED_OUT else f"exit {code}"
        getattr(judge, f"stage_{name}", lambda s: None)(s)
        s["log_tail"] = s["log_tail"] or judge.log(name)
    return s


def render(args: argparse.Namespace) -> int:
    """Rewrite report.json, report.md and listops_curves.csv; print the line about --stage, or (--final) the
    ListOps table and the problems; with --final, exit 1 when a stage failed or ran out of time."""
    prev = load(args.out / "report.json") or {"load_average": {"start": os.getloadavg()}}
    data: dict[str, Any] = {
        "mode": args.mode, "command": args.command, "finished": args.final, "budget_s": args.budget,
        "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "elapsed_s": args.elapsed / 1e3,
        "load_average": {"start": prev["load_average"]["start"]}, "hardware": None, "env": {}, "sections": {},
        "notes": args.note, "work_dir": str(args.work),
    }  # fmt: skip
    judge = Judge(args.work, args.out, data)
    data["listops"] = {"rows": judge.listops_rows(), "settings": SETTINGS.format(judge.commands.get("listops-gpa"))}
    data["stages"] = [judged(line, judge) for line in (args.work / "stages.tsv").read_text().splitlines()]
    with open(args.out / "listops_curves.csv", "w", newline="") as fh:  # each logged step of each ListOps run
        writer = csv.writer(fh)
        writer.writerow(("attn", *CURVE_KEYS))
        for attn, run in judge.runs.items():
            logged = [r for r in metrics(Path(run["run_dir"])) if any(r.get(k) for k in CURVE_KEYS[1:])]
            writer.writerows([attn, *(r.get(k, "") for k in CURVE_KEYS)] for r in logged)
    problems = [s["name"] for s in data["stages"] if s["status"] in ("failed", "timeout")]
    if args.final:
        data["load_average"]["end"] = os.getloadavg()
        data["out_files"] = sorted({p.name for p in args.out.iterdir()} | {"report.md", "report.json"})
        if len(data["out_files"]) > 8 or not all(re.fullmatch(r"[A-Za-z0-9._-]+", n) for n in data["out_files"]):
            data["notes"].append(f"the output folder breaks the device's transfer rules: {data['out_files']}")
    write(args.out / "report.json", json.dumps(data, indent=1, default=str))
    write(args.out / "report.md", markdown(data))
    if args.stage:
        s = next(s for s in data["stages"] if s["name"] == args.stage)
        print(f"{s['name']}: {s['status']} in {s['seconds'] or 0:.0f} s — {s['summary']}")
    if args.final:
        print("\n".join(listops_table(data["listops"]["rows"])))
        print(f"done in {args.elapsed / 1e3:.0f} s; report {args.out / 'report.md'}; problems: {problems or 'none'}")
    return 1 if args.final and problems else 0


def env(out: Path) -> int:
    """What every run records about its machine, the device, and the one-line hardware summary of the report."""
    import torch  # (inside: see the module docstring)

    from lra_bench.record.provenance import environment

    e, cuda = environment(), torch.cuda.is_available()
    hw, pk = e.get("hardware") or {}, e.get("packages") or {}
    line = f"{hw.get('cpu_count')} CPUs ({hw.get('cpu')}), {hw.get('memory_gib')} GiB RAM"
    if cuda:
        p = torch.cuda.get_device_properties(0)
        e["device"] = {"name": p.name, "total_memory_mib": p.total_memory // 2**20, "sm": f"{p.major}.{p.minor}",
                       "multiprocessors": p.multi_processor_count, "bf16": torch.cuda.is_bf16_supported(),
                       "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}  # fmt: skip
        line = f"{p.name} ({p.total_memory // 2**20} MiB, sm {p.major}.{p.minor}), CUDA {torch.version.cuda}; {line}"
    e["hardware_line"] = f"{line if cuda else 'no CUDA device; ' + line}; Python {e.get('python')}, torch "
    e["hardware_line"] += f"{pk.get('torch')}, pytorch-lightning {pk.get('pytorch-lightning')}"
    e["pythonpath"] = os.environ.get("PYTHONPATH", "")  # the carried site, when one was installed
    out.write_text(json.dumps(e, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.gpu.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("render", "env"))
    for flag, kind in (("--out", Path), ("--work", Path), ("--mode", str), ("--command", str), ("--budget", float),
                       ("--elapsed", int), ("--stage", str)):  # fmt: skip
        parser.add_argument(flag, type=kind)
    parser.add_argument("--note", action="append", default=[])
    parser.add_argument("--final", action="store_true")
    args = parser.parse_args(argv)
    return render(args) if args.what == "render" else env(args.out)


if __name__ == "__main__":
    sys.exit(main())
