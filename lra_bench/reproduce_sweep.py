"""`python -m lra_bench.reproduce_sweep`: every row of a protocol's table — tasks × attentions × seeds — in one
command, as one Hydra multirun through whichever launcher the command names (one job array on SLURM with
`hydra/launcher=slurm`; one job after another without it).

    python -m lra_bench.reproduce_sweep --task listops --attn nystrom gpa full --seed 0 1 -- \\
        hydra/launcher=slurm hydra.launcher.partition=cpu hydra.launcher.cpus_per_task=1

Each job is exactly what `make reproduce` runs (`lra_bench.reproduce.command`) in the same work folder, so a
requeued or re-submitted job resumes from its own `last.ckpt`. `EvidenceCallback` does around each job what `make
reproduce` does around its run (restore the committed state, keep the evidence), and rebuilds
`docs/reproductions.md` when the sweep ends, in the submitting process. Arguments after `--` are Hydra overrides for
the launcher and the sweep (`hydra.*`); any other key would make every run off-protocol, and its record says so.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from lra_bench import reproduce
from lra_bench.reproduction_approx import APPROX_FILE

#: the job folder below the sweep dir (`<work root>/<protocol>`): the one `lra_bench.reproduce.run_dir` names
SUBDIR = "${task.name}/${attn.name}/seed-${seed}"


class EvidenceCallback(Callback):
    """Restore before each job, keep the evidence after it, rebuild the page after the sweep (see the module)."""

    def __init__(self, evidence_root: str, page: str, threads: int = 1) -> None:
        self.evidence_root = Path(evidence_root)
        self.page = Path(page)
        self.threads = threads

    def _where(self, config: DictConfig) -> tuple[Path, Path, argparse.Namespace]:
        """The job's run dir, its evidence folder and the `make reproduce` arguments that name it."""
        args = argparse.Namespace(
            protocol=str(config.protocol.name),
            task=str(config.task.name),
            attn=str(config.attn.name),
            seed=int(config.seed),
            threads=self.threads,
        )
        run = Path(str(config.hydra.runtime.output_dir))
        return run, reproduce.evidence_dir(args.protocol, args.task, args.attn, args.seed, self.evidence_root), args

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        run, evidence, _ = self._where(config)
        if reproduce.record_status(evidence / "results.json") == "completed":
            if reproduce.record_status(run / "results.json") != "completed":
                for name in ("results.json", "identity.json"):
                    reproduce.copy_into(evidence / name, run / name)  # run.py finds it completed and leaves it
            print(f"[reproduce] {evidence} holds a completed run: nothing to train", flush=True)
        elif reproduce.restore(evidence, run):
            print(
                f"[reproduce] restored the committed snapshot {evidence / reproduce.IN_PROGRESS}; resuming", flush=True
            )

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        run, evidence, args = self._where(config)
        if reproduce.record_status(evidence / "results.json") == "completed":
            return  # a completed evidence folder is left as it is
        if reproduce.record_status(run / "results.json") == "completed":
            (run / APPROX_FILE).unlink(missing_ok=True)
            reproduce.approx_study(run, run / APPROX_FILE, args)  # failure-tolerant, as in make reproduce
            reproduce.keep_evidence(run, evidence)
            print(f"[reproduce] completed: evidence in {evidence}", flush=True)
        elif reproduce.snapshot(run, evidence):
            print(f"[reproduce] not completed: state saved in {evidence / reproduce.IN_PROGRESS}", flush=True)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from lra_bench import reproductions  # the page's code only at the end: this callback loads in every job

        reproductions.main(["--root", str(self.evidence_root), "--out", str(self.page)])


def command(args: argparse.Namespace) -> list[str]:
    """The multirun: `make reproduce`'s command with comma-separated tasks, attentions and seeds, the sweep laid out
    as its work folders, the evidence callback, then the user's `hydra.*` overrides."""
    work = Path(args.work_root)
    tasks, attns, seeds = ",".join(args.task), ",".join(args.attn), ",".join(map(str, args.seed))
    data = str(Path(args.data_dir).resolve())  # every job, wherever it starts, reads the same folder
    single = reproduce.command(args.protocol, tasks, attns, 0, data, args.threads, work, [])
    # a multirun names its jobs by the sweep dir, not output_root/run_name
    overrides = [a for a in single[2:] if not a.startswith(("output_root=", "run_name=", "seed="))]
    callback = "hydra.callbacks.evidence"
    return [
        single[0],
        single[1],
        "-m",
        *overrides,
        f"seed={seeds}",
        f"hydra.sweep.dir={work / args.protocol}",
        f"hydra.sweep.subdir='{SUBDIR}'",
        f"+{callback}._target_=lra_bench.reproduce_sweep.{EvidenceCallback.__name__}",  # not __main__'s
        f"+{callback}.evidence_root={Path(args.evidence_root).resolve()}",
        f"+{callback}.page={Path(args.page).resolve()}",
        f"+{callback}.threads={args.threads}",
        *args.overrides,
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--protocol", default="nystromformer")
    parser.add_argument("--task", nargs="+", default=["listops"])
    parser.add_argument("--attn", nargs="+", required=True)
    parser.add_argument("--seed", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per job (1: one process per core)")
    parser.add_argument("--evidence-root", default=str(reproduce.EVIDENCE_ROOT))
    parser.add_argument("--work-root", default=str(reproduce.WORK_ROOT))
    parser.add_argument("--page", default=str(reproduce.REPO / "docs" / "reproductions.md"))
    parser.add_argument("overrides", nargs="*", help="after --: Hydra overrides for the launcher (hydra.*)")
    args = parser.parse_args(argv)
    cmd = command(args)
    print("[reproduce] " + " ".join(cmd[1:]), flush=True)
    return subprocess.run(cmd, cwd=reproduce.REPO, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
