"""The locality study's command line: its own keys, checked, and everything else passed to every run.

`python -m lra_bench.locality [windows=[…]] [methods=[…]] [seeds=[…]] [out=DIR] [run.py overrides …]`. The study's
keys are parsed as OmegaConf values (so `windows=[4,16,64]` is a list, as on a Hydra command line); every other
argument is a `run.py` override given to every run alike — that is what puts the windows and the methods at equal
budget (the same task, data, model, optimiser and steps; only `attn` differs). A bad study key is one line naming
the key, the value and what is valid (`SettingsError`, exit 2); a bad run override is refused by `run.py`'s own
pre-flight on the first run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lra_bench.registry import ATTENTIONS

#: the study's own keys and their defaults (each written here once)
DEFAULT_WINDOWS = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_METHODS = ("full", "gpa")
DEFAULT_SEEDS = (0,)
DEFAULT_OUT = "outputs/locality"
#: overrides every run gets unless the command line sets the same key: no W&B, no progress bar, no config dump
RUN_DEFAULTS = ("logger=csv", "callbacks.progress_bar=false", "print_config=false")
#: keys whose values are paths of the machine a study ran on: left out of the command and overrides it shows
PATH_KEYS = ("out", "data_dir", "cache_dir", "output_root")
#: run overrides the study sets itself, per run
OWN_RUN_KEYS = ("attn", "attn.window", "seed", "output_root", "run_name")


class SettingsError(ValueError):
    """A bad study setting: the message is the whole story (one line, exit 2)."""


@dataclass(frozen=True)
class Settings:
    windows: tuple[int, ...] = DEFAULT_WINDOWS
    methods: tuple[str, ...] = DEFAULT_METHODS
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    out: Path = Path(DEFAULT_OUT)
    run_overrides: tuple[str, ...] = field(default_factory=tuple)


def _key(arg: str) -> str:
    return arg.split("=", 1)[0].lstrip("+~")


def shown(args: list[str] | tuple[str, ...]) -> list[str]:
    """`args` without the ones naming a path of this machine (`PATH_KEYS`): what a page may show."""
    return [a for a in args if _key(a) not in PATH_KEYS]


def _integers(key: str, value: Any, low: int) -> tuple[int, ...]:
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(v, int) and not isinstance(v, bool) and v >= low for v in items):
        raise SettingsError(f"{key}={value!r}: expected a non-empty list of integers >= {low}, e.g. {key}=[1,4,16]")
    if len(set(items)) != len(items):
        raise SettingsError(f"{key}={value!r}: a value is listed twice")
    return tuple(sorted(items))


def _methods(value: Any) -> tuple[str, ...]:
    items = value if isinstance(value, list) else [value]
    valid = [name for name in ATTENTIONS.names() if name != "local"]
    bad = [m for m in items if m not in valid]
    if not items or bad or len(set(items)) != len(items):
        raise SettingsError(
            f"methods={value!r}: expected a list of distinct attentions other than local (they train beside its "
            f"windows), from: {', '.join(valid)}"
        )
    return tuple(str(m) for m in items)


def parse(argv: list[str]) -> Settings:
    """The study's settings from `argv` (`key=value` words)."""
    own: dict[str, Any] = {}
    passed: list[str] = []
    for arg in argv:
        if "=" not in arg:
            raise SettingsError(f"{arg!r}: expected key=value (a study key: windows, methods, seeds, out; or a run.py "
                                "override such as task=listops)")  # fmt: skip
        key = _key(arg)
        if key in ("windows", "methods", "seeds", "out"):
            try:
                own[key] = OmegaConf.to_container(OmegaConf.from_dotlist([arg]), resolve=True)[key]  # type: ignore[call-overload,index]
            except OmegaConfBaseException as err:
                raise SettingsError(f"{arg}: {str(err).splitlines()[0]}") from None
        elif key in OWN_RUN_KEYS:
            raise SettingsError(f"{arg}: the study sets {key} for each run itself (windows=, methods=, seeds=, out=)")
        else:
            passed.append(arg)
    given = {_key(a) for a in passed}
    defaults = [d for d in RUN_DEFAULTS if _key(d) not in given]
    return Settings(
        windows=_integers("windows", own["windows"], 1) if "windows" in own else DEFAULT_WINDOWS,
        methods=_methods(own["methods"]) if "methods" in own else DEFAULT_METHODS,
        seeds=_integers("seeds", own["seeds"], 0) if "seeds" in own else DEFAULT_SEEDS,
        out=Path(str(own.get("out", DEFAULT_OUT))),
        run_overrides=(*defaults, *passed),
    )
