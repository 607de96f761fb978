"""Off-protocol: which values of its protocol a run changed, so its numbers are never shown as the paper's.

The reference is the protocol's own config for the run's method: `conf/` composed (Hydra's compose API, the same
tree) with only `task=<t> protocol=<p> attn=<a> selector=<s>` and without the personal `local` settings, then put
through the same derivation a run applies before it records its config (`derive_run_keys`: the stage keys, e.g.
`pretraining: null` → `"none"`), so a derived key compares as the run derives it. Every identity key whose value
differs there is a deviation, except:

* the method's own knobs (`attn.*`, `selector.*`): choosing and tuning the method is what a run compares —
  except those the protocol itself sets for that attention and selector (`conf/protocol_attn/<protocol>_<attn>.yaml`,
  `conf/protocol_selector/<protocol>_<selector>.yaml`: the
  sizes and quirks of the reference code's own attention, e.g. Skyformer's 128 landmarks). A run that changes one
  of those trains another network than the protocol's, so it is a deviation;
* `seed` (a protocol runs several);
* the kernel choices (`attn.kernel`, `selector.kernel`, `model.kernels`: `lra_bench.record.identity.KERNEL_CHOICES`):
  the same network computed another way, at fp32 rounding and with another dropout stream;
* `diagnostics.*`: they measure the model on a probe (no gradients, RNG restored; see
  `lra_bench.diagnostics.callback`) and never change a trained weight or a test prediction;
* the data part of the identity (`data.tokens`): the protocol has no value for it;
* logistics, which are no part of the identity anyway (`lra_bench.record.identity.LOGISTICS`).

So `trainer.max_steps=4`, `debug=fdr`, a smaller model, `optim.lr=...` or `trainer.precision=bf16-mixed` each
make a run off-protocol; `attn.num_landmarks=32` under a protocol that sets no landmark count, or `selector=kmeans`,
does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf

from lra_bench.config.compose import CONF_DIR, compose_config
from lra_bench.config.pretrained_run import PretrainedSource
from lra_bench.config.stages import resolve_stage
from lra_bench.config.validate import check_components
from lra_bench.kit.plain import plain_dict
from lra_bench.record.identity import (
    DATA_KEYS,
    KERNEL_CHOICES,
    MEASUREMENT,
    config_identity,
    differing_keys,
    flatten,
    under,
)

#: identity prefixes a run may change and stay on its protocol (see the module docstring)
METHOD_AND_MEASUREMENT: tuple[str, ...] = ("attn", "selector", "seed", *KERNEL_CHOICES, *MEASUREMENT, *DATA_KEYS)


def derive_run_keys(cfg: Any) -> PretrainedSource | None:
    """Settle `cfg` as `lra_bench.run.entry.run_stage` does before a stage records the config: the components' typed
    values (`check_components`, which `validate` runs first) and the derived stage keys (`resolve_stage`:
    `pretraining`, `pretraining_fingerprint`). Returns `resolve_stage`'s result (the run a fine-tune starts from,
    or None)."""
    check_components(cfg)
    return resolve_stage(cfg)


def protocol_identity(task: str, protocol: str, attn: str, selector: str | None) -> dict[str, Any]:
    """The config identity of `task × protocol × attn × selector` as the protocol defines it, with the derived keys
    filled as a run of that config fills them."""
    overrides = [f"task={task}", f"protocol={protocol}", f"attn={attn}", f"selector={selector or 'none'}", "~local"]
    cfg = compose_config(overrides)
    derive_run_keys(cfg)
    return config_identity(plain_dict(cfg))


def protocol_method_keys(protocol: str, attn: str, selector: str | None) -> tuple[str, ...]:
    """The `attn.*` / `selector.*` keys (dotted) that the protocol sets for this attention and selector: the leaves
    of its `protocol_attn/<protocol>_<attn>.yaml` and `protocol_selector/<protocol>_<selector>.yaml` (none without
    such files)."""
    paths = [CONF_DIR / "protocol_attn" / f"{protocol}_{attn}.yaml"]
    paths += [CONF_DIR / "protocol_selector" / f"{protocol}_{selector}.yaml"] if selector else []
    keys = [k for p in paths if p.is_file() for k in flatten(plain_dict(OmegaConf.load(p)))]
    return tuple(sorted(k for k in keys if under(k, ("attn", "selector"))))


def deviations(
    identity: Mapping[str, Any], reference: Mapping[str, Any], bound: tuple[str, ...] = ()
) -> dict[str, dict[str, Any]]:
    """`{key: {"protocol": value, "run": value}}` for every key the run changed (a key only one side has shows
    the other side as None); the method's own knobs count only where `bound` names them (`protocol_method_keys`)."""
    keys = differing_keys([identity, reference], ignore=METHOD_AND_MEASUREMENT)
    keys += [k for k in differing_keys([identity, reference]) if k in bound]
    return {k: {"protocol": reference.get(k), "run": identity.get(k)} for k in sorted(keys) if not under(k, DATA_KEYS)}


def check(identity: Mapping[str, Any], task: str, protocol: str, attn: str, selector: str | None) -> dict[str, Any]:
    """`{"off_protocol": bool | None, "deviations": {...} | None}` for the record; None when the protocol's config
    cannot be composed (an unknown protocol or task: then nothing can be claimed either way)."""
    try:
        reference = protocol_identity(task, protocol, attn, selector)
    except Exception:
        return {"off_protocol": None, "deviations": None}
    found = deviations(identity, reference, protocol_method_keys(protocol, attn, selector))
    return {"off_protocol": bool(found), "deviations": found}
