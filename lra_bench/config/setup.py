"""Everything Hydra needs before composing: our resolvers. Light on purpose (no torch, no Lightning): `run.py
--help` and `--cfg job` only compose the YAML tree; components' schemas are checked when a run starts
(`lra_bench.config.validate.check_components`)."""

from __future__ import annotations

import hashlib
import logging
import re
import warnings

from omegaconf import OmegaConf

from lra_bench.config.tuned import tuned_value
from lra_bench.registry import ATTENTIONS  # light: it finds its components only when asked

_DONE = False


#: characters a Hydra override value may hold unquoted (its lexer's ID and UNQUOTED_CHAR: letters, digits, `_ - / \
#: + . $ % * @ ? |`) that a shell also passes through unquoted; `/` is left out because it would nest folders
PASTEABLE = "A-Za-z0-9_.+@%\\-"


#: longest run folder name; a longer one is shortened by whole `key-value` items and ends in a hash of the full one
MAX_NAME = 120
HASH_CHARS = 10
#: an override item's start, `key-` (config keys hold no `-`; a `+` inside a value starts no new item)
_ITEM_START = re.compile(r"^~?[A-Za-z_][\w./]*(-|$)")


def override_items(name: str) -> list[str]:
    """The `key-value` items of an `override_dirname` (`item_sep` is `+`, which also prefixes `+key=` overrides and
    may sit inside a value such as `1e+3`)."""
    items: list[str] = []
    prefix = ""
    for part in name.split("+"):
        if not part:  # `++key` / `+key`: the `+` belongs to the next item
            prefix += "+"
        elif items and not prefix and not _ITEM_START.match(part):
            items[-1] += "+" + part  # a `+` inside the previous item's value
        else:
            items.append(prefix + part)
            prefix = ""
    return items


def _short_key(item: str) -> str:
    """`task.gen_num_test-128` → `gen_num_test-128`: the last component of the key, the value whole."""
    key, sep, value = item.partition("-")
    return key.lstrip("+~").rsplit(".", 1)[-1] + sep + value


def shorten(name: str, limit: int = MAX_NAME) -> str:
    """`name` if it fits; otherwise whole items only, never a value cut mid-number, then `-<hash of name>`.

    First every key is cut to its last component; if that is still too long, whole items are left out from the end
    (the seed is always kept: two seeds must never look alike) and `+N_more` says how many. The hash tells apart
    names that shorten alike.
    """
    if len(name) <= limit:
        return name
    digest = "-" + hashlib.sha1(name.encode()).hexdigest()[:HASH_CHARS]
    items = [_short_key(item) for item in override_items(name)]
    budget = limit - len(digest)
    if len("+".join(items)) <= budget:
        return "+".join(items) + digest
    seeds = [item for item in items if item.startswith("seed-")]
    others = [item for item in items if not item.startswith("seed-")]
    while others:
        kept = [*others, *seeds]
        more = f"+{len(items) - len(kept)}_more" if len(kept) < len(items) else ""
        if len("+".join(kept)) + len(more) <= budget:
            return "+".join(kept) + more + digest
        others.pop()
    return ("+".join(seeds) + f"+{len(items) - len(seeds)}_more")[:budget].lstrip("+") + digest


def run_dir(run_name: str | None, override_dirname: str | None) -> str:
    """The run's folder name: `run_name` if given, else the (sorted) overrides, else `default`.

    The same command therefore lands in the same folder — which is what makes re-running it resume from
    `last.ckpt` — while any change of an override gives a new folder. (Keys left out of the name, e.g. `data_dir`,
    can still make another experiment: `lra_bench.run.rundir` refuses to mix two in one folder.) Every name is
    made of `PASTEABLE` characters, so `ckpt_path=<run dir>/checkpoints/last.ckpt` works unquoted, and a long one is
    shortened by whole items (`shorten`): a name never shows a cut value (`gen_num_test-12` for 128).
    """
    if run_name:
        return str(run_name)
    return shorten(re.sub(f"[^{PASTEABLE}]", "_", override_dirname or "") or "default")


def slurm_gpus(accelerator: str | None, devices: object) -> object:
    """GPUs per node a SLURM job asks for: `trainer.devices` when the trainer runs on GPUs (`trainer=gpu`, `ddp`),
    none otherwise. `accelerator=auto` (the default) asks for none, so the launcher works as-is on a CPU-only
    partition, where a GPU request is rejected (`sbatch: error: Invalid generic resource (gres) specification`)."""
    return devices if str(accelerator) in ("gpu", "cuda") else None


def leaderboard_attentions() -> str:
    """The `attn` values a leaderboard experiment sweeps (`conf/experiment/leaderboard/*.yaml`, through the
    `${leaderboard_attentions:}` resolver): every attention the registry holds, comma-separated, in its order.

    Why from the registry: a hard-coded list in three YAML files went stale as attentions were added (the published
    low-rank and kernel baselines — linformer, performer, skyformer — were never on it); now a new attention joins
    every leaderboard sweep by existing. `attn=...` on the command line replaces the list. Resolved only when Hydra
    reads the sweep's parameters (it imports the attentions, hence torch): `--help` and `--cfg job` never resolve it.
    """
    return ",".join(ATTENTIONS.names())


def quiet_third_party_warnings() -> None:
    """Silence library chatter that says nothing about the run (deprecations inside Lightning, the srun hint
    printed on any machine with SLURM installed, Lightning's marketing tips, the seven "setup plugin alembic.…"
    lines that alembic logs when Hydra loads the Optuna sweeper). Before Hydra starts: it imports the plugins."""
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
    OmegaConf.register_new_resolver("tuned", tuned_value, replace=True)
    OmegaConf.register_new_resolver("slurm_gpus", slurm_gpus, replace=True)
    OmegaConf.register_new_resolver("leaderboard_attentions", leaderboard_attentions, replace=True)
    _DONE = True
