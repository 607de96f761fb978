"""`stage=spt` (`python run.py experiment=spt/<task>`): self-pretrain, then fine-tune, in one command.

Two ordinary stages (`lra_bench.run.entry.run_stage` runs the plan `stages` returns), each with its own dir,
lock, checkpoints and record:

    <run dir>/pretrain/   stage=pretrain on the task's training inputs      (this config ⊕ `spt.pretrain`)
    <run dir>/finetune/   stage=supervised, pretrained=<run dir>/pretrain   (this config)

Why one Hydra job rather than a driver that launches two: the job is then like every other — `-m` sweeps, the joblib
and SLURM launchers, requeueing and the end-of-sweep leaderboard need nothing new — and its two stages can never
be paired with the wrong partner (the fine-tune's `pretrained` is its own job's `pretrain/`).

Resuming: re-running the command (or SLURM requeueing the job) skips a pretraining stage whose record is
`completed` with the same configuration fingerprint, and otherwise resumes that stage from its `last.ckpt`; the
fine-tune then resumes from its own `last.ckpt` (its pretrained encoder is overwritten by the checkpoint's state,
so a resumed fine-tune continues exactly). A completed pretraining stage whose configuration has since changed is
refused with the keys that differ — its fine-tunes would otherwise mix two pretraining recipes in one dir.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from lra_bench.config.plain import plain_dict
from lra_bench.config.validate import validate_once
from lra_bench.errors import ConfigError
from lra_bench.record import results
from lra_bench.record.identity import config_identity, differing_keys, fingerprint
from lra_bench.record.reader import read
from lra_bench.run.pretrain import check_pretrain_keys, resolve_stage

PRETRAIN_DIR, FINETUNE_DIR = "pretrain", "finetune"


def drop_nulls(node: Any) -> Any:
    """A fragment without its null leaves (null = keep this run's value) or the mappings left empty by that."""
    if not isinstance(node, dict):
        return node
    out = {k: drop_nulls(v) for k, v in node.items() if v is not None}
    return {k: v for k, v in out.items() if v != {}}


def stage_config(cfg: DictConfig, fragment: Any, **fixed: Any) -> DictConfig:
    """`cfg` with `fragment` (its non-null values) merged over it and the `fixed` top-level keys set."""
    values = drop_nulls(OmegaConf.to_container(fragment, resolve=True) if fragment is not None else {})
    out = OmegaConf.merge(cfg, values)
    assert isinstance(out, DictConfig)
    with open_dict(out):
        for key, value in fixed.items():
            out[key] = value
    return out


def _identity(config: dict[str, Any]) -> dict[str, Any]:
    return config_identity(json.loads(json.dumps(config, default=str)))  # as the record stores it (JSON)


def completed(path: Path, cfg: DictConfig) -> bool:
    """Whether `path` holds a completed run of exactly `cfg` (validated and resolved as `train` would record it);
    a completed run of another configuration is a ConfigError naming the keys that differ."""
    file = path / results.FILENAME
    if not file.exists():
        return False
    try:
        record = read(file)
    except (OSError, ValueError):
        return False
    if record.status != "completed":
        return False
    validate_once(cfg)
    resolve_stage(cfg)
    wanted = _identity(plain_dict(cfg))
    found = _identity(record.config)
    if fingerprint(found) == fingerprint(wanted):
        return True
    keys = differing_keys([found, wanted])
    raise ConfigError(
        f"{path} holds a completed pretraining run of another configuration (differs in: {', '.join(keys[:8])}); "
        "remove that dir or set run_name= for a new one"
    )


def stages(cfg: DictConfig, output_dir: Path) -> list[tuple[DictConfig, Path]]:
    """The stages still to run, in order, as (config, dir): the pretraining stage unless already completed, then the
    fine-tune from it. A plan, not a runner: the entry runs each stage, so this module needs nothing of it."""
    validate_once(cfg)  # fail before either stage starts (a typo, objective=causal with attn=nystrom, …)
    check_pretrain_keys(cfg)
    if cfg.get("pretrained"):
        raise ConfigError(
            f"pretrained={cfg.pretrained}: stage=spt pretrains its own encoder (in <run dir>/{PRETRAIN_DIR}); drop "
            "pretrained=, or fine-tune an existing pretraining run with stage=supervised pretrained=<its run dir>"
        )
    # The job dir holds no record of its own (its stages do): a results.json there is the launcher's failure note
    # for an earlier attempt (LeaderboardCallback.on_job_end) and would list this job as failed once it succeeds.
    (Path(output_dir) / results.FILENAME).unlink(missing_ok=True)
    pre_dir, fine_dir = Path(output_dir) / PRETRAIN_DIR, Path(output_dir) / FINETUNE_DIR
    pre_cfg = stage_config(cfg, cfg.spt.get("pretrain"), stage="pretrain", pretrained=None, pretraining=None)
    plan = []
    if completed(pre_dir, pre_cfg):
        print(f"[lra-bench] spt: pretraining stage already completed in {pre_dir}; fine-tuning from it")
    else:
        plan.append((pre_cfg, pre_dir))
    fine_cfg = stage_config(cfg, None, stage="supervised", pretrained=str(pre_dir), pretraining=None)
    return [*plan, (fine_cfg, fine_dir)]
