"""Everything Hydra needs before composing: our resolvers. Light on purpose (no torch, no Lightning): `run.py
--help` and `--cfg job` only compose the YAML tree; components' schemas are checked when a run starts
(`lra_bench.config.validate.check_components`)."""

from __future__ import annotations

import hashlib
import re

from omegaconf import OmegaConf

_DONE = False


#: characters a Hydra override value may hold unquoted (its lexer's ID and UNQUOTED_CHAR: letters, digits, `_ - / \
#: + . $ % * @ ? |`) that a shell also passes through unquoted; `/` is left out because it would nest folders
PASTEABLE = "A-Za-z0-9_.+@%\\-"


def run_dir(run_name: str | None, override_dirname: str | None) -> str:
    """The run's folder name: `run_name` if given, else the (sorted) overrides, else `default`.

    The same command therefore lands in the same folder — which is what makes re-running it resume from
    `last.ckpt` — while any change of an override gives a new folder. (Keys left out of the name, e.g. `data_dir`,
    can still make another experiment: `lra_bench.run.run_state` refuses to mix two in one folder.) Every name is
    made of `PASTEABLE` characters, so `ckpt_path=<run dir>/checkpoints/last.ckpt` works unquoted.
    """
    if run_name:
        return str(run_name)
    name = re.sub(f"[^{PASTEABLE}]", "_", override_dirname or "") or "default"
    if len(name) > 120:
        name = name[:100] + "-" + hashlib.sha1(name.encode()).hexdigest()[:10]
    return name


def slurm_gpus(accelerator: str | None, devices: object) -> object:
    """GPUs per node a SLURM job asks for: `trainer.devices` when the trainer runs on GPUs (`trainer=gpu`, `ddp`),
    none otherwise. `accelerator=auto` (the default) asks for none, so the launcher works as-is on a CPU-only
    partition, where a GPU request is rejected (`sbatch: error: Invalid generic resource (gres) specification`)."""
    return devices if str(accelerator) in ("gpu", "cuda") else None


def quiet_third_party_warnings() -> None:
    """Silence library chatter that says nothing about the run (deprecations inside Lightning, the srun hint
    printed on any machine with SLURM installed, Lightning's marketing tips, the seven "setup plugin alembic.…"
    lines that alembic logs when Hydra loads the Optuna sweeper). Before Hydra starts: it imports the plugins."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    warnings.filterwarnings("ignore", message=r"The `srun` command is available on your system.*")
    warnings.filterwarnings("ignore", message=r".*does not have many workers which may be a bottleneck.*")
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    logging.getLogger("pytorch_lightning.utilities.rank_zero").addFilter(
        lambda record: "litlogger" not in record.getMessage() and "💡 Tip" not in record.getMessage()
    )


def setup() -> None:
    global _DONE
    if _DONE:
        return
    OmegaConf.register_new_resolver("run_dir", run_dir, replace=True)
    from lra_bench.tuning import tuned_value  # light: omegaconf and hydra only

    OmegaConf.register_new_resolver("tuned", tuned_value, replace=True)
    OmegaConf.register_new_resolver("slurm_gpus", slurm_gpus, replace=True)
    _DONE = True
