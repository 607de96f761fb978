"""The stage keys of a config: `stage` (supervised | pretrain | spt) and the self-pretraining keys checked, and the
derived keys filled (`pretraining`: none | mlm | causal, the key that keeps self-pretrained rows apart from scratch
rows in every comparison; `pretraining_fingerprint`: the pretraining recipe a fine-tune starts from).

Below the run: a run settles them before it records its config (`lra_bench.run.entry.run_stage`), and the protocol
check derives them the same way for the protocol's own config (`lra_bench.config.conformance`), so a derived key
compares as the run derives it. The stages themselves are the run's (`lra_bench.run.pretrain`).
"""

from __future__ import annotations

from omegaconf import DictConfig, open_dict

from lra_bench.config.pretrained_run import PretrainedSource, locate
from lra_bench.errors import ConfigError
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
