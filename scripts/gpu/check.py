"""`python -m scripts.gpu.check --out DIR [--tiny]` — the GPU node check, every stage time-boxed (called by
scripts/gpu/check.sh; `--help` lists the options).

Stages, in order (plan.py holds every size and budget):
  wheels         install the carried wheels the running Python lacks into a temp site; verify imports and deps
  env            nvidia-smi, the device, package versions, the hardware line
  listops_data   the ListOps data (official size on the GPU) through `python -m lra_bench.prepare`: generation on
                 every core, then the tokenized cache the three runs share
  listops_train  `run.py task=listops attn={full,nystrom,gpa}` concurrently on the one device; meanwhile:
    gpu_tests      pytest -m gpu
    fast_tier      the fast-tier files whose code picks the device itself (plan.py says which and why)
    bf16_smoke     one bf16 multirun over every registered attention: each must train with finite loss
  bench_<dtype>  `python -m lra_bench.bench` on the device, bf16 and fp32
  table          the ListOps table beside the published numbers; the leaderboard tool over the runs

Everything goes under --out (at most 8 files: report.md, report.json, check.log, stages.log, the two bench.json,
listops_curves.csv); the rest under --work. A stage that fails or runs out of time is recorded and the next one
starts; the report is rewritten after every stage.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scripts.gpu import plan as plans
from scripts.gpu import wheelsite
from scripts.gpu.report import Report, StageRecord, listops_markdown
from scripts.gpu.runner import Job, LogSink, Outcome, wait_all

REPO = Path(__file__).resolve().parents[2]
OUT_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
MAX_OUT_FILES = 8
TABLE_RESERVE_S = 10.0  # kept back from every stage for the final table

STAGES = [
    ("wheels", "carried wheels: probe, install the missing ones, verify"),
    ("env", "device, driver and package versions"),
    ("listops_data", "ListOps data: parallel generation and the tokenized cache"),
    ("listops_train", "ListOps, Nyströmformer protocol: full, nystrom, gpa concurrently"),
    ("gpu_tests", "pytest -m gpu"),
    ("fast_tier", "fast-tier tests whose code picks the device itself"),
    ("bf16_smoke", "bf16 training smoke of every registered attention (run.py multirun)"),
    ("bench_bfloat16", "attention benchmark on the device, bf16"),
    ("bench_float32", "attention benchmark on the device, fp32"),
    ("train_step", "the faithful training step against the matmul limit (python -m lra_bench.bench.step)"),
    ("table", "the ListOps table beside the published numbers"),
]

ENV_PROBE = """
import json, torch
from lra_bench.record.provenance import environment
e = environment()
e["cuda_available"] = torch.cuda.is_available()
if e["cuda_available"]:
    p = torch.cuda.get_device_properties(0)
    e["device"] = {"name": p.name, "total_memory_mib": p.total_memory // 2**20,
                   "capability": f"{p.major}.{p.minor}", "multiprocessors": p.multi_processor_count,
                   "bf16": torch.cuda.is_bf16_supported(), "cuda": torch.version.cuda,
                   "cudnn": torch.backends.cudnn.version()}
print("ENV_JSON " + json.dumps(e, default=str))
"""


def junit_counts(path: Path) -> dict[str, Any]:
    """Totals and the failing test ids from a pytest junit XML file."""
    if not path.exists():
        return {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "failed": []}
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {key: sum(int(s.get(key, 0)) for s in suites) for key in ("tests", "failures", "errors", "skipped")}
    failed = []
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(f"{case.get('classname')}::{case.get('name')}")
    return {**counts, "failed": failed}


def read_csv_metrics(run_dir: Path) -> list[dict[str, str]]:
    """The CSV logger's metrics rows of a run (Lightning writes csv/version_<k>/metrics.csv)."""
    files = sorted(run_dir.glob("csv/version_*/metrics.csv"))
    if not files:
        return []
    with open(files[-1], newline="") as fh:
        return list(csv.DictReader(fh))


def floats(rows: list[dict[str, str]], key: str) -> list[tuple[int, float]]:
    out = []
    for row in rows:
        if row.get(key) not in (None, ""):
            out.append((int(float(row.get("step") or 0)), float(row[key])))
    return out


