"""Checks run before anything is built or trained: component schemas, the types and ranges of every other knob
(`RULES`), cross-field constraints a schema cannot express, and the paths a run reads and writes.

Each failure is one `ConfigError` line naming the key, the value, and what would be valid.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from hydra.utils import get_object
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from lra_bench.errors import ConfigError, IncompatibleCombination
from lra_bench.record.checkpoint_file import load_usable
from lra_bench.registry import ATTENTIONS, AXES, SELECTORS, UnknownComponent

SCHEDULES = ("linear", "cosine", "constant", "rsqrt", "onecycle")
PRECISIONS = ("32-true", "32", "16-mixed", "bf16-mixed", "bf16-true", "64-true")


def _device_count(devices: object) -> int | None:
    if isinstance(devices, int):
        return devices
    if isinstance(devices, str) and devices.isdigit():
        return int(devices)
    if isinstance(devices, (list, tuple)) or hasattr(devices, "__len__") and not isinstance(devices, str):
        return len(devices)
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
        raise IncompatibleCombination(
            f"selector={selector}: attn={cfg.attn.name} takes no landmark selector; drop selector= or use one of "
            f"attn={','.join(takers)}"
        )
    if cls.takes_selector and selector == "none":
        raise IncompatibleCombination(
            f"selector=none: attn={cfg.attn.name} needs a landmark selector (e.g. selector=segment_means)"
        )
    if getattr(cls, "needs_token_landmarks", False) and not SELECTORS.get(selector).token_landmarks:
        tokens = [n for n in SELECTORS.names() if SELECTORS.get(n).token_landmarks]
        raise IncompatibleCombination(
            f"selector={selector}: attn={cfg.attn.name} needs token landmarks (exact columns of A), and {selector} "
            f"returns cluster means; use one of selector={','.join(tokens)}"
        )


def check_landmarks(cfg: DictConfig) -> None:
    m = cfg.attn.get("num_landmarks")
    if m is None or m == "log2":
        return
    if not _is_int(m) or m < 1:
        raise ConfigError(f"attn.num_landmarks={m!r}: expected a positive integer or 'log2'")
    seq_len = int(cfg.task.seq_len)
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
    from models.encoder import KERNELS, POOLINGS, UNSET_KERNELS  # here, not at the top: the CLI's --help / --cfg
    from models.heads import INTERACTIONS  # must not import torch

    pairs = (
        ("model.pooling", cfg.model.pooling, POOLINGS),
        ("model.kernels", cfg.model.get("kernels", UNSET_KERNELS), KERNELS),
        ("model.interaction", cfg.model.interaction, tuple(INTERACTIONS)),
        ("optim.schedule", cfg.optim.schedule, SCHEDULES),
        ("trainer.precision", str(cfg.trainer.precision), PRECISIONS),
    )
    for key, value, valid in pairs:
        if value not in valid:
            raise ConfigError(f"{key}={value!r}: expected one of {', '.join(valid)}")


# -- types and ranges of the non-component knobs ----------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """What a knob must be: `ok(value)` decides, `valid` says it in words (for the error line)."""

    ok: Callable[[Any], bool]
    valid: str


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def integer(lo: int = 0, hi: int | None = None) -> Rule:
    span = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
    return Rule(lambda v: _is_int(v) and v >= lo and (hi is None or v <= hi), span)


def number(lo: float, *, above: bool = True, hi: float | None = None, below: bool = False) -> Rule:
    """A finite number `> lo` (`above`) or `>= lo`, and `< hi` (`below`) or `<= hi` when `hi` is given."""

    def ok(v: Any) -> bool:
        if not _is_num(v) or (v <= lo if above else v < lo):
            return False
        return hi is None or (v < hi if below else v <= hi)

    low = f"> {lo:g}" if above else f">= {lo:g}"
    high = "" if hi is None else (f" and < {hi:g}" if below else f" and <= {hi:g}")
    return Rule(ok, f"a number {low}{high}")


def one_of(*rules: Rule) -> Rule:
    return Rule(lambda v: any(r.ok(v) for r in rules), " or ".join(r.valid for r in rules))


def choice(*values: Any) -> Rule:
    return Rule(lambda v: v in values and type(v) in {type(x) for x in values}, "one of " + ", ".join(map(str, values)))


NONE = Rule(lambda v: v is None, "null")
BOOL = Rule(lambda v: isinstance(v, bool), "true or false")
FRACTION = number(0.0, hi=1.0, below=True)  # in (0, 1)
INDEX_LIST = Rule(
    lambda v: v is None or (isinstance(v, list) and all(_is_int(i) and i >= 0 for i in v)),
    "null or a list of indices >= 0",
)
BETAS = Rule(
    lambda v: isinstance(v, list) and len(v) == 2 and all(_is_num(b) and 0 <= b < 1 for b in v),
    "two numbers in [0, 1), e.g. [0.9, 0.999]",
)
STEP_FRACTION = one_of(integer(1), number(0.0, hi=1.0))  # Lightning's "N batches or this fraction of them"

#: every non-component knob a run reads, with what it must be (component nodes: `check_components`)
RULES: dict[str, Rule] = {
    "seed": integer(0, 2**32 - 1),  # numpy's and Lightning's seed range
    "threads": one_of(NONE, integer(1)),
    "train": BOOL,
    "test": BOOL,
    "print_config": BOOL,
    **{f"model.{size}": integer(1) for size in ("dim", "depth", "num_heads", "head_dim", "ffn_dim", "head_hidden")},
    "model.dropout": number(0.0, above=False, hi=1.0, below=True),
    "optim.lr": number(0.0),
    "optim.weight_decay": number(0.0, above=False),
    "optim.betas": BETAS,
    "optim.eps": number(0.0),
    "optim.warmup_steps": integer(0),
    "optim.grad_clip_val": one_of(NONE, number(0.0)),
    "optim.grad_clip_algorithm": choice("norm", "value"),
    "data.batch_size": integer(1),
    "data.eval_batch_size": one_of(NONE, integer(1)),
    "data.num_workers": integer(0),
    "trainer.max_steps": integer(1),
    "trainer.val_check_interval": STEP_FRACTION,
    "trainer.limit_val_batches": STEP_FRACTION,
    "trainer.limit_test_batches": STEP_FRACTION,
    "trainer.log_every_n_steps": integer(1),
    "trainer.accumulate_grad_batches": integer(1),
    "trainer.num_sanity_val_steps": one_of(integer(0), choice(-1)),
    "trainer.num_nodes": integer(1),
    "trainer.deterministic": one_of(BOOL, choice("warn")),
    "diagnostics.enabled": BOOL,
    "diagnostics.every_n_validations": integer(1),
    "diagnostics.max_len": integer(1),
    "diagnostics.probe_size": integer(1),
    "diagnostics.rank_tol": number(0.0),
    "diagnostics.heads": INDEX_LIST,
    "diagnostics.layers": INDEX_LIST,
    "callbacks.checkpoint_every_n_steps": one_of(NONE, integer(1)),
    "callbacks.stats_warmup_steps": integer(0),
    "callbacks.progress_bar": one_of(choice("auto", "bar", "status", "none"), BOOL),
    "callbacks.status_every_s": number(0.0),
    "task.max_length": integer(1),
    "task.seq_len": integer(1),
    "attn.window": integer(1),  # attn=local: tokens on each side (checked here so a 0 is one line, not a traceback)
}


def check_table(cfg: DictConfig, rules: dict[str, Rule]) -> None:
    """Every key of `rules` that `cfg` has, against its rule (absent keys are the schema's business)."""
    for key, rule in rules.items():
        try:
            value = OmegaConf.select(cfg, key, throw_on_missing=True, default=_ABSENT)
        except OmegaConfBaseException as err:
            raise ConfigError(f"{key}: {str(err).splitlines()[0]}") from None
        if value is _ABSENT:
            continue
        if isinstance(value, (DictConfig, ListConfig)):
            value = OmegaConf.to_container(value, resolve=True)
        if not rule.ok(value):
            raise ConfigError(f"{key}={value!r}: expected {rule.valid}")


def check_rules(cfg: DictConfig) -> None:
    """`RULES`, every `task.*_fraction` in (0, 1), and `task.max_length <= task.seq_len` (every task)."""
    fractions = {f"task.{k}": FRACTION for k in cfg.get("task", {}) if str(k).endswith("_fraction")}
    check_table(cfg, {**RULES, **fractions})
    if int(cfg.task.max_length) > int(cfg.task.seq_len):
        raise ConfigError(
            f"task.max_length={cfg.task.max_length} exceeds task.seq_len={cfg.task.seq_len}: sequences are cut to "
            f"max_length and padded to seq_len; set task.max_length <= {cfg.task.seq_len}"
        )


_ABSENT = object()


# -- paths ------------------------------------------------------------------------------------------------------
def _nearest_existing(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_dir_path(key: str, value: str | Path) -> None:
    """`value` is a directory, or can become one: neither it nor a parent is a file."""
    path = Path(str(value)).expanduser()
    existing = _nearest_existing(path)
    if not existing.is_dir():
        where = "" if existing == path.absolute() else f" ({existing} is a file)"
        raise ConfigError(f"{key}={value}: not a directory{where}; give {key}= a directory (or a new path)")


def check_paths(cfg: DictConfig) -> None:
    for key in ("data_dir", "cache_dir", "output_root"):
        if cfg.get(key) is not None:
            check_dir_path(key, cfg[key])
    check_ckpt_path(cfg)


#: folders a run makes when they are missing, whose value the user types: a mistyped one must not be made whole
TYPED_FOLDERS = ("data_dir",)


def check_typed_folders(cfg: DictConfig, given: Iterable[str]) -> None:
    """Each `TYPED_FOLDERS` key among `given` (the keys the command line sets) names an existing folder or a new
    one inside an existing folder. A run makes its data dir with every missing parent, so a typo in the parent
    (`data_dir=/scratc/me/lra`) used to generate a whole data set there and train on it."""
    for key in set(TYPED_FOLDERS) & set(given):
        value = cfg.get(key)
        parent = Path(str(value)).expanduser().absolute().parent
        if value is not None and not parent.is_dir():
            raise ConfigError(
                f"{key}={value}: {parent} does not exist; give {key}= an existing folder or a new one inside an "
                "existing folder"
            )


RESUME_CHOICES = (None, "none", "null", "last")


def check_ckpt_path(cfg: DictConfig) -> None:
    """An explicit `ckpt_path` is a checkpoint that loads weights-only (before any data is built for it)."""
    value = cfg.get("ckpt_path")
    if value in RESUME_CHOICES:
        return
    path = Path(str(value)).expanduser()
    if not path.is_file():
        raise ConfigError(f"ckpt_path={value}: no such file; use 'last', null, or an existing .ckpt")
    load_usable(path, shown=value)


def check_writable(output_dir: str | Path, key: str = "output dir") -> None:
    """The run dir exists or can be made, and a file can be created there (a real probe: root ignores modes)."""
    path = Path(output_dir)
    check_dir_path(key, path)
    try:  # probe the dir, or the nearest parent it would be made in: nothing is created by the check
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=_nearest_existing(path))
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ConfigError(
            f"output dir {path} is not writable ({err.strerror}); set output_root= or run_name=, or fix its permissions"
        ) from None


#: the name of the link to the newest run of a task and attention (`lra_bench.run.rundir.point_latest` makes it), here
#: with the check that keeps every run out of it
LINK = "latest"


def check_run_name(cfg: DictConfig) -> None:
    """`run_name=latest` would land in the link to the newest run (`lra_bench.run.rundir`), i.e. in another run."""
    if str(cfg.get("run_name")) == LINK:
        raise ConfigError(
            f"run_name={LINK}: that name is the link to the newest run of a task and attention; choose another name"
        )


def check_resolvable(cfg: DictConfig) -> Any:
    """Every interpolation resolves (`${tuned:...}` of `tuning=tuned`, `${oc.env:...}`): else one line naming the key
    and the resolver's own message, instead of a traceback from wherever the value is first read. Returns the
    resolved container."""
    try:
        return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or getattr(err, "key", None) or "config"
        message = str(err).splitlines()[0]
        raise ConfigError(f"{key}: {message}") from None


# -- user callbacks ---------------------------------------------------------------------------------------------
def callback_nodes(cfg: DictConfig) -> dict[str, DictConfig]:
    """The `_target_` nodes under `callbacks:` (the harness's own settings are the scalar keys beside them)."""
    node = cfg.get("callbacks") or {}
    out = {}
    for name, value in node.items():
        if isinstance(value, DictConfig):
            if "_target_" not in value:
                raise ConfigError(
                    f"callbacks.{name}: a node under callbacks: must be a Lightning callback with a _target_ "
                    f"(e.g. +callbacks.{name}._target_=pytorch_lightning.callbacks.LearningRateMonitor)"
                )
            out[str(name)] = value
    return out


def check_callback_targets(cfg: DictConfig) -> None:
    """Each `callbacks.<name>._target_` imports (built later, in `lra_bench.run.build`)."""
    # get_object logs a failed lookup at ERROR (three lines) before it re-raises; the ConfigError below is the one
    # line the user sees, so Hydra's logger is muted for the lookup.
    hydra_log = logging.getLogger("hydra.utils")
    for name, node in callback_nodes(cfg).items():
        target = node["_target_"]
        muted, hydra_log.disabled = hydra_log.disabled, True
        try:
            get_object(str(target))
        except Exception as err:
            cause = err.__cause__ or err
            reason = f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
            raise ConfigError(f"callbacks.{name}._target_={target}: cannot import it ({reason})") from None
        finally:
            hydra_log.disabled = muted


#: digests of the resolved configs `validate` accepted in this process (`validate_once`)
_ACCEPTED: set[str] = set()


def _digest(resolved: Any) -> str:
    return hashlib.sha256(json.dumps(resolved, sort_keys=True, default=str).encode()).hexdigest()


def validate(cfg: DictConfig) -> None:
    """Every check above, in order; the first failure is one `ConfigError` line. Leaves the component nodes typed
    (`check_components`) and remembers the config as accepted (`validate_once`)."""
    _check_resolved(cfg, _digest(check_resolvable(cfg)))


def _check_resolved(cfg: DictConfig, digest: str) -> None:
    """The checks after `check_resolvable`, then `digest` (of the resolved config) remembered as accepted."""
    check_components(cfg)
    check_rules(cfg)
    check_paths(cfg)
    check_run_name(cfg)
    check_callback_targets(cfg)
    check_selector(cfg)
    check_landmarks(cfg)
    check_batch(cfg)
    check_choices(cfg)
    _ACCEPTED.add(digest)


def validate_once(cfg: DictConfig) -> None:
    """`validate(cfg)`, unless this process accepted a config with the same resolved values already: then only its
    component nodes are typed, as `validate` leaves them.

    Why: the same config reaches the checks more than once in one process — `run.py`'s pre-flight checks the
    config it composed before Hydra composes it again for the run; the checked sweeper checks every job before an
    in-process launcher runs it; `stage=spt` checks its plan before each stage runs. The run path calls this, so a
    config is checked once; an equal config means equal answers (the checks read the values, the paths and the
    importable callback targets, none of which a run changes before its stage starts).
    """
    digest = _digest(check_resolvable(cfg))  # resolved once, whichever way it goes
    if digest in _ACCEPTED:
        check_components(cfg)
        return
    _check_resolved(cfg, digest)
