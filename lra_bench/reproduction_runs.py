"""One committed reproduction run as the page reads it: its record, curve, progress and wall time (the type
`lra_bench.reproductions` collects and the page's sections — cost, claims — read).

The places of the evidence are here too (`REPO`, `EVIDENCE_ROOT`, `WORK_ROOT`, `IN_PROGRESS`): `make reproduce`
(`lra_bench.reproduce`) writes there and a run's opening line (`lra_bench.run.console`) reads its duration from the
completed runs, so the reader sits below both and imports only the record.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lra_bench.record import reader
from lra_bench.record.identity import identity_of

REPO = Path(__file__).resolve().parents[1]
EVIDENCE_ROOT = REPO / "reproductions"
WORK_ROOT = REPO / "outputs" / "reproductions"
IN_PROGRESS = "in-progress"
PRIOR_MARGIN = 0.05  # val accuracy above the majority-class share that counts as having left the prior
#: what a step time depends on and a CPU's name does not say (one name covers CPUs whose timings differ)
MACHINE_KEYS = ("cpu", "cpu_id", "cpu_capability")


def machine_of(hardware: Mapping[str, Any]) -> str:
    """The CPU timings belong to (a record's `env.hardware`): name, identity and vector unit."""
    return " ".join(str(hardware.get(k, "?")) for k in MACHINE_KEYS)


@dataclass
class Run:
    protocol: str
    task: str
    attn: str
    seed: int
    record: dict[str, Any]
    folder: Path
    curve: list[tuple[int, float]] = field(default_factory=list)
    checkpoint_step: int | None = None  # an in-progress snapshot: the step its last.ckpt holds
    segments: list[dict[str, Any]] = field(default_factory=list)  # the training attempts (record, or checkpoint)
    variant: str | None = None  # the record's `variant` (or its variants/<name>/ folder's); None: the protocol's

    @property
    def name(self) -> str:
        """`<protocol>/<task>/<attn>/seed-<s>`: the run as the page names it."""
        return f"{self.protocol}/{self.task}/{self.attn}/seed-{self.seed}"

    @property
    def typed(self) -> reader.ReadRecord:
        """The record as the schema's types, read afresh (the page's tests change `record` in place)."""
        return reader.typed(self.record)

    @property
    def origin(self) -> str:
        """The data the run trained and tested on: `generated`, `official`, or `unrecorded` (`data.origin`)."""
        origin = self.typed.data.get("origin")
        return str(origin.get("kind")) if isinstance(origin, dict) and origin.get("kind") else "unrecorded"

    @property
    def counted(self) -> bool:
        """Whether the page counts it beside a published row: the protocol's own config (never a trial) and the
        protocol's current network (never a variant's)."""
        return self.record.get("off_protocol") is False and self.variant is None

    @property
    def machine(self) -> str:
        """The CPU the run was timed on (`machine_of` its record's hardware)."""
        return machine_of(self.typed.env_part("hardware"))

    @property
    def timing(self) -> str:
        """What its step time compares within: the CPU (`machine`) and the encoder's kernel path (`model.kernels`;
        eager for a run from before the choice existed)."""
        return f"{self.machine}, model.kernels={identity_of(self.record)['model.kernels']}"

    @property
    def completed(self) -> bool:
        return self.record.get("status") == "completed" and self.folder.name != IN_PROGRESS

    @property
    def steps(self) -> int:
        done = self.typed.metrics.train_steps
        if done is not None:
            return int(done)
        return self.checkpoint_step if self.checkpoint_step is not None else max((s for s, _ in self.curve), default=0)

    @property
    def test_acc(self) -> float | None:
        value = self.typed.metrics.test_acc
        return float(value) if value is not None else None

    @property
    def prior(self) -> float | None:
        """The validation set's majority-class share (None where the record does not give it)."""
        value = self.typed.data.get("majority_share")
        return float(value) if value is not None else None

    def left_prior_at(self) -> int | None:
        """The first evaluated step whose val accuracy exceeds the prior + `PRIOR_MARGIN`; None: not (yet), or the
        prior is unknown."""
        if self.prior is None:
            return None
        return next((step for step, acc in self.curve if acc > self.prior + PRIOR_MARGIN), None)

    def wall(self) -> tuple[float, bool]:
        """Seconds the attempts that made the weights ran — each segment from its start to its last checkpoint
        (`saved_at`), the last one to the record's end — plus the test of a completed run; and whether every
        segment's end is known (segments written before `saved_at` existed are left out: the time between two
        attempts is no attempt's)."""
        segments, finished = self.segments, self.typed.run.finished_at
        total, known = 0.0, True
        for i, seg in enumerate(segments):
            last = i + 1 == len(segments)
            end = finished if last and (self.completed or not seg.get("saved_at")) else seg.get("saved_at")
            if end is None:
                known = False
                continue
            total += (_time(end) - _time(seg["started_at"])).total_seconds()
        return total, known and bool(segments)

    def wall_s(self) -> float | None:
        """`wall()`'s seconds when every segment's end is known, else None."""
        seconds, known = self.wall()
        return seconds if known else None


def _time(stamp: str) -> dt.datetime:
    return dt.datetime.fromisoformat(stamp)


def recorded_run(seed_dir: Path, folder: Path, variant: str | None = None) -> Run:
    """The run `<protocol>/<task>/<attn>/seed-<s>/` holds, from the record in `folder` (the seed dir, or its
    in-progress snapshot): its variant (the record's, else the folder's `variant`) and its training segments."""
    protocol, task, attn = seed_dir.parts[-4:-1]
    record = json.loads((folder / "results.json").read_text())
    run = Run(protocol, task, attn, int(seed_dir.name.split("-")[1]), record, folder)
    run.variant = record.get("variant") or variant
    run.segments = run.typed.run.segments or []
    return run


def completed(runs: Sequence[Run], attn: str) -> list[Run]:
    """The completed on-protocol runs of the current network of `attn` (`Run.counted`) with a test accuracy, by seed."""
    mine = [r for r in runs if r.attn == attn and r.counted and r.completed and r.test_acc is not None]
    return sorted(mine, key=lambda r: r.seed)


def completed_runs(protocol: str, task: str, attn: str, root: Path = EVIDENCE_ROOT) -> list[Run]:
    """The completed runs of `protocol/task/attn` committed under `root`, from their records alone (no curve, no
    checkpoint read): cheap enough for a run to look up at its start."""
    seed_dirs = sorted((root / protocol / task / attn).glob("seed-*"))
    runs = [recorded_run(d, d) for d in seed_dirs if (d / "results.json").is_file()]
    return [r for r in runs if r.completed]
