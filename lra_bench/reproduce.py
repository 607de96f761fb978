"""`make reproduce TASK=listops ATTN=nystrom SEED=0`: one faithful run of a protocol, kept as evidence in the repo.

The run is the protocol's own config with nothing but logistics and the round's kernel path (`KERNELS`) given,
started as an ordinary `python run.py` process, so it is exactly what any user's `python run.py task=<t> attn=<a>
protocol=<p> seed=<s> model.kernels=eager` computes, and its record says whether it is on-protocol. It trains in
`outputs/reproductions/<protocol>/<task>/<attn>/seed-<s>/`; what re-checking its number needs goes to
`reproductions/<protocol>/<task>/<attn>/seed-<s>/`:

* while it runs (every `--snapshot-every-s` seconds, and when it stops): `in-progress/`, the small files and the
  last and best-val checkpoints — committed, a later `make reproduce` restores it and resumes bit-identically, on
  another machine too;
* when it completes: the `EVIDENCE` files, no checkpoints. Before that copy the approximation study of the best-val
  checkpoint (`lra_bench.reproduction_approx`) writes `approx.json`; it is failure-tolerant (a study that fails or
  runs past `APPROX_TIMEOUT_S` is reported, the evidence kept without it), and `--approx-only` makes it later while
  the work folder still holds the checkpoints.

A completed evidence folder is left as it is. Runs of a network the protocol no longer computes live in
`reproductions/variants/<name>/`; this command never reads or resumes them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lra_bench.record.checkpoint_file import CHECKPOINT_DIR, LAST, best_checkpoint_of
from lra_bench.reproduction_approx import APPROX_FILE
from lra_bench.reproduction_runs import EVIDENCE_ROOT, IN_PROGRESS, REPO, WORK_ROOT

#: what a completed run leaves as evidence (paths relative to its run dir; directories copied whole)
EVIDENCE = ("results.json", "test_predictions.npz", "identity.json", "run.log", "csv", "approx.json")
APPROX_TIMEOUT_S = 1800.0  # the approximation study is minutes at most; past this it is given up (evidence kept)
#: what an unfinished run needs to continue where it stopped (plus its checkpoints)
PROGRESS = ("results.json", "identity.json", "run.log", "csv", ".hydra")


def evidence_dir(protocol: str, task: str, attn: str, seed: int, root: Path = EVIDENCE_ROOT) -> Path:
    return root / protocol / task / attn / f"seed-{seed}"


#: the encoder's kernel path of the table's runs: every seed of a round on one path, so its rows' step times and
#: seeds compare and the runs in progress resume as they began (a run's default, `auto`, is the compiled chain on a
#: CPU). The next round may change it; its runs are then other experiments (`model.kernels` is in their identity).
KERNELS = "eager"


def run_dir(protocol: str, task: str, attn: str, seed: int, work: Path = WORK_ROOT) -> Path:
    """Where run.py puts the run: `<output_root>/<task>/<attn>/<run_name>` with the arguments `command` gives."""
    return work / protocol / task / attn / f"seed-{seed}"


def command(
    protocol: str, task: str, attn: str, seed: int, data_dir: str, threads: int, work: Path, extra: list[str]
) -> list[str]:
    """`python run.py` with the protocol's config: the method and seed, then logistics only (`extra`, empty for a
    reproduction, is for trials: any change there is recorded as off-protocol)."""
    method = [f"task={task}", f"attn={attn}", f"protocol={protocol}", f"seed={seed}", f"model.kernels={KERNELS}"]
    where = [f"data_dir={data_dir}", f"output_root={work / protocol}", f"run_name=seed-{seed}", f"threads={threads}"]
    quiet = ["logger=csv", "callbacks.progress_bar=status", "print_config=false"]
    return [sys.executable, str(REPO / "run.py"), *method, *where, *quiet, *extra]


def copy_into(src: Path, dst: Path) -> None:
    """Copy a file or a folder (merged into an existing one) to `dst`; nothing when `src` does not exist."""
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True)
    elif src.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def snapshot(run: Path, evidence: Path) -> bool:
    """Copy an unfinished run's state into `evidence/in-progress/` (replacing the previous snapshot whole, so the
    folder is always one consistent state). False when there is no complete checkpoint pair to copy yet."""
    ckpts = run / CHECKPOINT_DIR
    last = ckpts / LAST
    if not last.exists():
        return False
    staging = evidence / f".{IN_PROGRESS}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / CHECKPOINT_DIR).mkdir(parents=True)
    shutil.copy2(last, staging / CHECKPOINT_DIR / LAST)  # atomic rename by the run: a whole file
    best = best_checkpoint_of(staging / CHECKPOINT_DIR / LAST)
    if best:
        try:
            shutil.copy2(ckpts / best, staging / CHECKPOINT_DIR / best)
        except FileNotFoundError:  # replaced by a newer best since last.ckpt was written: next time
            shutil.rmtree(staging)
            return False
    for name in PROGRESS:
        copy_into(run / name, staging / name)
    target = evidence / IN_PROGRESS
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return True


def restore(evidence: Path, run: Path) -> bool:
    """Put a committed `in-progress/` snapshot into the run dir when the run dir has no checkpoint of its own."""
    saved = evidence / IN_PROGRESS
    if not (saved / CHECKPOINT_DIR / LAST).exists() or (run / CHECKPOINT_DIR / LAST).exists():
        return False
    run.mkdir(parents=True, exist_ok=True)
    shutil.copytree(saved, run, dirs_exist_ok=True)
    return True


def keep_evidence(run: Path, evidence: Path) -> None:
    """A completed run's evidence replaces the in-progress snapshot."""
    staging = evidence.parent / f".{evidence.name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    for name in EVIDENCE:
        copy_into(run / name, staging / name)
    shutil.rmtree(evidence, ignore_errors=True)
    staging.rename(evidence)


