"""The `local_slurm` pytest fixture: one real single-node SLURM cluster per test session.

Why a separate module: tests/conftest.py belongs to the lead; it imports this fixture with
`from tests.conftest_slurm import local_slurm  # noqa: F401`. Environments that cannot install SLURM (not
root, no apt) skip with the reason; an installed SLURM that fails to start is a real failure, with its logs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm_cluster import LocalSlurm, SlurmUnavailable


def slurm_cluster_or_skip(**kwargs: object) -> Iterator[LocalSlurm]:
    """Start a LocalSlurm, yield it, stop it; `pytest.skip` when SLURM cannot be installed here."""
    cluster = LocalSlurm(**kwargs)  # type: ignore[arg-type]
    try:
        cluster.start()
    except SlurmUnavailable as exc:
        pytest.skip(f"no local SLURM: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def local_slurm() -> Iterator[LocalSlurm]:
    """A started cluster; `local_slurm.env` is the environment for sbatch/squeue/scontrol subprocesses."""
    yield from slurm_cluster_or_skip()


def sweep_overrides(sweep: Path) -> list[str]:
    """The launcher limits and outputs every SLURM sweep test gives its master: 20-minute jobs signalled 30 s before
    the limit, the sweep in `sweep`, no leaderboard plots."""
    return [
        "hydra.launcher.timeout_min=20",
        "hydra.launcher.signal_delay_s=30",
        f"hydra.sweep.dir={sweep}",
        "hydra.callbacks.leaderboard.plots=false",
    ]


def job_env(cluster: LocalSlurm, tmp_path: Path) -> dict[str, str]:
    """The environment for a `run.py -m ... hydra/launcher=slurm` master on `cluster`: its SLURM_CONF, W&B offline
    into tmp_path, one thread, unbuffered output."""
    return {
        **cluster.env,
        "SLURM_CONF": str(cluster.conf),
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path / "wandb-dir"),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }
