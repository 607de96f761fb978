"""The study's runs: each arm is a real `run.py` process, one after the other, read back from its `results.json`.

An arm is `attn=local attn.window=<w>` or `attn=<method>`, for each seed, under `<out>/runs` with a fixed run name,
so rerunning the study resumes an unfinished run and leaves a finished one as it is (`run.py`'s own guarantee).
Every number of a row comes from the run's record; a run that failed is a row with its status and error, never a
number. `equal_budget` checks what the study promises: the runs' experiment identities differ in nothing but the
attention, its selector and the seed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lra_bench.diagnostics import LOCALITY_KEYS
from lra_bench.locality.settings import Settings, SettingsError
from lra_bench.record import results
from lra_bench.record.reader import ReadRecord, read
from lra_bench.reproduction_runs import REPO

#: identity keys that may differ between the study's runs (what it varies), by prefix
VARIED = ("attn", "selector", "seed")
EXIT_BAD_INPUT = 2


@dataclass(frozen=True)
class Arm:
    attn: str
    window: int | None
    seed: int

    @property
    def label(self) -> str:
        return f"local w={self.window}" if self.window is not None else self.attn

    @property
    def name(self) -> str:
        return (f"local-w{self.window}" if self.window is not None else self.attn) + f"-s{self.seed}"

    def overrides(self) -> list[str]:
        window = [f"attn.window={self.window}"] if self.window is not None else []
        return [f"attn={self.attn}", *window, f"seed={self.seed}"]


def arms(settings: Settings) -> list[Arm]:
    """Every seed's windows (narrowest first), then its methods."""
    out = []
    for seed in settings.seeds:
        out += [Arm("local", w, seed) for w in settings.windows]
        out += [Arm(m, None, seed) for m in settings.methods]
    return out


def arm_args(arm: Arm, settings: Settings) -> list[str]:
    runs = settings.out.resolve() / "runs"
    return [*settings.run_overrides, *arm.overrides(), f"output_root={runs}", f"run_name={arm.name}"]


def record_of(arm: Arm, settings: Settings) -> Path | None:
    """The arm's `results.json` (`<out>/runs/<task>/<attn>/<name>/`), when the run got that far."""
    found = sorted((settings.out.resolve() / "runs").glob(f"*/{arm.attn}/{arm.name}/{results.FILENAME}"))
    return found[0] if found else None


def run_arm(arm: Arm, settings: Settings) -> dict[str, Any]:
    """Run (or resume, or re-read) one arm; its row. Output goes to `<out>/logs/<name>.log`. A run refused as bad
    input (exit 2) is the study's bad input too: `SettingsError` with the run's own error line."""
    logs = settings.out.resolve() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "WANDB_MODE": os.environ.get("WANDB_MODE", "disabled")}
    started = time.perf_counter()
    command = [sys.executable, "run.py", *arm_args(arm, settings)]
    with open(logs / f"{arm.name}.log", "w") as log:
        proc = subprocess.run(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - started
    if proc.returncode == EXIT_BAD_INPUT:
        text = (logs / f"{arm.name}.log").read_text().splitlines()
        line = next((t for t in reversed(text) if t.startswith("error: ")), f"run.py exited 2 (see {log.name})")
        raise SettingsError(line.removeprefix("error: "))
    path = record_of(arm, settings)
    return row_of(arm, read(path) if path is not None else None, proc.returncode, wall)


def row_of(arm: Arm, record: ReadRecord | None, returncode: int, wall_s: float) -> dict[str, Any]:
    """What the study keeps of one run: its accuracies, steps, how far its attention reached, identity."""
    rec = record if record is not None else ReadRecord()
    metrics, summary = rec.metrics, rec.diagnostics_summary()
    status = record.status if record is not None else f"no record (exit {returncode})"
    done = status == "completed" and returncode == 0
    return {
        "label": arm.label,
        "attn": arm.attn,
        "window": arm.window,
        "seed": arm.seed,
        "status": status,
        "error": None if done else (rec.error or f"run.py exited {returncode}"),
        "test_acc": metrics.test_acc if done else None,
        "val_acc": metrics.val_acc if done else None,
        "test_examples": metrics.test_examples,
        "best_step": metrics.best_step,
        "train_steps": metrics.train_steps,
        **{key: summary.get(key) for key in (*LOCALITY_KEYS, *(f"{k}_exact" for k in LOCALITY_KEYS))},
        "off_protocol": rec.off_protocol,
        "fingerprint": rec.fingerprint,
        "code": rec.code,  # {commit, dirty}: the code the run trained with
        "identity": rec.identity or {},
        "task": rec.task,
        "protocol": rec.protocol,
        "seq_len": rec.data.seq_len,
        "wall_s": round(wall_s, 1),
    }


def equal_budget(rows: list[dict[str, Any]]) -> list[str]:
    """The identity keys, other than the attention's, its selector's and the seed, in which the completed runs
    differ (empty = every run had the same task, data, model, optimiser and steps)."""
    identities = [r["identity"] for r in rows if r["status"] == "completed" and r["identity"]]
    keys = {k for identity in identities for k in identity if not k.startswith(VARIED)}
    return sorted(k for k in keys if len({repr(identity.get(k)) for identity in identities}) > 1)
