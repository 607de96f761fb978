"""The one writer of a run's `results.json`: it holds the typed record (`lra_bench.record.schema.RunRecord`),
and the stage fills its fields from what each part returns (the test's numbers, the efficiency summary, the
identity check) or exposes (the diagnostics callback's `latest`/`best`).

Why one writer: the record used to be a dict that a dozen modules wrote into, the diagnostics callback included
(it rewrote the file itself during training), so no one place said what a record holds or when it is on disk.

When it is written: at the start (a run dir with no record yet gets a `running` one at once), when the run dir's
state is settled (`own`: from then on this run replaces any earlier record, e.g. once `start_run` accepted it), at
each diagnostics measurement (so the file shows them while the run trains), and at the end (`finish`). Only rank 0
writes; a folder whose record this run does not own yet (an earlier run's, kept until this one is accepted) is not
touched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from lra_bench.record import results
from lra_bench.record.builder import now
from lra_bench.record.schema import RunRecord
from lra_bench.run.test_outputs import Tested


class DiagnosticsSource(Protocol):
    """What the record reads from the diagnostics callback (`lra_bench.diagnostics.callback`)."""

    latest: dict[str, Any] | None
    best: dict[str, Any] | None


class Recorder:
    def __init__(self, record: RunRecord, output_dir: Path, is_zero: bool) -> None:
        self.record = record
        self.path = Path(output_dir) / results.FILENAME
        self.is_zero = is_zero
        self.owned = not self.path.exists()  # a folder's existing record is replaced only once the run is accepted
        self.diagnostics: DiagnosticsSource | None = None

    def write(self) -> None:
        """Write the record as it stands now (rank 0, once this run owns the folder's record)."""
        if self.diagnostics is not None:
            self.record.diagnostics.update({"latest": self.diagnostics.latest, "best": self.diagnostics.best})
        if self.is_zero and self.owned:
            results.write_atomic(self.path, self.record.to_dict())

    def own(self) -> None:
        """This run is accepted in its folder: its record replaces any earlier one, now."""
        self.owned = True
        self.write()

    def add_test(self, tested: Tested) -> None:
        self.record.metrics.update(tested.metrics)
        if tested.predictions is not None:
            self.record.predictions = tested.predictions

    def fail(self, err: BaseException) -> None:
        self.record.status, self.record.error = "failed", f"{type(err).__name__}: {err}"

    def finish(self) -> None:
        """The last write: when the run ended (completed, failed, interrupted, or refused)."""
        self.record.run.finished_at = now()
        self.write()

    def as_dict(self) -> dict[str, Any]:
        return self.record.to_dict()
