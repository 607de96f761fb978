"""The config tree composed through Hydra's own compose API — the one way any app of the harness gets a config.

The pre-flight of `run.py` and the bench composes here what their `@hydra.main` will compose (and the job checks
that it did: `lra_bench.preflight.digest`); everything else that needs "what a run would get" (the data preparer, the
benchmark's operator defaults, the approximation study's model, evaluation of a checkpoint) calls
`compose_config(overrides)` on the same `conf/` tree, so no app re-reads YAML files by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from lra_bench.config.setup import setup

#: the tree: `lra_bench/conf` links to the repository's `conf/`, and a wheel carries its files there (pyproject.toml)
CONF_DIR = (Path(__file__).resolve().parents[1] / "conf").resolve()


def compose_config(
    overrides: Sequence[str] = (), config_name: str = "config", return_hydra_config: bool = False
) -> DictConfig:
    """`conf/<config_name>.yaml` with `overrides`, exactly as `python run.py <overrides>` would compose it.

    Inside a running Hydra app (GlobalHydra initialised on this same tree) the app's search path is reused;
    otherwise the tree is initialised for this call only.
    """
    setup()
    if GlobalHydra.instance().is_initialized():
        return compose(config_name, overrides=list(overrides), return_hydra_config=return_hydra_config)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name, overrides=list(overrides), return_hydra_config=return_hydra_config)


def one_line(err: BaseException) -> str:
    """Hydra's and OmegaConf's multi-line composition errors as one line (for `error: …`, exit 2)."""
    text = " ".join(str(err).replace("\t", " ").split())
    return text.replace("Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.", "").strip()
