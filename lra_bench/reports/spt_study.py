"""`python -m lra_bench.reports.spt_study --out DIR` — scratch vs self-pretraining at equal total steps, measured.

For each attention and seed two arms run through run.py, one after the other (the CPUs are shared): scratch
(`trainer.max_steps=T` on the labels) and spt (`experiment=spt/listops`: P masked-token steps on the training inputs,
then T−P fine-tuning steps — the same T optimizer steps). The task is a small generated ListOps (few labelled
examples: the regime where Amos et al., ICLR 2024, §3.4, report the largest gains from self-pretraining), the model
the harness's 2-layer, dim-64 encoder. `DIR/spt_study.json` holds every run's numbers (from its `results.json`), the
commands, wall-clock and `uptime` before/after; `DIR/spt_study.md` the table (`results_doc --spt DIR` puts it into
docs/results.md). Runs live in `DIR/runs` under fixed names, so a rerun resumes unfinished runs and re-reads the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lra_bench.kit.markdown import table
from lra_bench.record.provenance import environment
from lra_bench.record.reader import lookup, read
from lra_bench.reproduction_runs import REPO
from lra_bench.runtime import uptime

#: the small ListOps of the study (few labels; everything else is the harness's normal path)
TASK = [
    "task=listops",
    "task.max_length=128",
    "task.seq_len=128",
    "task.gen_num_train=1000",
    "task.gen_num_val=500",
    "task.gen_num_test=500",
    "task.gen_min_length=10",
    "task.gen_max_length=128",
    "task.gen_max_depth=3",
    "task.gen_max_args=5",
    "model.dropout=0.0",
    "optim.lr=2.0e-3",
    "optim.warmup_steps=50",
    "data.batch_size=32",
    "trainer.val_check_interval=100",
    "trainer.limit_val_batches=16",
    "diagnostics.enabled=false",
    "callbacks.progress_bar=false",
    "logger=csv",
    "print_config=false",
]
ATTN_ARGS = {"nystrom": ["attn.num_landmarks=16"]}  # 16 landmarks for 128 tokens: a real approximation


def task_args(train_examples: int) -> list[str]:
    return [f"task.gen_num_train={train_examples}" if a.startswith("task.gen_num_train=") else a for a in TASK]


def arm_args(arm: str, attn: str, seed: int, settings: dict[str, Any], data_dir: Path) -> list[str]:
    total, pretrain = settings["total_steps"], settings["pretrain_steps"]
    task = task_args(settings["train_examples"])
    args = [*task, f"attn={attn}", *ATTN_ARGS.get(attn, []), f"seed={seed}", f"data_dir={data_dir}"]
    if arm == "scratch":
        return [*args, f"trainer.max_steps={total}"]
    spt = ["experiment=spt/listops", f"spt.pretrain.trainer.max_steps={pretrain}"]
    return [*args, *spt, f"trainer.max_steps={total - pretrain}"]


def run_arm(arm: str, attn: str, seed: int, settings: dict[str, Any], out: Path) -> dict[str, Any]:
    """One arm's row: run it (or resume it), read its records. A row saved by an earlier invocation with the same
    command is reused as it is (its wall-clock is the one measured then)."""
    name = f"{attn}-{arm}-s{seed}"
    args = arm_args(arm, attn, seed, settings, out / "data")
    args += [f"output_root={out / 'runs'}", f"run_name={name}"]
    saved = out / "rows" / f"{name}.json"
    if saved.exists():
        row = json.loads(saved.read_text())
        if row.get("args") == args:
            return row
    row = measure_arm(arm, attn, seed, name, args, out)
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(row, indent=2) + "\n")
    return row


def measure_arm(arm: str, attn: str, seed: int, name: str, args: list[str], out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "run.py", *args]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "WANDB_MODE": "disabled"})
    wall = time.perf_counter() - start
    job = out / "runs" / "listops" / attn / name
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    final = read(((job / "finetune") if arm == "spt" else job) / "results.json").metrics
    row: dict[str, Any] = {
        "attn": attn,
        "arm": arm,
        "seed": seed,
        "test_acc": final.test_acc,
        "val_acc": final.val_acc,
        "best_step": final.best_step,
        "steps": final.train_steps,
        "pretrain_steps": 0,
        "pretrain_masked_acc": None,
        "wall_s": round(wall, 1),
        "command": "python run.py " + " ".join(a for a in args if not a.startswith(("output_root=", "data_dir="))),
        "args": args,
    }
    if arm == "spt":
        pre = read(job / "pretrain" / "results.json")
        row["pretrain_steps"] = pre.metrics.train_steps
        row["pretrain_masked_acc"] = lookup(pre.pretrain, "final.val_acc")
    return row


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and sample std (ddof=1) of test accuracy per (attention, arm), and the SPT − scratch difference."""
    out = []
    for attn in sorted({r["attn"] for r in rows}):
        entry: dict[str, Any] = {"attn": attn}
        for arm in ("scratch", "spt"):
            accs = [r["test_acc"] for r in rows if r["attn"] == attn and r["arm"] == arm]
            entry[f"{arm}_mean"] = statistics.fmean(accs) if accs else None
            entry[f"{arm}_std"] = statistics.stdev(accs) if len(accs) > 1 else None
            entry[f"{arm}_n"] = len(accs)
        paired = [
            s["test_acc"] - c["test_acc"]
            for s in rows
            for c in rows
            if s["attn"] == c["attn"] == attn and s["arm"] == "spt" and c["arm"] == "scratch" and s["seed"] == c["seed"]
        ]
        entry["diff_mean"] = statistics.fmean(paired) if paired else None
        entry["diff_per_seed"] = paired
        out.append(entry)
    return out


def _pct(value: float | None, std: float | None = None) -> str:
    if value is None:
        return "—"
    return f"{100 * value:.1f}" + (f" ± {100 * std:.1f}" if std is not None else "")


def public_command(study: dict[str, Any]) -> str:
    """The study's command as a reader would type it: the output folder (a path of the machine it ran on) left out."""
    return re.sub(r"\s--out(=|\s+)\S+", "", study["command"])


def render_markdown(study: dict[str, Any], h: str = "#") -> str:
    s = study["settings"]
    lines = [
        f"{h} Self-pretraining vs scratch at equal total steps: {s['train_examples']} labelled ListOps examples, "
        f"{s['total_steps']} steps (`python -m lra_bench.reports.spt_study`)",
        "",
        f"Small generated ListOps (length ≤ 128, depth ≤ 3, {s['train_examples']} labelled training examples, "
        f"500 val / 500 test), the 2-layer dim-64 encoder, batch 32, lr 2e-3. **scratch**: {s['total_steps']} "
        f"supervised steps. **spt**: {s['pretrain_steps']} masked-token steps (mask ratio 0.5) on the training inputs "
        f"only, then {s['total_steps'] - s['pretrain_steps']} fine-tuning steps. Test accuracy (%) at the best-val "
        "checkpoint, mean ± sample std over seeds; Δ = spt − scratch, paired by seed. A deliberately small study "
        "(2 shared CPU cores): read it as a measurement of this setting, not of LRA-scale training.",
        "",
    ]
    lines += table(
        ["attention", "scratch", "spt", "Δ (mean)", "Δ per seed", "seeds"],
        [
            [
                f"`{e['attn']}`",
                _pct(e["scratch_mean"], e["scratch_std"]),
                _pct(e["spt_mean"], e["spt_std"]),
                f"{100 * e['diff_mean']:+.1f}" if e["diff_mean"] is not None else "—",
                ", ".join(f"{100 * d:+.1f}" for d in e["diff_per_seed"]) or "—",
                e["spt_n"],
            ]
            for e in study["summary"]
        ],
    )
    diffs = [d for e in study["summary"] for d in e["diff_per_seed"]]
    if diffs:
        wins = sum(d > 0 for d in diffs)
        lines += ["", f"SPT above scratch in {wins} of {len(diffs)} paired (attention, seed) runs."]
    lines += ["", "Per run (test / val accuracy %, the pretraining stage's masked-token accuracy on its hold-out):", ""]
    lines += table(
        ["attention", "arm", "seed", "test", "val", "best step", "masked acc", "wall (s)"],
        [
            [
                f"`{r['attn']}`",
                r["arm"],
                r["seed"],
                _pct(r["test_acc"]),
                _pct(r["val_acc"]),
                r["best_step"],
                _pct(r["pretrain_masked_acc"]),
                r["wall_s"],
            ]
            for r in study["rows"]
        ],  # fmt: skip
    )
    hw = study["env"]["hardware"]
    lines += [
        "",
        f"Machine: {hw.get('cpu')}, {hw.get('cpu_count')} logical CPUs, git `{study['env']['git_commit']}`; "
        f"`uptime` before: `{study['uptime_before']}`; after: `{study['uptime_after']}` "
        f"(wall-clock is shared-machine time, not a speed measurement). Reproduce: `{public_command(study)}`; "
        "each run's own command is in `spt_study.json`.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("outputs/spt_study"))
    parser.add_argument("--attns", default="full,nystrom")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--total-steps", type=int, default=600)
    parser.add_argument("--pretrain-steps", type=int, default=300)
    parser.add_argument("--train-examples", type=int, default=1000, help="labelled (= pretraining) examples")
    args = parser.parse_args(argv)
    if not 0 < args.pretrain_steps < args.total_steps:
        parser.error(f"--pretrain-steps={args.pretrain_steps}: must be in (0, --total-steps={args.total_steps})")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    settings = {
        "total_steps": args.total_steps,
        "pretrain_steps": args.pretrain_steps,
        "train_examples": args.train_examples,
        "attns": args.attns.split(","),
        "seeds": [int(s) for s in args.seeds.split(",")],
        "task_overrides": task_args(args.train_examples),
    }
    study: dict[str, Any] = {
        "settings": settings,
        "command": "python -m lra_bench.reports.spt_study " + " ".join(argv if argv is not None else sys.argv[1:]),
        "uptime_before": uptime(),
        "env": environment(),
        "rows": [],
    }
    for attn in settings["attns"]:
        for seed in settings["seeds"]:
            for arm in ("scratch", "spt"):
                row = run_arm(arm, attn, seed, settings, out)
                print(f"[spt_study] {attn} {arm} seed {seed}: test {_pct(row['test_acc'])} ({row['wall_s']} s)")
                study["rows"].append(row)
    study["uptime_after"] = uptime()
    study["summary"] = summarize(study["rows"])
    (out / "spt_study.json").write_text(json.dumps(study, indent=2) + "\n")
    (out / "spt_study.md").write_text(render_markdown(study))
    print(f"wrote {out / 'spt_study.json'} and {out / 'spt_study.md'}")


if __name__ == "__main__":
    main()
