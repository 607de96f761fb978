"""The stage keys of a config: `stage` (supervised | pretrain | spt) and the self-pretraining keys checked, and the
derived keys filled (`pretraining`: none | mlm | causal, the key that keeps self-pretrained rows apart from scratch
rows in every comparison; `pretraining_fingerprint`: the pretraining recipe a fine-tune starts from).

Below the run: a run settles them before it records its config (`lra_bench.config.spec.settle`), and the protocol
check derives them the same way for the protocol's own config (`lra_bench.config.conformance`), so a derived key
compares as the run derives it. `stage=spt` is planned here too (`plan`: each stage's config and dir, from the
config and the records already on disk), so the run only runs stages; the stages themselves are the run's
(`lra_bench.run.pretrain`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from lra_bench.config.pretrained_run import PretrainedSource, locate
from lra_bench.config.validate import validate_once
from lra_bench.errors import ConfigError
from lra_bench.kit.plain import plain_dict
from lra_bench.record import results
from lra_bench.record.identity import config_identity, differing_keys, fingerprint
from lra_bench.record.reader import read
from lra_bench.registry import ATTENTIONS

STAGES = ("supervised", "pretrain", "spt")
LOSSES = ("ce", "l1")


def check_pretrain_keys(cfg: DictConfig) -> None:
    """`objective`, `spt.*` and causal support, for a run that pretrains (one ConfigError line on a mistake)."""
    # the objectives live with the task's pretraining view (torch, Lightning): loaded only for a run that pretrains,
    # so the config layer itself loads neither
    from tasks.masking import OBJECTIVES

    objective = str(cfg.objective)
    if objective not in OBJECTIVES:
        raise ConfigError(f"objective={objective!r}: expected one of {', '.join(OBJECTIVES)}")
    attn = str(cfg.attn.name)
    if objective == "causal" and not ATTENTIONS.get(attn).supports_causal:
        causal = [n for n in ATTENTIONS.names() if ATTENTIONS.get(n).supports_causal]
        raise ConfigError(
            f"objective=causal: attn={attn} has no causal form (every query would see later keys through its "
            f"approximation); use objective=mlm, or one of {' '.join(f'attn={n}' for n in causal)}"
        )
    ratio = float(cfg.spt.mask_ratio)
    if objective == "mlm" and not 0.0 < ratio <= 1.0:
        raise ConfigError(f"mask_ratio={ratio}: must be in (0, 1] (the share of real tokens masked)")
    if str(cfg.spt.loss) not in LOSSES:
        raise ConfigError(f"loss={cfg.spt.loss!r}: expected one of {', '.join(LOSSES)}")
    holdout = float(cfg.spt.holdout_fraction)
    if not 0.0 < holdout < 1.0:
        raise ConfigError(f"holdout_fraction={holdout}: must be in (0, 1) (the pretraining curve's share)")


def resolve_stage(cfg: DictConfig) -> PretrainedSource | None:
    """Check the stage keys and fill the derived ones (`pretraining`, `pretraining_fingerprint`) in `cfg`.

    Returns the `PretrainedSource` a fine-tune starts from (None otherwise)."""
    stage = str(cfg.get("stage", "supervised"))
    if stage not in STAGES:
        raise ConfigError(f"stage={stage!r}: expected one of {', '.join(STAGES)}")
    source, fingerprint = None, None
    if stage == "pretrain" and cfg.get("pretrained"):
        raise ConfigError(
            f"pretrained={cfg.pretrained}: stage=pretrain starts from scratch; drop pretrained= (or use "
            "stage=supervised to fine-tune from it)"
        )
    if stage in ("pretrain", "spt"):
        check_pretrain_keys(cfg)
        derived = str(cfg.objective)
    elif cfg.get("pretrained"):
        source = locate(cfg)
        derived, fingerprint = source.objective, source.family_fingerprint
    else:
        derived = "none"
    given = cfg.get("pretraining")
    if given not in (None, derived):
        raise ConfigError(
            f"pretraining={given}: this key is derived (here: {derived}); drop it — set stage=pretrain "
            "objective=... to pretrain, or pretrained=<run dir> to fine-tune"
        )
    with open_dict(cfg):
        cfg.pretraining = derived
        cfg.pretraining_fingerprint = fingerprint
    return source


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
    wanted, found = _identity(plain_dict(cfg)), _identity(record.config)
    if fingerprint(found) == fingerprint(wanted):
        return True
    keys = differing_keys([found, wanted])
    raise ConfigError(
        f"{path} holds a completed pretraining run of another configuration (differs in: {', '.join(keys[:8])}); "
        "remove that dir or set run_name= for a new one"
    )


def plan(cfg: DictConfig, output_dir: Path) -> list[tuple[DictConfig, Path]]:
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
