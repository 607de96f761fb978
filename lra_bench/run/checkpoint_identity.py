"""What a checkpoint says about the experiment that made it, and the checks a run makes before using one.

Every checkpoint the harness writes carries, under the top-level key `lra_bench` (plain types, so it loads with
`weights_only=True`):

    format       "lra-bench/checkpoint-meta/1"
    fingerprint  the run's fingerprint (`lra_bench.record.identity.fingerprint`)
    identity     the run's identity (flat dict)
    config       the run's resolved config (what `python -m lra_bench.evaluate` rebuilds the model from)
    code         {commit, dirty} of the segment that wrote it
    segments     [{started_at, from_step, code, kernels}] one per process that trained this run so far (`kernels`:
                 the kernel choices it ran with, `attn.kernel` / `model.kernels`, so a resume on the other path shows)

Before a checkpoint is used (resumed, or tested by the eval entry), `check_fits` refuses with one line a file that
does not load, or one made by another model: its `ARCHITECTURE` keys (task shape, model, attention, selector) differ
from the run's ("checkpoint X was made with attn.name="nystrom", model.dim=64; this run has …"). A checkpoint
without the metadata (written before it existed, or by hand) is checked by its state dict's names and shapes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from lra_bench.errors import ConfigError
from lra_bench.record.builder import now
from lra_bench.record.identity import architecture, describe, differing_keys, kernel_choices
from lra_bench.record.provenance import code_label
from lra_bench.run import checkpointing

META_KEY = "lra_bench"
META_FORMAT = "lra-bench/checkpoint-meta/1"


class IdentityStamp(pl.Callback):
    """Writes the run's identity into every checkpoint and keeps the list of training segments: each attempt's
    start (`started_at`, `from_step`, `code`, and the `kernels` it computes with: a checkpoint resumes under the
    other kernel choice, `lra_bench.record.identity.KERNEL_CHOICES`) and, at every checkpoint it saves, how far it got
    (`saved_at`, `to_step`) — so the wall time that made the weights is known even for an attempt that was killed."""

    def __init__(self, identity: dict[str, Any], fingerprint: str, config: dict[str, Any], code: dict) -> None:
        self.identity, self.fingerprint, self.config, self.code = identity, fingerprint, config, code
        self.segments: list[dict[str, Any]] = []

    @property
    def state_key(self) -> str:
        return "IdentityStamp"

    def state_dict(self) -> dict[str, Any]:
        return {"segments": list(self.segments)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.segments = list(state_dict.get("segments", []))

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.segments.append(
            {
                "started_at": now(),
                "from_step": int(trainer.global_step),
                "code": self.code,
                "kernels": kernel_choices(self.identity),
            }
        )

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        if self.segments:  # how far this attempt got, and when: a segment's wall time is saved_at − started_at
            self.segments[-1].update(saved_at=now(), to_step=int(trainer.global_step))
        checkpoint[META_KEY] = {
            "format": META_FORMAT,
            "fingerprint": self.fingerprint,
            "identity": self.identity,
            "config": self.config,
            "code": self.code,
            "segments": list(self.segments),
        }


def load(path: str | Path) -> dict[str, Any]:
    """The checkpoint at `path` (weights-only), or a one-line `ConfigError` saying why it cannot be used."""
    checkpointing.require_usable(path)
    return checkpointing.load_checkpoint(path)


def meta_of(checkpoint: dict[str, Any]) -> dict[str, Any] | None:
    meta = checkpoint.get(META_KEY)
    return meta if isinstance(meta, dict) and meta.get("format") == META_FORMAT else None


def check_fits(
    path: str | Path, identity: dict[str, Any], module: Any | None = None, checkpoint: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Load the checkpoint at `path` (unless it is given, as already loaded) and refuse it (one line) when it was
    made by another model than `identity` describes (or, without metadata, when its state dict does not fit
    `module`). Returns the checkpoint."""
    if checkpoint is None:
        checkpoint = load(path)
    meta = meta_of(checkpoint)
    if meta is not None:
        made, this = architecture(meta.get("identity") or {}), architecture(identity)
        keys = sorted(  # the component names first, then changed values, then knobs only one side has
            differing_keys([made, this]),
            key=lambda k: (not k.endswith(".name"), k not in made or k not in this, k),
        )
        if keys:
            raise ConfigError(
                f"checkpoint {path} was made with {describe(made, keys)}; this run has {describe(this, keys)} "
                "(use a checkpoint of this model, or the overrides it was trained with)"
            )
    elif module is not None:
        problem = state_dict_mismatch(checkpoint.get("state_dict") or {}, module.state_dict())
        if problem:
            raise ConfigError(f"checkpoint {path} does not fit this model: {problem}")
    return checkpoint


def state_dict_mismatch(saved: dict[str, Any], expected: dict[str, Any]) -> str | None:
    """Missing, unexpected and differently shaped tensors (a lazily sized buffer, shape `[0]`, takes any shape)."""
    missing = [k for k in expected if k not in saved]
    unexpected = [k for k in saved if k not in expected]
    shapes = [
        f"{k} {tuple(saved[k].shape)} vs {tuple(v.shape)}"
        for k, v in expected.items()
        if k in saved and hasattr(v, "shape") and v.numel() > 0 and tuple(saved[k].shape) != tuple(v.shape)
    ]
    parts = []
    for label, items in (("missing", missing), ("unexpected", unexpected), ("shape", shapes)):
        if items:
            parts.append(f"{label}: {', '.join(items[:3])}{', …' if len(items) > 3 else ''}")
    return "; ".join(parts) or None


def warn_if_code_changed(checkpoint: dict[str, Any], code: dict[str, Any], path: str) -> str | None:
    """Warn (and return the warning) when the code differs from the one that wrote `checkpoint`'s last segment."""
    meta = meta_of(checkpoint)
    if meta is None:
        return None
    before = meta.get("code") or {}
    if (before.get("commit"), before.get("dirty")) == (code.get("commit"), code.get("dirty")):
        return None
    message = (
        f"[lra-bench] warning: the code changed since {path} was written ({code_label(before)} → "
        f"{code_label(code)}); resuming anyway — the record lists every segment's code in run.segments"
    )
    if getattr(rank_zero_only, "rank", 0) == 0:
        print(message, file=sys.stderr, flush=True)
    return message
