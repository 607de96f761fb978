"""The one way into a run: `run_stage(cfg, output_dir)` settles the config into the run's specification
(`lra_bench.config.spec.settle`: checked, derived keys filled, kernel path settled, identity and protocol check
made), sets the torch threads (the record's `env.runtime` says what the run used), takes the run dir's lock, and runs
the stage it asks for with that specification: training (`lra_bench.run.train`), testing one checkpoint
(`train=false`, `lra_bench.run.evaluation`), or self-pretraining then fine-tuning (`stage=spt`: the plan
`lra_bench.config.stages.plan` makes, each stage through `run_stage` again, so each gets its own lock and record).

Why one entry: each stage used to validate, lock and dispatch on its own; now the stages only run, and whatever
must happen before any of them writes happens here. Rank 0 takes the lock (`lra_bench.run.rundir`: a live run's
folder is refused with its holder's PID, before any record is written).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from lra_bench import runtime
from lra_bench.config import stages
from lra_bench.config.spec import settle, settle_kernels
from lra_bench.run.evaluation import evaluate
from lra_bench.run.rundir import RunDirLock
from lra_bench.run.train import train


def run_stage(cfg: DictConfig, output_dir: Path) -> dict[str, Any]:
    """Run the stage `cfg` asks for in `output_dir`; return its result record (also in `results.json`)."""
    if cfg.get("stage") == "spt":
        cfg = copy.deepcopy(cfg)  # the caller's config is left as given
        settle_kernels(cfg)  # `auto` as both stages will run it: a completed pretraining is then recognised as one
        record: dict[str, Any] = {}
        for stage_cfg, stage_dir in stages.plan(cfg, output_dir):
            record = run_stage(stage_cfg, stage_dir)
        return record  # the fine-tune's
    spec = settle(cfg, output_dir)
    runtime.set_threads(spec.config.get("threads"))
    lock = RunDirLock(spec.output_dir).acquire() if getattr(rank_zero_only, "rank", 0) == 0 else None
    try:
        return train(spec) if spec.trains else evaluate(spec)
    finally:
        if lock is not None:
            lock.release()
