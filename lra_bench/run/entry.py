"""The one way into a run: `run_stage(cfg, output_dir)` settles the config, takes the run dir's lock, and runs the
stage the config asks for: training (`lra_bench.run.train`), testing one checkpoint (`train=false`,
`lra_bench.run.evaluation`), or self-pretraining then fine-tuning (`stage=spt`: the plan `lra_bench.run.pretrain.stages`
makes, each stage through `run_stage` again, so each gets its own lock and record).

Why one entry: each stage used to validate, lock and dispatch on its own (train dispatched to the other two); now
the stages only run, and whatever must happen before any of them writes happens here, in this order: validate, the
torch threads (the record's `env.runtime` says what the run used), the stage keys (`pretraining` derived, a
`pretrained=` source checked), the encoder's kernel path (`model.kernels=fused` where it cannot run is set to the eager
path that will run, and said), the launcher (a ddp script launcher inside a multirun is refused), the run dir is
writable, then rank 0 takes the lock (`lra_bench.run.rundir`: a live run's folder is refused with its holder's PID,
before any record is written).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig
from pytorch_lightning.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from lra_bench import runtime
from lra_bench.config import conformance
from lra_bench.config.validate import check_writable, validate_once
from lra_bench.errors import ConfigError
from lra_bench.run import pretrain
from lra_bench.run.evaluation import evaluate
from lra_bench.run.rundir import RunDirLock
from lra_bench.run.train import train
from models.encoder import UNSET_KERNELS, kernels_that_run


def run_stage(cfg: DictConfig, output_dir: Path) -> dict[str, Any]:
    """Run the stage `cfg` asks for in `output_dir`; return its result record (also in `results.json`)."""
    if cfg.get("stage") == "spt":
        record: dict[str, Any] = {}
        for stage_cfg, stage_dir in pretrain.stages(cfg, output_dir):
            record = run_stage(stage_cfg, stage_dir)
        return record  # the fine-tune's
    validate_once(cfg)  # the pre-flight or the sweeper checked it already: then only its components are typed
    runtime.set_threads(cfg.get("threads"))
    source = conformance.derive_run_keys(cfg)  # stage keys checked, `pretraining` derived (as the protocol check does)
    settle_kernels(cfg)
    check_launch(cfg)
    check_writable(output_dir)
    lock = RunDirLock(output_dir).acquire() if getattr(rank_zero_only, "rank", 0) == 0 else None
    try:
        return train(cfg, output_dir, source) if cfg.train else evaluate(cfg, output_dir)
    finally:
        if lock is not None:
            lock.release()


def settle_kernels(cfg: DictConfig) -> None:
    """Set `model.kernels` to the path the run will compute on (`models.encoder.kernels_that_run`), saying so in one
    line where it is not the one asked for, so the record, identity and fingerprint name what really ran."""
    accelerator = str(cfg.trainer.get("accelerator", "auto"))
    # `auto` is the CPU only where Lightning finds no accelerator: neither CUDA nor Apple's MPS
    found = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    device = {"gpu": "cuda", "auto": found}.get(accelerator, accelerator)
    asked = str(cfg.model.get("kernels", UNSET_KERNELS))
    runs, why = kernels_that_run(asked, device, str(cfg.trainer.get("precision", "32-true")))
    if runs != asked:
        cfg.model.kernels = runs
        if getattr(rank_zero_only, "rank", 0) == 0:
            print(f"[lra-bench] model.kernels={asked} runs as {runs}: {why}; recorded as {runs}", file=sys.stderr)


def check_launch(cfg: DictConfig) -> None:
    """Refuse Lightning's `ddp` script launcher inside a Hydra multirun (outside SLURM/torchrun).

    That launcher starts ranks 1.. by re-running the command line with `hydra.run.dir=<run dir>`: right for a
    single run (the children land in the same dir), wrong in a multirun, where the command line is the whole
    sweep and the job's dir is the sweep subdir. Under SLURM, srun starts the ranks, so it is fine there.
    """
    strategy = str(cfg.trainer.get("strategy", "auto"))
    devices = cfg.trainer.get("devices", 1)
    if not strategy.startswith("ddp") or "spawn" in strategy or "fork" in strategy or str(devices) in ("1", "[0]"):
        return
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    if SLURMEnvironment.detect() or TorchElasticEnvironment.detect():
        return
    raise ConfigError(
        f"trainer.strategy={strategy} with trainer.devices={devices} inside a Hydra multirun: Lightning's ddp "
        "launcher would re-run the whole sweep for every rank. Use hydra/launcher=slurm (srun starts the ranks; "
        "hydra.launcher.tasks_per_node=trainer.devices), run the job without -m, or trainer.strategy=ddp_spawn."
    )
