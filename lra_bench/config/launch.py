"""Start a Hydra app so that a single run's config is composed once: by the pre-flight, then run as it is.

`@hydra.main` composes a run's config twice (`Hydra.get_mode` to read `hydra.mode`, then `Hydra.run` for the job),
and the pre-flight (`lra_bench.config.preflight`) composes it a third time first, to turn bad input into one line
and exit 2 before anything is written. `launch` composes once instead, on the Hydra instance `@hydra.main` would
make for the app (`app_hydra`: its job name and config search path, so `.hydra/` holds what Hydra would write),
and hands that config to Hydra's own `run_job` with Hydra's logging and callbacks, the steps of `Hydra.run`.
Everything other than a single run (`--multirun` or a config that sets `hydra.mode: MULTIRUN`, `--cfg`,
`--help`, `--info`, shell completion, another config dir) goes to `@hydra.main` unchanged: there the sweeper
composes each job, which it must.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Sequence
from typing import Any

from omegaconf import DictConfig, open_dict, read_write

from lra_bench.config.preflight import preflight


def app_hydra(app: Callable[..., Any], config_path: str) -> Any:
    """The Hydra instance `@hydra.main(config_path=config_path)` makes for `app`: the job name it derives from the
    app's file (`run` for run.py) and the config search path relative to it. Registered as Hydra's global one."""
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import (
        create_automatic_config_search_path,
        detect_calling_file_or_module_from_task_function,
        detect_task_name,
    )

    calling_file, calling_module = detect_calling_file_or_module_from_task_function(app)
    search_path = create_automatic_config_search_path(calling_file, calling_module, config_path)
    return Hydra.create_main_hydra2(detect_task_name(calling_file, calling_module), search_path)


def run_composed(hydra: Any, config_name: str, cfg: DictConfig, task_function: Callable[[DictConfig], Any]) -> None:
    """`Hydra.run` on a config already composed (with Hydra's node): the mode `_run_app` fills when the config
    leaves it open, Hydra's logging, the run callbacks, `run_job` (the run dir, `.hydra/`, the job's logging), and
    a failed job reported as Hydra reports it (`run_and_report`: a short traceback, exit 1)."""
    from hydra._internal.callbacks import Callbacks
    from hydra._internal.utils import run_and_report
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import configure_log, run_job
    from hydra.types import HydraContext, RunMode

    def job() -> None:
        if cfg.hydra.mode is None:  # as `_run_app` adds `hydra.mode=RUN` to the overrides
            with read_write(cfg.hydra), open_dict(cfg.hydra):
                cfg.hydra.mode = RunMode.RUN
                cfg.hydra.overrides.hydra.append("hydra.mode=RUN")
        configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)
        callbacks = Callbacks(cfg)
        callbacks.on_run_start(config=cfg, config_name=config_name)
        context = HydraContext(config_loader=hydra.config_loader, callbacks=callbacks)
        ret = run_job(task_function, cfg, job_dir_key="hydra.run.dir", job_subdir_key=None, hydra_context=context)
        callbacks.on_run_end(config=cfg, config_name=config_name, job_return=ret)
        _ = ret.return_value  # re-raises the job's exception

    GlobalHydra.instance().initialize(hydra)  # what runs inside the job composes on the app's search path
    try:
        run_and_report(job)
    finally:
        GlobalHydra.instance().clear()


def launch(
    app: Callable[[], Any],
    config_path: str,
    config_name: str,
    check: Callable[[DictConfig], None] | None = None,
    argv: Sequence[str] | None = None,
) -> None:
    """Run `app` (a `@hydra.main` function declared with `config_path` and `config_name`) on the command line:
    the pre-flight composes and checks; a single run then runs on that config, anything else through `app()`."""
    task_function = inspect.unwrap(app)
    hydra = app_hydra(task_function, config_path)
    cfg = preflight(sys.argv[1:] if argv is None else argv, config_name=config_name, check=check, hydra=hydra)
    if cfg is None:
        app()
    else:
        run_composed(hydra, str(cfg.hydra.job.config_name), cfg, task_function)  # `--config-name` included
