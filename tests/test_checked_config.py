"""A single run runs the config the pre-flight checked, and `python run.py` writes what `@hydra.main` alone writes.

`run.py` starts as Hydra intends: the pre-flight composes the command line through Hydra's public compose API and
checks it (bad input: one line, exit 2, before Hydra writes anything), then the `@hydra.main` function is called and
Hydra composes the config again for the job. The single composition an earlier version bought (by re-implementing
`Hydra.run` on `hydra._internal`) guaranteed that the config that runs is the config that was checked; now the job
compares the digest of the config Hydra passed with the checked one's (`lra_bench.preflight.digest`). This file checks
both halves on real `run.py` processes:

* the pre-flight in front of `@hydra.main` changes nothing Hydra writes: a tiny run through `python run.py` leaves
  the same `.hydra/` files (job name, overrides, the `hydra.mode=RUN` Hydra adds) and the same record identity as
  the decorated function called alone (the oracle: Hydra's own path, no pre-flight);
* the compare really guards: with Hydra's config loader patched to change `seed` in every composition after the
  first (the pre-flight's), the run stops with one line naming `seed`, exit 2, and trains nothing;
* and, in-process, the digest itself: Hydra's node and key order aside, interpolations unresolved, and the first
  differing key named as the command line writes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, TINY_LISTOPS

#: run.py started by a wrapper. `run`: as `python run.py` runs it; `hydra`: the decorated `main()` called alone, as
#: `@hydra.main` runs it without the pre-flight; `tamper`: as `run`, but every composition by Hydra's config loader
#: after the first (the pre-flight's) returns the config with `seed` changed (the loader is Hydra's private class:
#: the instrument, not the code under test).
WRAPPER = """
import runpy, sys
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from omegaconf import open_dict, read_write

path, how, *sys.argv[1:] = sys.argv[1:]
sys.argv[0] = path
if how == "tamper":
    original, calls = ConfigLoaderImpl.load_configuration, []

    def tampered(self, *args, **kwargs):
        cfg = original(self, *args, **kwargs)
        calls.append(1)
        if len(calls) > 1:
            with read_write(cfg), open_dict(cfg):
                cfg.seed = int(cfg.seed) + 1
        return cfg

    ConfigLoaderImpl.load_configuration = tampered
if how == "hydra":
    app = runpy.run_path(path, run_name="run_without_main_block")["main"]
    app.__wrapped__.__module__ = "__main__"  # as when run.py is the script: Hydra finds conf/ beside the file
    app()
else:
    runpy.run_path(path, run_name="__main__")
"""


def _run(tmp_path: Path, how: str) -> tuple[subprocess.CompletedProcess, Path]:
    """A tiny run of run.py started `how` (see WRAPPER), its outputs under `tmp_path/out-<how>`."""
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(WRAPPER)
    out = tmp_path / f"out-{how}"
    args = ["task=listops", "attn=gpa", *TINY_LISTOPS, f"data_dir={tmp_path / 'data'}", f"output_root={out}"]
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(wrapper), str(REPO / "run.py"), how, *args]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    return proc, out


def _run_dir(proc: subprocess.CompletedProcess, out: Path) -> Path:
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = [p.parent for p in out.rglob("results.json") if p.parent.name != "latest"]
    return run_dir


def _hydra_files(run_dir: Path, out: Path) -> dict[str, object]:
    """`.hydra/*.yaml` as data, the run's output root written as `OUT` (the two runs write to different roots)."""
    return {
        f.name: yaml.safe_load(f.read_text().replace(str(out), "OUT"))
        for f in sorted((run_dir / ".hydra").glob("*.yaml"))
    }


@pytest.mark.slow
def test_run_py_writes_what_hydra_main_alone_writes(tmp_path: Path) -> None:
    (ours, our_out), (oracle, hydra_out) = _run(tmp_path, "run"), _run(tmp_path, "hydra")
    launched, alone = _run_dir(ours, our_out), _run_dir(oracle, hydra_out)

    files, hydras = _hydra_files(launched, our_out), _hydra_files(alone, hydra_out)
    assert set(files) == {"config.yaml", "hydra.yaml", "overrides.yaml"}
    assert files == hydras
    assert files["hydra.yaml"]["hydra"]["job"]["name"] == "run"
    assert files["hydra.yaml"]["hydra"]["mode"] == "RUN"
    assert files["hydra.yaml"]["hydra"]["overrides"]["hydra"][-1] == "hydra.mode=RUN"
    records = [json.loads((d / "results.json").read_text()) for d in (launched, alone)]
    assert records[0]["identity"] == records[1]["identity"]
    assert records[0]["off_protocol"] == records[1]["off_protocol"] is True  # tiny: off its protocol, both say so


def test_a_config_changed_after_the_check_stops_the_run_with_one_line(tmp_path: Path) -> None:
    proc, out = _run(tmp_path, "tamper")

    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(err) == 1, (proc.returncode, proc.stderr[-3000:])
    assert err[0].startswith("error: the config changed between the check and the run: seed is "), err[0]
    assert not list(out.rglob("results.json"))  # nothing ran
    assert not (tmp_path / "data").exists()  # not even the data was generated


def test_the_digest_sees_the_job_s_part_and_the_line_names_the_first_key_that_differs() -> None:
    from omegaconf import OmegaConf

    from lra_bench.preflight.digest import config_digest, dotted, first_difference

    checked = {"seed": 0, "trainer": {"max_steps": 4, "devices": [0, 1]}, "out": "${hydra:runtime.output_dir}"}
    same = OmegaConf.create({"hydra": {"job": {"name": "compose"}}, **checked})
    reordered = OmegaConf.create({"out": checked["out"], "trainer": checked["trainer"], "seed": 0})
    assert config_digest(same) == config_digest(reordered)  # Hydra's node and the key order aside; unresolved
    changed = {**checked, "trainer": {"max_steps": 4, "devices": [0, 2]}}
    assert config_digest(OmegaConf.create(changed)) != config_digest(same)
    assert dotted(first_difference(checked, changed) or ()) == "trainer.devices[1]"
    assert dotted(first_difference(checked, {**checked, "notes": 1}) or ()) == "notes"
    assert first_difference(checked, dict(checked)) is None
