"""The config that runs is the config that was checked: a single run's config is composed twice, and compared.

`run.py` and `python -m lra_bench.bench` start with the pre-flight (`lra_bench.preflight.command_line`), which
composes a single run's config through Hydra's compose API and checks it, so that bad input is one line and exit 2
before Hydra writes anything; then they call their `@hydra.main` function, and Hydra composes the config again for the
job, as it always does. Both read the same files with the same overrides, so the two agree — unless something
changed between them (a file under conf/ edited in between, a resolver, plugin or search path that composes
differently the second time). Then a run would train on a config nobody checked.

So the app hands the checked config to `remember_checked` (this process only: a module-level value), and the job's
first step is `check_unchanged(cfg)` on the config Hydra passed: the two digests (`config_digest`) must be equal,
or the run stops with one line naming the first key that differs, exit 2, before anything runs. A job with no
checked config in its process compares nothing: a multirun's jobs (the sweeper composes and checks each one), a
process started on another config dir (`-cp`), a test that calls the job function itself. (A DDP child rank re-runs
the command line: its own pre-flight, its own compare.)
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lra_bench.kit.plain import plain_dict
from lra_bench.preflight.command_line import bad_input

#: (digest, job tree) of the config the pre-flight checked, until the job compares it (once)
_checked: tuple[str, dict[str, Any]] | None = None


def job_tree(cfg: DictConfig) -> dict[str, Any]:
    """What the job receives of `cfg`, as plain data: every key but Hydra's own node (Hydra strips it from the
    job's config), interpolations as written (resolving them would read the clock, the environment, the run dir)."""
    return plain_dict(OmegaConf.masked_copy(cfg, [str(k) for k in cfg if k != "hydra"]), resolve=False)


def config_digest(cfg: DictConfig) -> str:
    """sha256 of `job_tree(cfg)` as JSON with sorted keys: equal for identical compositions, whichever side."""
    text = json.dumps(job_tree(cfg), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


#: a key in a config tree: its mapping keys and list indices, outermost first
KeyPath = tuple[str | int, ...]


def first_difference(checked: Any, now: Any, path: KeyPath = ()) -> KeyPath | None:
    """The first path (in `checked`'s order, then `now`'s new keys) whose value differs; None when equal."""
    if isinstance(checked, dict) and isinstance(now, dict):
        for k in [*checked, *(k for k in now if k not in checked)]:
            if k not in checked or k not in now:
                return (*path, k)
            found = first_difference(checked[k], now[k], (*path, k))
            if found is not None:
                return found
        return None
    if isinstance(checked, list) and isinstance(now, list) and len(checked) == len(now):
        for i, (a, b) in enumerate(zip(checked, now)):
            found = first_difference(a, b, (*path, i))
            if found is not None:
                return found
        return None
    return None if checked == now else path


def dotted(path: KeyPath) -> str:
    """`path` as the command line writes the key: `trainer.max_steps`, `callbacks.x.args[0]`."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).removeprefix(".") or "(the config)"


def _value_at(tree: Any, path: KeyPath) -> str:
    """The value at `path` in `tree`, short, for the error line; `absent` where it has none."""
    for p in path:
        if isinstance(tree, dict) and p in tree:
            tree = tree[p]
        elif isinstance(tree, list) and isinstance(p, int) and p < len(tree):
            tree = tree[p]
        else:
            return "absent"
    shown = json.dumps(tree, default=str)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def remember_checked(cfg: DictConfig | None) -> None:
    """Keep the digest of `cfg`, the config the pre-flight checked for a single run (None: nothing to compare)."""
    global _checked
    _checked = None if cfg is None else (config_digest(cfg), job_tree(cfg))


def check_unchanged(cfg: DictConfig) -> None:
    """The job's first step: `cfg` (what Hydra composed for the job) must be the config the pre-flight checked, or
    one line naming the first key that differs, exit 2. Compared once; without a checked config, nothing."""
    global _checked
    if _checked is None:
        return
    (digest, checked), _checked = _checked, None
    if config_digest(cfg) == digest:
        return
    now = job_tree(cfg)
    path = first_difference(checked, now) or ()
    bad_input(
        f"the config changed between the check and the run: {dotted(path)} is {_value_at(now, path)} in the "
        f"config Hydra composed for the run, {_value_at(checked, path)} in the one the pre-flight checked; nothing "
        "was run (a file under conf/ edited meanwhile? run the command again)"
    )