class Check:
    def __init__(self, args: argparse.Namespace) -> None:
        self.plan = plans.plan_for(args.tiny)
        self.out = args.out.resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.work = (args.work or Path(tempfile.gettempdir()) / f"lra-gpu-check-{stamp}").resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.wheel_dir = (args.wheels or REPO / ".whl").resolve()
        self.wheel_list = wheelsite.WHEEL_LIST
        self.python = sys.executable
        self.t0 = time.monotonic()
        budget = float(args.budget or self.plan.total_budget_s)
        self.deadline = self.t0 + budget
        self.sink = LogSink(self.out / "stages.log")
        self.budgets = {**self.plan.budgets, **dict(getattr(args, "stage_budget", None) or [])}
        records = [StageRecord(name, title, float(self.budgets[name])) for name, title in STAGES]
        command = "scripts/gpu/check.sh " + " ".join(sys.argv[1:])
        self.report = Report(self.out, self.plan.mode, command, budget, records)
        self.report.data["work_dir"] = str(self.work)
        self.report.data["notes"] += list(self.plan.notes)
        self.site: Path | None = None
        self.cuda = False
        self.active: set[Job] = set()
        self.runs: dict[str, dict[str, Any]] = {}

    # -- plumbing -------------------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        print(f"[check {time.monotonic() - self.t0:6.1f}s] {text}", flush=True)

    def env(self, threads: int | None = None) -> dict[str, str]:
        env = dict(os.environ)
        path = [str(self.site)] if self.site else []
        path += [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env.update(
            PYTHONPATH=os.pathsep.join(dict.fromkeys(path)),
            PYTHONUNBUFFERED="1",
            WANDB_MODE="disabled",
            WANDB_SILENT="true",
            HF_DATASETS_OFFLINE="1",
            HF_HUB_OFFLINE="1",
            MPLBACKEND="Agg",
        )
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        return env

    def timeout_for(self, name: str, cap: float | None = None) -> float:
        left = self.deadline - time.monotonic() - (0 if name == "table" else TABLE_RESERVE_S)
        return max(0.0, min(self.budgets[name], left, cap if cap is not None else math.inf))

    def save(self) -> None:
        self.report.save(time.monotonic() - self.t0)

    def run_stage(self, name: str, body: Callable[[StageRecord, float], None], cap: float | None = None) -> None:
        """Run `body(record, timeout_s)`; it sets status/summary/details. Exceptions fail the stage, never the check."""
        rec = self.report.stage(name)
        timeout = self.timeout_for(name, cap)
        if timeout < 3:
            rec.status, rec.summary = "skipped", "no time left (the check's budget or its window)"
            self.save()
            return
        rec.status = "running"
        self.save()
        self.say(f"{name}: start (budget {timeout:.0f} s)")
        start = time.monotonic()
        try:
            body(rec, timeout)
        except Exception as err:
            rec.status = "failed"
            rec.summary = f"{type(err).__name__}: {err}"
            rec.log_tail = traceback.format_exc()
        rec.seconds = round(time.monotonic() - start, 1)
        if rec.status == "running":
            rec.status = "failed"
        self.say(f"{name}: {rec.status} in {rec.seconds:.0f} s — {rec.summary}")
        self.save()

    def command(self, label: str, cmd: list[str], timeout: float, threads: int | None = None) -> Outcome:
        job = Job(label, cmd, self.sink, REPO, self.env(threads))
        self.active.add(job)
        try:
            return job.wait(job.started + timeout)
        finally:
            self.active.discard(job)

    @staticmethod
    def finish_from(rec: StageRecord, outcome: Outcome, ok_summary: str) -> None:
        rec.log_tail = outcome.text(30)
        if outcome.timed_out:
            rec.status, rec.summary = "timeout", f"stopped after {outcome.seconds:.0f} s (budget spent)"
        elif outcome.returncode != 0:
            rec.status, rec.summary = "failed", f"exit code {outcome.returncode}"
        else:
            rec.status, rec.summary = "passed", ok_summary

    # -- stages ---------------------------------------------------------------------------------------------
    def stage_wheels(self, rec: StageRecord, timeout: float) -> None:
        start = time.monotonic()
        wanted = wheelsite.read_list(self.wheel_list)
        missing = [w for w in wanted if not wheelsite.importable(w.module)]
        rec.details["present"] = [w.dist for w in wanted if w not in missing]
        rec.details["missing"] = [w.dist for w in missing]
        wheels = {w.dist: wheelsite.find_wheel(self.wheel_dir, w) for w in missing}
        absent = [d for d, path in wheels.items() if path is None]
        if absent:
            rec.status = "failed"
            rec.summary = f"no wheel in {self.wheel_dir} for {', '.join(absent)}: run scripts/gpu/prepare.sh"
            return
        installed: list[str] = []
        if missing:
            self.site = self.work / "site"
            cmd = wheelsite.install_command(self.python, [p for p in wheels.values() if p], self.site)
            outcome = self.command("wheels", cmd, timeout)
            if not outcome.ok:
                self.finish_from(rec, outcome, "")
                self.site = None
                return
            installed = [p.name for p in wheels.values() if p]
            rec.details["site"] = str(self.site)
            rec.details["installed"] = installed
        shadowed = wheelsite.shadow_candidates(self.site) if self.site else []
        verify = [self.python, "-m", "scripts.gpu.wheelsite", "verify", "--list", str(self.wheel_list)]
        verify += ["--shadowed", ",".join(shadowed)]
        if self.site:
            verify += ["--site", str(self.site)]
        outcome = self.command("wheels", verify, max(5.0, timeout - (time.monotonic() - start)))
        line = next((text for _, text in reversed(outcome.tail) if text.startswith("{")), None)
        verdict = json.loads(line) if outcome.ok and line else None
        if verdict is None:
            self.finish_from(rec, outcome, "")
            return
        rec.details["verify"] = verdict
        problems = [
            *(f"import {m}: {e}" for m, e in verdict["import_errors"].items()),
            *(f"missing requirement {r}" for r in verdict["missing_requirements"]),
            *(f"shadows the node's {s}" for s in verdict["shadowed"]),
            *(["torch imported from the carried site"] if verdict["torch_from_site"] else []),
        ]
        warnings = verdict["out_of_range"]
        if problems:
            rec.status, rec.summary = "failed", "; ".join(problems)
            return
        what = f"installed {len(installed)} wheels" if installed else "nothing to install (all present)"
        note = f"; {len(warnings)} declared version ranges not met (see details)" if warnings else ""
        rec.status, rec.summary = "passed", f"{what}; {len(wanted)} modules import, torch {verdict['torch']}{note}"

    def stage_env(self, rec: StageRecord, timeout: float) -> None:
        smi = shutil.which("nvidia-smi")
        if smi:
            outcome = self.command("env", [smi], min(20.0, timeout / 2))
            rec.details["nvidia-smi"] = outcome.text(40)
            query = [smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
            rec.details["gpu_query"] = self.command("env", query, 10).text(4)
        else:
            rec.details["nvidia-smi"] = "not found on PATH"
        outcome = self.command("env", [self.python, "-c", ENV_PROBE], timeout / 2)
        line = next((text for _, text in reversed(outcome.tail) if text.startswith("ENV_JSON ")), None)
        if not outcome.ok or line is None:
            self.finish_from(rec, outcome, "")
            return
        env = json.loads(line[len("ENV_JSON ") :])
        self.report.data["env"] = env
        self.cuda = bool(env.get("cuda_available"))
        hw, pk = env.get("hardware") or {}, env.get("packages") or {}
        cpus = f"{hw.get('cpu_count')} CPUs ({hw.get('cpu')}), {hw.get('memory_gib')} GiB RAM"
        if self.cuda:
            dev = env["device"]
            driver = (rec.details.get("gpu_query") or "").split(",")[-1].strip() or "?"
            line = (
                f"{dev['name']} ({dev['total_memory_mib']} MiB, sm {dev['capability']}, {dev['multiprocessors']} SMs), "
                f"driver {driver}, CUDA {dev['cuda']}; {cpus}"
            )
        else:
            line = f"no CUDA device; {cpus}"
        self.report.data["hardware"] = (
            f"{line}; Python {env.get('python')}, torch {pk.get('torch')}, "
            f"pytorch-lightning {pk.get('pytorch-lightning')}"
        )
        rec.details["load_average"] = list(os.getloadavg())
        if self.plan.mode == "gpu" and not self.cuda:
            rec.status, rec.summary = "failed", "GPU mode but torch sees no CUDA device"
            return
        rec.status, rec.summary = "passed", self.report.data["hardware"]

    def listops_task_overrides(self) -> list[str]:
        task = [o for o in self.plan.listops_train if o.startswith("task.")]
        return task + self.plan.gen_overrides(self.plan.listops_gen)

    def data_command(self) -> list[str]:
        workers = [] if self.plan.gen_workers is None else [f"task.gen_workers={self.plan.gen_workers}"]
        return [
            self.python, "-m", "lra_bench.prepare", "task=listops", f"data_dir={self.work / 'data'}", "--json",
            *self.listops_task_overrides(), *workers,
        ]  # fmt: skip

    def stage_listops_data(self, rec: StageRecord, timeout: float) -> None:
        outcome = self.command("listops_data", self.data_command(), timeout)
        self.finish_from(rec, outcome, "")
        if rec.status != "passed":
            return
        text = "\n".join(line for _, line in outcome.tail)
        summary = json.loads(text[text.index("{") :]) if "{" in text else {}
        splits = summary.get("splits") or {}
        marks = {
            name: t
            for t, line in outcome.tail
            for name, pat in (("gen", "generating"), ("cache", "cached"))
            if pat in line
        }
        cache_s = re.search(r"cached tokenized splits in .*\(([\d.]+)s\)", text)
        if "gen" in marks and "cache" in marks:
            rec.details["generation_s"] = round(
                marks["cache"] - marks["gen"] - float(cache_s.group(1) if cache_s else 0), 1
            )
        if cache_s:
            rec.details["cache_build_s"] = float(cache_s.group(1))
        rec.details["workers"] = self.plan.gen_workers or "all cores (at most 16)"
        rec.details["splits"] = {k: v.get("count") for k, v in splits.items()}
        rec.details["cache"] = summary.get("cache")
        counts = "/".join(str(v.get("count")) for v in splits.values())
        gen = f", generated in {rec.details['generation_s']:.1f} s" if "generation_s" in rec.details else ""
        rec.summary = (
            f"{counts} trees{gen}, cache {rec.details.get('cache_build_s', '?')} s, total {outcome.seconds:.0f} s"
        )

    def train_command(self, attn: str) -> list[str]:
        return [
            self.python, str(REPO / "run.py"), "task=listops", f"attn={attn}", "protocol=nystromformer",
            "logger=csv", "seed=0", f"run_name={attn}", f"output_root={self.work / 'runs'}",
            f"data_dir={self.work / 'data'}", "print_config=false", "callbacks.progress_bar=false",
            *self.plan.listops_train, *self.plan.gen_overrides(self.plan.listops_gen),
        ]  # fmt: skip

    def stage_listops_train(self, rec: StageRecord, timeout: float) -> None:
        if self.report.stage("listops_data").status != "passed":
            rec.status, rec.summary = "skipped", "no ListOps data (see listops_data)"
            for name in plans.SIDE_STAGES:
                self.run_stage(name, getattr(self, f"stage_{name}"))
            return
        deadline = time.monotonic() + timeout
        jobs = {}
        for attn in plans.LISTOPS_ATTNS:
            jobs[attn] = Job(
                f"train_{attn}", self.train_command(attn), self.sink, REPO, self.env(self.plan.train_threads)
            )
            self.active.add(jobs[attn])
        rec.details["commands"] = {a: " ".join(j.cmd) for a, j in jobs.items()}
        self.save()
        for name in plans.SIDE_STAGES:  # beside the training runs, inside its window
            self.run_stage(name, getattr(self, f"stage_{name}"), cap=deadline - time.monotonic())
        outcomes = dict(zip(jobs, wait_all(list(jobs.values()), deadline)))
        self.active.difference_update(jobs.values())
        for attn, outcome in outcomes.items():
            self.runs[attn] = self.collect_run(attn, outcome)
        states = {a: r["status"] for a, r in self.runs.items()}
        rec.details["runs"] = {a: {k: v for k, v in r.items() if k != "curve"} for a, r in self.runs.items()}
        rec.log_tail = "\n".join(f"--- {a}\n{o.text(12)}" for a, o in outcomes.items())
        if all(s == "completed" for s in states.values()):
            rec.status = "passed"
        elif any(o.timed_out for o in outcomes.values()):
            rec.status = "timeout"
        else:
            rec.status = "failed"
        rec.summary = ", ".join(f"{a}: {s} at step {self.runs[a].get('steps')}" for a, s in states.items())
        self.write_curves()

    def collect_run(self, attn: str, outcome: Outcome) -> dict[str, Any]:
        run_dir = self.work / "runs" / "listops" / attn / attn
        record: dict[str, Any] = {}
        path = run_dir / "results.json"
        if path.exists():
            record = json.loads(path.read_text())
        metrics = record.get("metrics") or {}
        rows = read_csv_metrics(run_dir)
        val = floats(rows, "val/acc")
        steps = metrics.get("train_steps") or max((s for s, _ in floats(rows, "train/loss")), default=None)
        best = max(val, key=lambda sv: sv[1]) if val else (None, None)  # the CSV's, for a run stopped early
        cfg = record.get("config") or {}
        status = record.get("status") or "no record"
        if outcome.timed_out and status in ("running", "no record"):  # killed before it could record the stop
            status = f"stopped by the budget ({status})"
        return {
            "status": status,
            "error": record.get("error"),
            "steps": steps,
            "max_steps": (cfg.get("trainer") or {}).get("max_steps"),
            "val_acc": metrics.get("val_acc") if metrics.get("val_acc") is not None else (best[1] if best else None),
            "best_step": metrics.get("best_step")
            if metrics.get("best_step") is not None
            else (best[0] if best else None),
            "test_acc": metrics.get("test_acc"),
            "step_time_median_s": metrics.get("step_time_median_s"),
            "peak_memory_mib": metrics.get("peak_memory_mib"),
            "peak_memory_kind": metrics.get("peak_memory_kind"),
            "precision": (cfg.get("trainer") or {}).get("precision"),
            "wall_s": round(outcome.seconds, 1),
            "exit": outcome.returncode,
            "run_dir": str(run_dir),
            "curve": rows,
        }

    def write_curves(self) -> None:
        """listops_curves.csv: one row per logged step of each run (validation and training metrics)."""
        keys = ("step", "val/acc", "val/loss", "train/loss", "train/acc")
        with open(self.out / "listops_curves.csv", "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["attn", *keys])
            for attn, run_info in self.runs.items():
                for row in run_info.get("curve") or []:
                    if any(row.get(k) for k in keys[1:]):
                        writer.writerow([attn, *(row.get(k, "") for k in keys)])

    def pytest(self, label: str, args: list[str], timeout: float) -> tuple[Outcome, dict[str, Any]]:
        junit = self.work / f"junit_{label}.xml"
        cmd = [self.python, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", f"--junitxml={junit}", *args]
        outcome = self.command(label, cmd, timeout)
        return outcome, junit_counts(junit)

    def stage_gpu_tests(self, rec: StageRecord, timeout: float) -> None:
        outcome, counts = self.pytest("gpu_tests", ["-m", "gpu", "tests"], timeout)
        rec.details.update(counts)
        ran = counts["tests"] - counts["skipped"]
        self.finish_from(rec, outcome, f"{ran} passed, {counts['skipped']} skipped")
        if rec.status == "passed" and ran == 0:
            rec.status = "skipped" if not self.cuda else "failed"
            rec.summary = f"all {counts['skipped']} gpu tests skipped" + ("" if not self.cuda else " on a CUDA machine")
        elif rec.status == "failed":
            rec.summary = f"{len(counts['failed'])} failed: {', '.join(counts['failed'][:6])}"

    def stage_fast_tier(self, rec: StageRecord, timeout: float) -> None:
        args = ["-m", "not slow and not gpu", *self.plan.fast_tier_tests]
        if self.plan.mode == "gpu" and wheelsite.importable("xdist"):
            args += ["-n", "4"]
        outcome, counts = self.pytest("fast_tier", args, timeout)
        rec.details.update(counts, files=self.plan.fast_tier_tests, device="cuda" if self.cuda else "cpu")
        ran = counts["tests"] - counts["skipped"]
        self.finish_from(rec, outcome, f"{ran} passed, {counts['skipped']} skipped ({'CUDA' if self.cuda else 'CPU'})")
        if rec.status == "failed":
            rec.summary = f"{len(counts['failed'])} failed: {', '.join(counts['failed'][:6])}"

    @staticmethod
    def smoke_attns() -> list[str]:
        """Every attention option (conf/attn/*.yaml; tests/test_config.py keeps them equal to the registry)."""
        return sorted(p.stem for p in (REPO / "conf" / "attn").glob("*.yaml"))

    def smoke_command(self, attns: list[str]) -> list[str]:
        return [
            self.python, str(REPO / "run.py"), "-m", f"attn={','.join(attns)}", "task=listops", "logger=csv",
            "seed=0", "print_config=false", "callbacks.progress_bar=false", f"data_dir={self.work / 'smoke_data'}",
            f"hydra.sweep.dir={self.work / 'smoke'}", *self.plan.smoke_train,
            *self.plan.gen_overrides(self.plan.smoke_gen),
        ]  # fmt: skip

    def stage_bf16_smoke(self, rec: StageRecord, timeout: float) -> None:
        attns = self.smoke_attns()
        sweep = self.work / "smoke"
        outcome = self.command("bf16_smoke", self.smoke_command(attns), timeout, threads=self.plan.train_threads)
        results = {}
        for path in sorted(sweep.rglob("results.json")):
            record = json.loads(path.read_text())
            losses = [v for _, v in floats(read_csv_metrics(path.parent), "train/loss")]
            cfg = record.get("config") or {}
            steps = (record.get("metrics") or {}).get("train_steps")
            problems = []
            if record.get("status") != "completed":
                problems.append(f"status {record.get('status')}: {record.get('error')}")
            if steps != (cfg.get("trainer") or {}).get("max_steps"):
                problems.append(f"{steps} steps")
            if not losses or not all(math.isfinite(v) for v in losses):
                problems.append(f"train/loss not all finite: {losses[:5]}")
            if (cfg.get("trainer") or {}).get("precision") != "bf16-mixed":
                problems.append(f"precision {(cfg.get('trainer') or {}).get('precision')}")
            results[record.get("attn")] = {
                "ok": not problems,
                "problems": problems,
                "last_loss": losses[-1] if losses else None,
                "step_time_ms": round(1e3 * ((record.get("metrics") or {}).get("step_time_median_s") or 0), 2),
            }
        rec.details["attentions"] = results
        missing = [a for a in attns if a not in results]
        bad = [a for a, r in results.items() if not r["ok"]]
        self.finish_from(rec, outcome, "")
        if missing or bad:
            rec.status = "timeout" if outcome.timed_out else "failed"
            rec.summary = f"not run: {', '.join(missing) or '—'}; failed: {', '.join(bad) or '—'}"
        elif rec.status == "passed":
            rec.summary = (
                f"{len(results)} attentions trained in bf16-mixed with finite loss "
                "(the fp32 cores are asserted by tests/test_gpu.py)"
            )

    def bench_command(self, dtype: str) -> list[str]:
        run_dir = self.work / f"bench_{dtype}"
        return [
            self.python,
            "-m",
            "lra_bench.bench",
            *self.plan.bench_common,
            f"dtype={dtype}",
            f"hydra.run.dir={run_dir}",
        ]

    def stage_bench(self, dtype: str) -> Callable[[StageRecord, float], None]:
        def body(rec: StageRecord, timeout: float) -> None:
            run_dir = self.work / f"bench_{dtype}"
            outcome = self.command(f"bench_{dtype}", self.bench_command(dtype), timeout)
            self.finish_from(rec, outcome, "")
            path = run_dir / "bench.json"
            if not path.exists():
                return
            shutil.copyfile(path, self.out / f"bench_{dtype}.json")
            data = json.loads(path.read_text())
            rows = data["rows"]
            bad = [f"{r['label']} n={r['n']} {r['mode']}: {r['status']} {r.get('error') or ''}".strip()
                   for r in rows if r["status"] not in ("ok", "skipped")]  # fmt: skip
            skipped = sum(r["status"] == "skipped" for r in rows)
            rec.details["rows"], rec.details["not_ok"] = len(rows), bad[:20]
            try:
                from lra_bench.bench.report import render_markdown

                self.report.data["bench"][dtype] = {"markdown": render_markdown(data, h="###")}
            except Exception as err:  # the numbers are in bench_<dtype>.json either way
                rec.details["render_error"] = f"{type(err).__name__}: {err}"
            ns = sorted({r["n"] for r in rows})
            rec.summary = (
                f"{len(rows) - len(bad) - skipped}/{len(rows)} rows ok, {skipped} over budget, n {ns[0]}…{ns[-1]}"
            )
            if bad:
                rec.status = "failed"
                rec.summary += f"; {len(bad)} failed: {bad[0]}"

        return body

    def stage_train_step(self, rec: StageRecord, timeout: float) -> None:
        """The protocol's training step and evaluation batch per attention and precision, beside the device's fp32
        matmul rate in the same process, and the projected wall time of the whole protocol."""
        path = self.work / "train_step.json"
        cmd = [self.python, "-m", "lra_bench.bench.step", *self.plan.step_args, "--json", str(path)]
        outcome = self.command("train_step", cmd, timeout, threads=self.plan.train_threads)
        self.finish_from(rec, outcome, "")
        if not path.exists():
            return
        shutil.copyfile(path, self.out / "train_step.json")
        from lra_bench.bench.step import StepTiming, markdown

        data = json.loads(path.read_text())
        rows = [StepTiming(**row) for row in data["rows"]]
        self.report.data["train_step"] = {"markdown": "\n".join([data["title"], "", *markdown(rows)])}
        rec.summary = ", ".join(f"{r.attn} {r.precision} {r.step_s:.3f} s/step ({r.ratio:.2f}× limit)" for r in rows)

    def stage_table(self, rec: StageRecord, timeout: float) -> None:
        from lra_bench.leaderboard.aggregate import as_percent
        from lra_bench.leaderboard.published import load_published

        _, published = load_published()
        listops = {r.attn: r for r in published if r.source == plans.PUBLISHED_SOURCE and r.scores.get("listops")}
        rows = []
        for attn, r in self.runs.items():
            pub = listops.get(attn)
            rows.append(
                {
                    "attn": attn,
                    "status": r["status"],
                    "steps": r["steps"],
                    "max_steps": r["max_steps"],
                    "val_acc": as_percent(r["val_acc"]),
                    "best_step": r["best_step"],
                    "test_acc": as_percent(r["test_acc"]),
                    "published": float(pub.scores["listops"]) if pub else None,
                    "published_model": pub.model if pub else None,
                    "step_ms": 1e3 * r["step_time_median_s"] if r.get("step_time_median_s") else None,
                    "peak_mib": r["peak_memory_mib"],
                    "wall_s": r["wall_s"],
                }
            )
        cfg = " ".join(self.plan.listops_train)
        self.report.data["listops"] = {
            "rows": rows,
            "settings": (
                f"Each run: `python run.py task=listops attn=<attn> protocol=nystromformer logger=csv seed=0 {cfg}` "
                "(one seed). The three runs shared the device, concurrently with the gpu_tests, fast_tier and "
                "bf16_smoke stages, so their step times include that contention. Test accuracy is that of the "
                "best-val checkpoint; a run stopped by the budget shows its best validation so far and no test."
            ),
        }
        if not rows:
            rec.status, rec.summary = "skipped", "no ListOps run to tabulate"
            return
        self.save()
        for line in listops_markdown(self.report.data["listops"]):
            self.say(line)
        numbers = sum(r["test_acc"] is not None for r in rows)
        beside = ", ".join(f"{r['published_model']} {r['published']:.2f}" for r in rows if r["published"] is not None)
        summary = f"{numbers}/{len(rows)} runs with a test accuracy; published: {beside}"
        runs_dir = self.work / "runs"
        if not runs_dir.exists():  # every run was stopped before it wrote anything
            rec.status, rec.summary = "passed", summary
            rec.details["leaderboard"] = f"not built: no {runs_dir}"
            return
        board = [self.python, "-m", "lra_bench.leaderboard", str(runs_dir), "--no-plots"]
        outcome = self.command("table", [*board, "--out", str(self.work / "leaderboard")], timeout)
        rec.details["leaderboard"] = outcome.text(6)  # the harness's own reader of the same records
        self.finish_from(rec, outcome, summary)

    # -- the whole check --------------------------------------------------------------------------------------
    def run(self) -> int:
        self.say(f"{self.plan.mode} mode; out {self.out}; work {self.work}; budget {self.deadline - self.t0:.0f} s")
        self.report.data["load_average"] = {"start": list(os.getloadavg())}  # the machine may be shared
        try:
            self.run_stage("wheels", self.stage_wheels)
            self.run_stage("env", self.stage_env)
            self.run_stage("listops_data", self.stage_listops_data)
            self.run_stage("listops_train", self.stage_listops_train)
            for dtype in self.plan.bench_dtypes:
                self.run_stage(f"bench_{dtype}", self.stage_bench(dtype))
            self.run_stage("train_step", self.stage_train_step)
            self.run_stage("table", self.stage_table)
        finally:
            for job in list(self.active):
                job.stop()
            self.report.data["load_average"]["end"] = list(os.getloadavg())
            self.report.data["finished"] = True
            self.save()
            self.sink.close()
            self.check_out_dir()
        failed = [s.name for s in self.report.stages.values() if s.status in ("failed", "timeout")]
        self.say(
            f"done in {time.monotonic() - self.t0:.0f} s; report {self.out / 'report.md'}; problems: {failed or 'none'}"
        )
        return 1 if failed else 0

    def check_out_dir(self) -> None:
        files = [p for p in self.out.rglob("*") if p.is_file()]
        bad = [p.name for p in files if not OUT_NAME.match(p.name)]
        self.report.data["out_files"] = sorted(p.name for p in files)
        if len(files) > MAX_OUT_FILES or bad:
            self.report.data["notes"].append(
                f"output folder breaks the transfer rules: {len(files)} files, bad names {bad}"
            )
        self.save()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/gpu/check.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="report folder (≤ 8 files)")
    p.add_argument("--tiny", action="store_true", help="the same stages on the CPU, everything shrunk")
    p.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new one under the temp dir)")
    p.add_argument("--wheels", type=Path, default=None, help="carried wheels (default: .whl/ in the repo)")
    p.add_argument("--budget", type=float, default=None, help="seconds for the whole check (default: the plan's)")
    p.add_argument(
        "--stage-budget",
        action="append",
        type=stage_budget,
        metavar="STAGE=SECONDS",
        help="another budget for one stage (repeatable), e.g. listops_train=400 for a rerun with more time",
    )
    args = p.parse_args(argv)
    if args.budget is not None and args.budget <= 0:
        p.error(f"--budget={args.budget}: must be a positive number of seconds")
    return args


def stage_budget(text: str) -> tuple[str, float]:
    name, _, value = text.partition("=")
    names = [n for n, _ in STAGES]
    if name not in names:
        raise argparse.ArgumentTypeError(f"{text!r}: unknown stage {name!r}; valid: {', '.join(names)}")
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the budget must be a positive number of seconds")
    return name, seconds


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    check = Check(args)

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    return check.run()


if __name__ == "__main__":
    sys.exit(main())
