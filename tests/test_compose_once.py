"""A single run composes its config once, and writes what `@hydra.main` itself would have written.

Two real `run.py` processes of one tiny run: one as a user starts it (`python run.py …`: the pre-flight composes,
`lra_bench.config.launch` runs that config), one through Hydra's own `@hydra.main` path on the same task function
(the oracle: what Hydra composes and writes by itself). A wrapper counts every composition Hydra's config loader
does in each. The launch path composes the run's config once, plus once the protocol's own config that the
off-protocol check compares against (a different config); Hydra's path composes the run's twice after the
pre-flight's would have. Both leave the same `.hydra/` files (job name, search path, overrides, the mode
`hydra.mode=RUN` that Hydra adds) and the same record identity.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import REPO, TINY_LISTOPS

#: run.py started by a wrapper that counts the config loader's compositions (one JSON line per call on stderr).
#: `launch`: as `python run.py` runs it; `hydra`: the decorated `main()` called as `@hydra.main` runs it alone.
WRAPPER = """
import json, runpy, sys
from hydra._internal.config_loader_impl import ConfigLoaderImpl

original = ConfigLoaderImpl.load_configuration

def counted(self, config_name, overrides, run_mode, *args, **kwargs):
    print("COMPOSE " + json.dumps([config_name, list(overrides)]), file=sys.stderr, flush=True)
    return original(self, config_name, overrides, run_mode, *args, **kwargs)

ConfigLoaderImpl.load_configuration = counted
path, how, *sys.argv[1:] = sys.argv[1:]
sys.argv[0] = path
if how == "launch":
    runpy.run_path(path, run_name="__main__")
else:
    app = runpy.run_path(path, run_name="run_without_main_block")["main"]
    app.__wrapped__.__module__ = "__main__"  # as when run.py is the script: Hydra finds conf/ beside the file
    app()
"""


def _run(tmp_path: Path, how: str) -> tuple[Path, list[list]]:
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(WRAPPER)
    out = tmp_path / f"out-{how}"
    args = ["task=listops", "attn=gpa", *TINY_LISTOPS, f"data_dir={tmp_path / 'data'}", f"output_root={out}"]
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(wrapper), str(REPO / "run.py"), how, *args]
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    composes = [
        json.loads(line.removeprefix("COMPOSE ")) for line in proc.stderr.splitlines() if line.startswith("COMPOSE ")
    ]
    (run_dir,) = [p.parent for p in out.rglob("results.json") if p.parent.name != "latest"]
    return run_dir, composes


def _hydra_files(run_dir: Path, out: Path) -> dict[str, object]:
    """`.hydra/*.yaml` as data, the run's output root written as `OUT` (the two runs write to different roots)."""
    return {
        f.name: yaml.safe_load(f.read_text().replace(str(out), "OUT"))
        for f in sorted((run_dir / ".hydra").glob("*.yaml"))
    }


def test_a_single_run_composes_its_config_once_and_writes_what_hydra_main_writes(tmp_path: Path) -> None:
    launched, launch_composes = _run(tmp_path, "launch")
    oracle, hydra_composes = _run(tmp_path, "hydra")

    protocol_reference = [c for c in launch_composes if "~local" in c[1]]
    assert len(protocol_reference) == 1, launch_composes  # the off-protocol check's reference: another config
    assert len(launch_composes) == 2, launch_composes  # the run's own config: once
    assert len(hydra_composes) == 3, hydra_composes  # Hydra alone: get_mode, run, and the same reference

    ours, hydras = _hydra_files(launched, tmp_path / "out-launch"), _hydra_files(oracle, tmp_path / "out-hydra")
    assert set(ours) == {"config.yaml", "hydra.yaml", "overrides.yaml"}
    assert ours == hydras
    assert ours["hydra.yaml"]["hydra"]["job"]["name"] == "run"
    assert ours["hydra.yaml"]["hydra"]["mode"] == "RUN"
    assert ours["hydra.yaml"]["hydra"]["overrides"]["hydra"][-1] == "hydra.mode=RUN"
    records = [json.loads((d / "results.json").read_text()) for d in (launched, oracle)]
    assert records[0]["identity"] == records[1]["identity"]
    assert records[0]["off_protocol"] == records[1]["off_protocol"] is True  # tiny: off its protocol, both say so
