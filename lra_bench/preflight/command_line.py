"""Pre-flight for the Hydra apps (`run.py`, `python -m lra_bench.bench`): compose what `@hydra.main` will compose,
before Hydra prints a multi-line report or creates the output dir, and turn any mistake into one line, exit 2.

Hydra reports a composition error (`attn=fulll`, `Could not override` for a misspelt key, an override it cannot
parse) in several lines and exits 1; and it creates the run dir (writing `.hydra/` into it) before our code runs, so a
run dir that is a file or not writable ended in a traceback. `preflight` parses the command line the way Hydra does,
composes the same overrides through `lra_bench.config.compose.compose_config` (no torch), and checks the paths the
run will write; a multirun's jobs are composed and checked by the sweeper (`hydra_plugins.lra_bench_sweeper`), here
only its common part. `--help`, `--info`, shell completion and other config dirs are left to Hydra. A single run's
checked config is returned for `lra_bench.preflight.digest`, whose job compares it with what Hydra composes.

A `+key` goes where no schema looks: Hydra suggests `+trainer.max_step=5` for a misspelt key, and the run then
generated its data for minutes before `pl.Trainer` refused the argument. So a `+`/`++` key under a node the config
already has is refused with a "did you mean" unless the tree takes new keys there (`check_added_keys`). And a near
miss comes first: `composition_error` turns Hydra's list of options for `attn=nystorm`, or its "to append to your
config use +trainer.max_step=5" (advice that only leads to that refusal), into one line naming the near miss (`attn
has no option nystorm; did you mean attn=nystrom?`); Hydra's own words stay for what has no near miss.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

# private to Hydra, but its own command-line parser (no public API has it): argv read as @hydra.main reads it
from hydra._internal.utils import get_args_parser
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lra_bench.config.compose import compose_config, one_line
from lra_bench.config.validate import check_dir_path, check_paths, check_typed_folders, check_writable
from lra_bench.errors import ConfigError
from lra_bench.kit.plain import plain_dict
from lra_bench.run.rundir import check_free

EXIT_BAD_INPUT = 2


def bad_input(message: str) -> NoReturn:
    """The project's answer to bad input: one line on stderr, exit 2, nothing written."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_BAD_INPUT)


@functools.cache
def trainer_arguments() -> frozenset[str]:
    """The keyword arguments of `pl.Trainer` (`trainer:` is passed through to it)."""
    # Lightning only for a `+trainer.` key: the pre-flight must not load it (`--help` stays fast)
    import pytorch_lightning as pl

    return frozenset(inspect.signature(pl.Trainer.__init__).parameters) - {"self"}


def _closest(word: str, candidates: Any) -> str | None:
    """The candidate `word` most likely mistypes (difflib's ratio >= 0.6), or None."""
    close = difflib.get_close_matches(word, sorted(map(str, candidates)), n=1)
    return close[0] if close else None


def _suggestion(key: str, candidates: Any) -> str:
    close = _closest(key, candidates)
    return f"; did you mean {close}?" if close else ""


def added_key_problem(tree: dict[str, Any], key: str) -> str | None:
    """Why `+key` would add nothing the harness reads (None when it is fine), `tree` the config without the `+` keys.

    Open places: a new top-level key (`+notes.…`) and Hydra's own config; a new callback node under `callbacks`
    (a `_target_` node: `validate.callback_nodes` checks it) and the arguments of any `_target_` node;
    `spt.pretrain.<key>`, which overrides the run's own `<key>` for the pretraining stage (checked as that key);
    `trainer.<argument>` for any `pl.Trainer` argument. Anywhere else a missing key is a typo or a knob that
    does not exist.
    """
    parts = key.split(".")
    if parts[:2] == ["spt", "pretrain"] and len(parts) > 2:
        return added_key_problem(tree, ".".join(parts[2:]))
    node: Any = tree
    depth = 0
    while depth < len(parts) and isinstance(node, dict) and parts[depth] in node:
        node, depth = node[parts[depth]], depth + 1
    if depth == len(parts) or depth == 0 or parts[0] == "hydra" or not isinstance(node, dict):
        return None  # there already (Hydra says so), a new top-level key, Hydra's config, under a scalar (Hydra's)
    parent, missing = ".".join(parts[:depth]), parts[depth]
    if "_target_" in node or (parent == "callbacks" and depth + 1 < len(parts)):
        return None
    if parent == "trainer":
        if missing in trainer_arguments():
            return None
        hint = _suggestion(missing, {*node, *trainer_arguments()})
        return f"{missing} is neither a key of trainer nor an argument of pl.Trainer{hint}"
    hint = _suggestion(missing, node) or f" (it has: {', '.join(sorted(map(str, node)))})"
    return f"{parent} has no key {missing}{hint}"


#: Hydra's words for a key the config does not have (`config_loader_impl`, `defaults_list`)
_NOT_A_KEY = re.compile(r"Could not override '([^']+)'")


def _missing_option(err: Exception, overrides: Sequence[Any]) -> str | None:
    """`group=typo` (Hydra's MissingConfigException for `<group>/<typo>`, with the group's options): the option it
    most likely meant, or None."""
    missing, options = getattr(err, "missing_cfg_file", None), list(getattr(err, "options", None) or ())
    for o in overrides:
        value = None if o.is_sweep_override() else o.value()
        if not isinstance(value, str) or f"{o.key_or_group}/{value}" != missing:
            continue
        group, name = str(missing).rsplit("/", 1)  # a nested option (`experiment=leaderboard/x`): its own group
        close = _closest(name, options)
        if close is None:
            return None
        meant = value[: len(value) - len(name)] + close
        return (
            f"{o.input_line}: {group} has no option {name}; did you mean {o.key_or_group}={meant}? "
            f"(options: {', '.join(map(str, options))})"
        )
    return None


