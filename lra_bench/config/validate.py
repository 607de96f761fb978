"""Cross-field checks that a schema cannot express, run before anything is built or trained.

Each failure is one `ConfigError` line naming the key, the value, and what would be valid.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import fields
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from lra_bench.registry import ATTENTIONS, AXES, SELECTORS, UnknownComponent
from models.encoder import POOLINGS
from models.heads import INTERACTIONS

SCHEDULES = ("linear", "cosine", "constant", "rsqrt")
PRECISIONS = ("32-true", "32", "16-mixed", "bf16-mixed", "bf16-true", "64-true")


class ConfigError(ValueError):
    """A configuration mistake; its message is the whole story (no traceback needed)."""


def _device_count(devices: object) -> int | None:
    if isinstance(devices, int):
        return devices
    if isinstance(devices, str) and devices.isdigit():
        return int(devices)
    if isinstance(devices, (list, tuple)) or hasattr(devices, "__len__") and not isinstance(devices, str):
        return len(devices)  # type: ignore[arg-type]
    return None  # "auto", -1: known only at run time


def check_components(cfg: DictConfig) -> None:
    """Each component node (`task`, `attn`, `selector`) against its class's config dataclass: an unknown key (a
    typo in a YAML file or an experiment config) or a value of the wrong type is one line naming the key, the value
    and the valid keys. The checked values (e.g. "64" → 64 for an int knob) replace the node's."""
    for axis, registry in AXES.items():
        node = cfg.get(axis)
        if node is None or (axis == "selector" and node.get("name") == "none"):
            continue
        name = node.get("name")
        try:
            schema = registry.config(str(name))
        except UnknownComponent as err:
            raise ConfigError(str(err)) from None
        try:
            checked = OmegaConf.merge(OmegaConf.structured(schema), node)
        except OmegaConfBaseException as err:
            key = f"{axis}.{err.key}" if getattr(err, "key", None) else axis
            valid = ", ".join(f.name for f in fields(schema))
            reason = str(err).splitlines()[0]
            raise ConfigError(f"{key}: {reason} ({axis}={name} takes: {valid})") from None
        with open_dict(cfg):
            cfg[axis] = checked


def check_selector(cfg: DictConfig) -> None:
    cls = ATTENTIONS.get(cfg.attn.name)
    selector = cfg.selector.name if cfg.get("selector") else "none"
    takers = [n for n in ATTENTIONS.names() if ATTENTIONS.get(n).takes_selector]
    if not cls.takes_selector and selector != "none":
        raise ConfigError(
            f"selector={selector}: attn={cfg.attn.name} takes no landmark selector; drop selector= or use one of "
            f"attn={','.join(takers)}"
        )
    if cls.takes_selector and selector == "none":
        raise ConfigError(
            f"selector=none: attn={cfg.attn.name} needs a landmark selector (e.g. selector=segment_means)"
        )
    if getattr(cls, "needs_token_landmarks", False) and not SELECTORS.get(selector).token_landmarks:
        tokens = [n for n in SELECTORS.names() if SELECTORS.get(n).token_landmarks]
        raise ConfigError(
            f"selector={selector}: attn={cfg.attn.name} needs token landmarks (exact columns of A), and {selector} "
            f"returns cluster means; use one of selector={','.join(tokens)}"
        )


def check_landmarks(cfg: DictConfig) -> None:
    m = cfg.attn.get("num_landmarks")
    if m is None:
        return
    seq_len = int(cfg.task.seq_len)
    if isinstance(m, str):
        if m != "log2":
            raise ConfigError(f"attn.num_landmarks={m!r}: expected a positive integer or 'log2'")
        return
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise ConfigError(f"attn.num_landmarks={m!r}: expected a positive integer or 'log2'")
    if m > seq_len:
        raise ConfigError(f"attn.num_landmarks={m} exceeds task.seq_len={seq_len}; choose m <= {seq_len}")


def check_batch(cfg: DictConfig) -> None:
    batch = int(cfg.data.batch_size)
    if batch < 1:
        raise ConfigError(f"data.batch_size={batch}: must be a positive integer")
    devices = _device_count(cfg.trainer.get("devices", 1))
    nodes = int(cfg.trainer.get("num_nodes", 1))
    if devices is not None and devices > 0 and batch % (devices * nodes):
        raise ConfigError(
            f"data.batch_size={batch} is not divisible by trainer.devices×num_nodes={devices}×{nodes}; "
            f"use a multiple of {devices * nodes}"
        )


def check_choices(cfg: DictConfig) -> None:
    pairs = (
        ("model.pooling", cfg.model.pooling, POOLINGS),
        ("model.interaction", cfg.model.interaction, tuple(INTERACTIONS)),
        ("optim.schedule", cfg.optim.schedule, SCHEDULES),
        ("trainer.precision", str(cfg.trainer.precision), PRECISIONS),
    )
    for key, value, valid in pairs:
        if value not in valid:
            raise ConfigError(f"{key}={value!r}: expected one of {', '.join(valid)}")
    if int(cfg.trainer.max_steps) < 1:
        raise ConfigError(f"trainer.max_steps={cfg.trainer.max_steps}: must be >= 1")
    if int(cfg.optim.warmup_steps) < 0:
        raise ConfigError(f"optim.warmup_steps={cfg.optim.warmup_steps}: must be >= 0")
    if int(cfg.model.num_heads) < 1:
        raise ConfigError(f"model.num_heads={cfg.model.num_heads}: must be >= 1")


def check_writable(output_dir: str | Path) -> None:
    path = Path(output_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ConfigError(
            f"output dir {path} is not writable ({err.strerror}); set output_root= or hydra.run.dir="
        ) from None


def check_resolvable(cfg: DictConfig) -> None:
    """Every interpolation resolves (`${tuned:...}` of `tuning=tuned`, `${oc.env:...}`): else one line naming the key
    and the resolver's own message, instead of a traceback from wherever the value is first read."""
    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or getattr(err, "key", None) or "config"
        message = str(err).splitlines()[0]
        raise ConfigError(f"{key}: {message}") from None


def validate(cfg: DictConfig) -> None:
    check_resolvable(cfg)
    check_components(cfg)
    check_selector(cfg)
    check_landmarks(cfg)
    check_batch(cfg)
    check_choices(cfg)