def record_status(path: Path) -> str | None:
    try:
        return json.loads(path.read_text()).get("status")
    except (OSError, ValueError):
        return None


def approx_command(args: argparse.Namespace) -> str:
    """The command that (re)makes a run's `approx.json`, as the file records it."""
    return (
        f"python -m lra_bench.reproduce --approx-only --task {args.task} --attn {args.attn} --seed {args.seed} "
        f"--protocol {args.protocol}"
    )


def approx_study(run: Path, out: Path, args: argparse.Namespace, timeout_s: float = APPROX_TIMEOUT_S) -> bool:
    """`lra_bench.reproduction_approx` on the completed run in `run`, written to `out`, as a child process (a crash,
    an exhausted memory or a hang cannot take the evidence with it). False, said on stdout, when it failed."""
    cmd = [sys.executable, "-m", "lra_bench.reproduction_approx", "--run", str(run), "--out", str(out)]
    cmd += ["--threads", str(args.threads), "--command", approx_command(args)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        print(f"[reproduce] the approximation study ran past {timeout_s:.0f} s: no {APPROX_FILE}", flush=True)
        return False
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        print(f"[reproduce] the approximation study failed ({proc.returncode}): no {APPROX_FILE}", flush=True)
        for line in tail:
            print(f"[reproduce]   {line}", flush=True)
        return False
    print(proc.stdout.strip(), flush=True)
    return True


def approx_only(args: argparse.Namespace) -> int:
    """`--approx-only`: the approximation study of a completed reproduction, into its evidence folder."""
    evidence = evidence_dir(args.protocol, args.task, args.attn, args.seed, Path(args.evidence_root))
    run = run_dir(args.protocol, args.task, args.attn, args.seed, Path(args.work_root))
    if record_status(evidence / "results.json") != "completed":
        print(f"[reproduce] {evidence} holds no completed run: nothing to study", file=sys.stderr)
        return 1
    if not any((run / CHECKPOINT_DIR).glob("best*.ckpt")):
        print(f"[reproduce] {run} has no best-val checkpoint (checkpoints/best-*.ckpt): cannot study", file=sys.stderr)
        return 1
    return 0 if approx_study(run, evidence / APPROX_FILE, args) else 1


def reproduce(args: argparse.Namespace) -> int:
    if args.approx_only:
        return approx_only(args)
    evidence = evidence_dir(args.protocol, args.task, args.attn, args.seed, Path(args.evidence_root))
    run = run_dir(args.protocol, args.task, args.attn, args.seed, Path(args.work_root))
    if record_status(evidence / "results.json") == "completed":
        print(f"[reproduce] {evidence} holds a completed run; nothing to do (remove it to run again)")
        return 0
    if restore(evidence, run):
        print(f"[reproduce] restored the committed snapshot {evidence / IN_PROGRESS} into {run}; resuming")
    cmd = command(
        args.protocol, args.task, args.attn, args.seed, args.data_dir, args.threads, Path(args.work_root), args.override
    )
    print("[reproduce] " + " ".join(cmd[1:]), flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    child = subprocess.Popen(cmd, cwd=REPO, env=env)

    def forward(signum: int, _frame: Any) -> None:  # the run saves at its next step boundary, then we snapshot
        child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    last_snapshot = time.monotonic()
    while child.poll() is None:
        time.sleep(1.0)
        if time.monotonic() - last_snapshot >= args.snapshot_every_s:
            snapshot(run, evidence)
            last_snapshot = time.monotonic()
    code = child.returncode if child.returncode >= 0 else 128 - child.returncode  # killed by a signal: the shell's code
    if code == 0 and record_status(run / "results.json") == "completed":
        (run / APPROX_FILE).unlink(missing_ok=True)  # never an earlier study's file beside this run's evidence
        approx_study(run, run / APPROX_FILE, args)  # failure-tolerant: the evidence is kept either way
        keep_evidence(run, evidence)
        print(f"[reproduce] completed: evidence in {evidence}")
        return 0
    saved = f"state saved in {evidence / IN_PROGRESS}" if snapshot(run, evidence) else "no checkpoint to save yet"
    print(f"[reproduce] run.py exited {code}; {saved}")
    return code or 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="listops")
    parser.add_argument("--attn", default="nystrom")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--protocol", default="nystromformer")
    parser.add_argument("--data-dir", default=os.environ.get("LRA_DATA_DIR", "data"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: one process per core)")
    parser.add_argument("--snapshot-every-s", type=float, default=600.0)
    parser.add_argument("--evidence-root", default=str(EVIDENCE_ROOT))
    parser.add_argument("--work-root", default=str(WORK_ROOT))
    parser.add_argument(
        "--override", action="append", default=[], help="a config override: makes the run off-protocol (for trials)"
    )
    parser.add_argument(
        "--approx-only",
        action="store_true",
        help="only the approximation study of a completed run (its work folder's best-val checkpoint) into its "
        "evidence folder's approx.json",
    )
    return reproduce(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
