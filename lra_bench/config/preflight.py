"""Pre-flight for the Hydra apps (`run.py`, `python -m lra_bench.bench`): compose what `@hydra.main` will compose,
before Hydra prints a multi-line report or creates the output dir, and turn any mistake into one line, exit 2.

Hydra reports a composition error (an unknown option `attn=fulll`, `Could not override` for a misspelt key, an
override it cannot parse) in several lines and exits 1; and it creates the run dir (and writes `.hydra/` into it)
before our code runs, so a run dir that is a file or not writable used to end in a traceback. `preflight` parses the
command line the way Hydra does, composes the same overrides through `lra_bench.config.compose.compose_config` (no
torch), and checks the paths the run will write. A multirun's jobs are composed and validated by the sweeper
(`hydra_plugins.lra_bench_sweeper`), before any is launched; here only its common part is composed.
`--help`, `--hydra-help`, `--info`, shell completion and other config dirs are left to Hydra.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lra_bench.config.compose import compose_config, one_line
from lra_bench.config.validate import ConfigError, check_dir_path, check_paths, check_writable

EXIT_BAD_INPUT = 2


def bad_input(message: str) -> NoReturn:
    """The project's answer to bad input: one line on stderr, exit 2, nothing written."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    sys.exit(EXIT_BAD_INPUT)


def preflight(
    argv: Sequence[str],
    config_name: str = "config",
    output_key: str = "hydra.run.dir",
    check: Callable[[DictConfig], None] | None = None,
) -> None:
    """Compose `argv`'s overrides like `@hydra.main(config_name=...)`; on any mistake, `bad_input`.

    `check(cfg)` (optional) runs on the composed config of a single run; a `ConfigError` from it is bad input too.
    """
    from hydra._internal.utils import get_args_parser
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from hydra.types import RunMode

    args, _unknown = get_args_parser().parse_known_args(list(argv))
    if args.help or args.hydra_help or args.shell_completion or args.info or args.experimental_rerun:
        return
    if args.config_path or args.config_dir:
        return  # another config tree: Hydra reports its own errors
    name = args.config_name or config_name
    try:
        parsed = OverridesParser.create().parse_overrides(list(args.overrides))
        plain = [o.input_line for o in parsed if not o.is_sweep_override()]
        has_sweep = len(plain) < len(parsed)
        for o in parsed:
            key = o.get_key_element()
            if o.is_sweep_override() and key.startswith("hydra.sweeper.params."):
                instead = o.input_line.removeprefix("hydra.sweeper.params.")
                raise ConfigError(
                    f"{o.input_line}: Hydra cannot sweep over its own config; write {instead} (the command line's "
                    "values replace the sweep's own list for that key)"
                )
        cfg = compose_config(plain, config_name=name, return_hydra_config=True)
        multirun = args.multirun or cfg.hydra.mode == RunMode.MULTIRUN
        if has_sweep and not multirun:
            compose_config(list(args.overrides), config_name=name)  # Hydra's own "add --multirun" message
        if args.cfg:
            return  # only printing the config: nothing is written
        HydraConfig.instance().set_config(cfg)
        if multirun:
            check_dir_path("hydra.sweep.dir", str(cfg.hydra.sweep.dir))
            return
        check_paths(cfg)  # before the run dir: name the key the user set (output_root=, data_dir=, …)
        if check is not None:
            check(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]))
        run_dir = Path(str(OmegaConf.select(cfg, output_key)))
        check_writable(run_dir, key=output_key)
        if os.environ.get("LOCAL_RANK", "0") == "0":  # (DDP ranks > 0 run inside rank 0's launch, and its lock)
            from lra_bench.run.lock import check_free

            check_free(run_dir)  # another process trains there: refuse before Hydra writes into its dir
    except ConfigError as err:
        bad_input(str(err))
    except (HydraException, OmegaConfBaseException) as err:
        bad_input(one_line(err).split(" Config search path:")[0])  # the search path listing says nothing new
    finally:
        from hydra.core.global_hydra import GlobalHydra

        GlobalHydra.instance().clear()