def _missing_key(err: Exception, overrides: Sequence[Any], config_name: str) -> str | None:
    """`key=value` for a key the config does not have: the key (or config group) it most likely meant, or why
    adding it would do nothing (`added_key_problem`); None when adding it with `+` is right (a pl.Trainer argument)."""
    found = _NOT_A_KEY.search(str(err))
    given = [o for o in overrides if found and str(o.key_or_group) == found.group(1)]
    if not given:
        return None
    o = given[0]
    rest = [str(x.input_line) for x in overrides if x is not o and not x.is_sweep_override()]
    cfg = compose_config(rest, config_name=config_name, return_hydra_config=True)
    tree = plain_dict(cfg, resolve=False)
    first = str(o.key_or_group).split(".")[0]
    if first not in tree:
        groups = [g for g in cfg.hydra.runtime.choices if not str(g).startswith("hydra/")]
        close = _closest(first, [*(k for k in tree if k != "hydra"), *groups])
        return f"{o.input_line}: no key or config group {first}; did you mean {close}?" if close else None
    problem = added_key_problem({k: v for k, v in tree.items() if k != "hydra"}, str(o.key_or_group))
    return f"{o.input_line}: {problem}" if problem else None


def composition_error(err: Exception, overrides: Sequence[Any], config_name: str) -> str:
    """One line for Hydra's (or OmegaConf's) composition error `err` on `overrides` (parsed): the near miss of a
    mistyped option or key first, else Hydra's own message without its search-path listing (which says nothing
    new)."""
    try:
        near = _missing_option(err, overrides) or _missing_key(err, overrides, config_name)
    except Exception:  # the config does not compose without the override either: Hydra's words then
        near = None
    return near or one_line(err).split(" Config search path:")[0]


def check_added_keys(overrides: Sequence[Any], config_name: str) -> None:
    """Each `+key=…` / `++key=…` of the command line (sweeps included) against the config composed without them."""
    added = [o for o in overrides if (o.is_add() or o.is_force_add()) and "." in o.key_or_group and not o.package]
    if not added:
        return
    rest = [o.input_line for o in overrides if o not in added and not o.is_sweep_override()]
    tree = plain_dict(compose_config(rest, config_name=config_name), resolve=False)
    for o in added:
        problem = added_key_problem(tree, str(o.key_or_group))
        if problem is not None:
            raise ConfigError(f"{o.input_line}: {problem}")


def preflight(
    argv: Sequence[str],
    config_name: str = "config",
    output_key: str = "hydra.run.dir",
    check: Callable[[DictConfig], None] | None = None,
) -> DictConfig | None:
    """Compose `argv`'s overrides like `@hydra.main(config_name=...)`; on any mistake, `bad_input`.

    `check(cfg)` (optional) runs on the composed config of a single run; a `ConfigError` from it is bad input too.
    Returns a single run's checked config (Hydra's node included), for the app to hand to
    `lra_bench.preflight.digest.remember_checked` before `@hydra.main` composes it again; None for a multirun,
    `--cfg` or what Hydra answers itself.
    """
    args, _unknown = get_args_parser().parse_known_args(list(argv))
    name = args.config_name or config_name
    parsed: list[Any] = []  # (a line Hydra cannot parse fails before there is any)
    try:  # every return leaves Hydra's global instance clear (`finally`), for `@hydra.main` or the next call
        if args.help or args.hydra_help or args.shell_completion or args.info or args.experimental_rerun:
            return None
        if args.config_path or args.config_dir:
            return None  # another config tree: Hydra reports its own errors
        parsed = OverridesParser.create().parse_overrides(list(args.overrides))
        plain = [str(o.input_line) for o in parsed if not o.is_sweep_override()]
        has_sweep = len(plain) < len(parsed)
        for o in parsed:
            key = o.get_key_element()
            if o.is_sweep_override() and key.startswith("hydra.sweeper.params."):
                instead = str(o.input_line).removeprefix("hydra.sweeper.params.")
                raise ConfigError(
                    f"{o.input_line}: Hydra cannot sweep over its own config; write {instead} (the command line's "
                    "values replace the sweep's own list for that key)"
                )
        cfg = compose_config(plain, config_name=name, return_hydra_config=True)
        multirun = args.multirun or cfg.hydra.mode == RunMode.MULTIRUN
        if has_sweep and not multirun:
            compose_config(list(args.overrides), config_name=name)  # Hydra's own "add --multirun" message
        if args.cfg:
            return None  # only printing the config: nothing is written
        check_added_keys(parsed, name)
        HydraConfig.instance().set_config(cfg)
        given = [str(o.key_or_group) for o in parsed if not o.is_sweep_override()]
        if multirun:
            check_dir_path("hydra.sweep.dir", str(cfg.hydra.sweep.dir))
            check_typed_folders(cfg, given)
            return None
        check_paths(cfg)  # before the run dir: name the key the user set (output_root=, data_dir=, …)
        check_typed_folders(cfg, given)
        if check is not None:
            check(OmegaConf.masked_copy(cfg, [str(k) for k in cfg if k != "hydra"]))
        run_dir = Path(str(OmegaConf.select(cfg, output_key)))
        check_writable(run_dir, key=output_key)
        if os.environ.get("LOCAL_RANK", "0") == "0":  # (DDP ranks > 0 run inside rank 0's launch, and its lock)
            check_free(run_dir)  # another process trains there: refuse before Hydra writes into its dir
        return cfg
    except ConfigError as err:
        bad_input(str(err))
    except (HydraException, OmegaConfBaseException) as err:
        bad_input(composition_error(err, parsed, name))
    finally:
        GlobalHydra.instance().clear()
