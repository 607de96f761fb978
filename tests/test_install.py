"""Installing: a wheel (non-editable) carries the config tree where the code looks for it and the `lra-bench` console
entry point; the entry point runs each app as its `python -m` form does. Built offline from the checkout
(`pip wheel --no-deps --no-build-isolation`, from a copy of the sources: setuptools builds in the source tree),
installed with `pip install --target` into a temp dir."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import CONF, REPO


def _python(*args: str, cwd: Path, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_wheel_carries_the_config_tree_and_a_non_editable_install_finds_it(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for name in ("conf", "lra_bench", "models", "tasks", "hydra_plugins"):  # lra_bench/conf stays a link
        shutil.copytree(REPO / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    built = _python("-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(source),
                    cwd=tmp_path)  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next(tmp_path.glob("lra_bench-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    tree = {f"lra_bench/conf/{p.relative_to(CONF)}" for p in CONF.rglob("*.yaml") if p.parent.name != "local"}
    assert tree <= names, sorted(tree - names)[:5]
    assert not any(n.startswith("lra_bench/conf/local/") and n.endswith(".yaml") for n in names)  # personal settings
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "lra-bench = lra_bench.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()

    site = tmp_path / "site"
    installed = _python("-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q", "--target", str(site),
                        str(wheel), cwd=tmp_path)  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-3000:]
    probe = (
        "import lra_bench; from lra_bench.config.compose import CONF_DIR, compose_config;"
        "print(lra_bench.__file__); print(CONF_DIR); print(compose_config(['task=text', 'attn=nystrom']).attn.name)"
    )
    composed = _python("-c", probe, cwd=tmp_path, pythonpath=site)  # not in the checkout: only the installed copy
    assert composed.returncode == 0, composed.stderr[-3000:]
    package, conf_dir, attn = composed.stdout.split()
    assert package.startswith(str(site)) and conf_dir == str(site / "lra_bench" / "conf") and attn == "nystrom"
    bench = _python("-m", "lra_bench.cli", "bench", "--cfg", "job", "seq_lens=[64]", cwd=tmp_path, pythonpath=site)
    assert bench.returncode == 0 and "seq_lens:\n- 64" in bench.stdout, bench.stderr[-3000:]  # a Hydra app's tree


def test_the_entry_point_runs_the_apps_and_refuses_cleanly() -> None:
    evaluate = _python("-m", "lra_bench.cli", "eval", "--help", cwd=REPO)
    assert evaluate.returncode == 0 and "checkpoint" in evaluate.stdout
    train = _python("-m", "lra_bench.cli", "train", "--help", cwd=REPO)
    assert train.returncode == 0 and train.stdout.startswith("lra-bench: ")
    unknown = _python("-m", "lra_bench.cli", "trian", cwd=REPO)
    assert unknown.returncode == 2 and unknown.stderr.strip().splitlines() == [
        "error: lra-bench trian: no such command; expected one of train, eval, compare, leaderboard, runs, bench"
    ]
    runs = _python("-m", "lra_bench.cli", "runs", "--help", cwd=REPO)
    if importlib.util.find_spec("lra_bench.runs") is None:  # the listing module is not in every version
        assert runs.returncode == 2 and len(runs.stderr.strip().splitlines()) == 1
        assert "lra_bench.runs is not part of this installation" in runs.stderr
    else:
        assert runs.returncode == 0, runs.stderr[-2000:]
