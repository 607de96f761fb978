"""One run's specification, settled once at its start: `settle(cfg, output_dir)` → `RunSpec`.

Why one place: the stages (`lra_bench.run.train`, `lra_bench.run.evaluation`) used to receive the composed config
and settle pieces of it where they needed them — the entry validated it and derived the stage keys, the training
stage checked the protocol from its record, the pretraining plan validated again. Now everything a stage must know
before it writes is decided here, in this order, and the stages read the result:

1. the checks (`validate_once`: schemas, types and ranges, paths, cross-field rules);
2. the derived keys (`derive_run_keys`: `pretraining`, `pretraining_fingerprint`; a `pretrained=` source located
   and checked against this network);
3. the encoder's kernel path (`model.kernels=fused` where it cannot run becomes the eager path that will, said
   in one line; `auto` becomes whichever runs), so the record, identity and fingerprint name what really runs;
4. the launcher (a ddp script launcher inside a multirun is refused) and the run dir (writable);
5. what the run is: its record as the config alone determines it (`new_record`: the resolved config, the rank
   budget, the stage and the pretraining it starts from), the config part of its identity, and how it deviates
   from its protocol (`lra_bench.config.conformance.check`; the data part of the identity is added once the data
   is prepared, `identify`).

The settled config is read-only: a stage that tried to change a key after the record and identity were taken from
it would fail loudly instead of running a config other than the one recorded.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from lra_bench.config import conformance
from lra_bench.config.pretrained_run import PretrainedSource
from lra_bench.config.validate import check_writable, validate_once
from lra_bench.errors import ConfigError
from lra_bench.record.builder import add_environment, new_record
from lra_bench.record.identity import config_identity, fingerprint, with_data
from lra_bench.record.schema import Identified, RunRecord
from models.encoder import UNSET_KERNELS, kernels_that_run


@dataclass(frozen=True)
class RunSpec:
    """A run as its stage receives it: everything here was checked or derived by `settle`."""

    config: DictConfig  # validated, components typed, derived keys filled, kernels settled; read-only
    output_dir: Path
    source: PretrainedSource | None  # the pretraining run a fine-tune starts from
    described: RunRecord  # the record as the config alone determines it (no data, code or environment yet)
    identity: dict[str, Any]  # the config part of the run's identity (`config_identity`)
    protocol: dict[str, Any]  # `conformance.check`: {"off_protocol": ..., "deviations": ...}

    @property
    def trains(self) -> bool:
        """`train=true`: the training stage; else the checkpoint `ckpt_path` is tested (`train=false`)."""
        return bool(self.config.train)

    @property
    def resolved(self) -> dict[str, Any]:
        """The config as plain JSON types: what the record stores and the identity is made of."""
        return self.described.config

    def start_record(self) -> RunRecord:
        """The record a stage starts from: a copy of `described` with this process's code and environment (taken
        now, after the entry set the threads the run uses)."""
        return add_environment(copy.deepcopy(self.described))

    def identify(self, data: dict[str, Any]) -> Identified:
        """The run's identity once its data is prepared (`data`: `rundir.data_identity_of`), its fingerprint, and
        the protocol check settle made (the data part of an identity is no part of a protocol)."""
        identity = with_data(self.identity, data)
        return Identified(identity, fingerprint(identity), self.protocol["off_protocol"], self.protocol["deviations"])


def settle(cfg: DictConfig, output_dir: Path) -> RunSpec:
    """Check and complete `cfg` for a run in `output_dir` (the steps in the module docstring); one `ConfigError`
    line on the first mistake, before anything is written. Settles a copy: the caller's config is left as given."""
    cfg = copy.deepcopy(cfg)
    validate_once(cfg)  # the pre-flight or the sweeper checked it already: then only its components are typed
    source = conformance.derive_run_keys(cfg)  # stage keys checked, `pretraining` derived (as the protocol check does)
    settle_kernels(cfg)
    check_launch(cfg)
    check_writable(output_dir)
    OmegaConf.set_readonly(cfg, True)
    described = new_record(cfg, Path(output_dir), with_env=False)
    described.stage, described.pretraining = str(cfg.stage), str(cfg.pretraining)
    described.pretrained = source.describe() if source else None
    identity = config_identity(described.config)
    protocol = conformance.check(
        identity, str(described.task), str(described.protocol), str(described.attn), described.selector
    )
    return RunSpec(cfg, Path(output_dir), source, described, identity, protocol)


def settle_kernels(cfg: DictConfig) -> None:
    """Set `model.kernels` to the path the run will compute on (`models.encoder.kernels_that_run`), saying so in one
    line where it is not the one asked for (`auto` asks for none), so the record, identity and fingerprint name
    what really ran."""
    accelerator = str(cfg.trainer.get("accelerator", "auto"))
    # `auto` is the CPU only where Lightning finds no accelerator: neither CUDA nor Apple's MPS
    found = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    device = {"gpu": "cuda", "auto": found}.get(accelerator, accelerator)
    asked = str(cfg.model.get("kernels", UNSET_KERNELS))
    runs, why = kernels_that_run(asked, device, str(cfg.trainer.get("precision", "32-true")))
    if runs != asked:  # `auto` becomes the path it is, without a word
        cfg.model.kernels = runs
    if why and getattr(rank_zero_only, "rank", 0) == 0:
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
