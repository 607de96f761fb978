"""The typed reader of a result record, beside the typed writer: the schema's own dataclasses
(`lra_bench.record.schema`) filled from a `results.json` dict, so a reader says `rec.metrics.test_acc` where it
chained `.get("metrics")`, an empty-dict default and `.get("test_acc")`, and mypy checks each name it reads.

Why tolerant: readers meet records of every age and hand-written ones (tests, the committed evidence). A key the
record lacks takes the schema's default (null, or what `results.read_record` gives a version-1 record); a section
that is missing or not a mapping reads empty; a section's keys the schema does not name stay in its `extra`
(`rec.data.get("majority_share")`). Records from before `stage` and `pretraining` were top-level keys said them in
their config only: they are read from there. Keys a reader adds beside the schema's (the leaderboard's `_path`, a
reproduction's `variant`) stay on the dict it read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from lra_bench.record import results
from lra_bench.record.schema import RunRecord, Section

#: top-level keys that older records said only in their resolved config
FROM_CONFIG = ("stage", "pretraining")


def lookup(node: Any, dotted: str) -> Any:
    """`node["a"]["b"]` for `"a.b"`; None where a part is missing or not a mapping."""
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


@dataclass
class ReadRecord(RunRecord):
    """A `RunRecord` as read back (`typed`), with the lookups readers share into its untyped parts."""

    def env_part(self, part: str) -> dict[str, Any]:
        """`env.<part>` (`hardware`, `runtime`, `packages`); empty where an older record lacks it."""
        value = self.env.get(part)
        return dict(value) if isinstance(value, Mapping) else {}

    def config_at(self, dotted: str) -> Any:
        """The resolved config's value at `dotted` (`"trainer.max_steps"`); None where it has none."""
        return lookup(self.config, dotted)

    def diagnostics_summary(self) -> dict[str, Any]:
        """The diagnostics summary at the best-validation checkpoint (the one tested), else at the latest
        evaluation; empty without diagnostics."""
        summary = lookup(self.diagnostics.best or self.diagnostics.latest, "summary")
        return dict(summary) if isinstance(summary, Mapping) else {}


def typed(record: Mapping[str, Any]) -> ReadRecord:
    """The record `record` as the schema's types (see the module for how older and partial records read)."""
    out = ReadRecord()
    config = record.get("config")
    for f in fields(RunRecord):
        value, default = record.get(f.name), getattr(out, f.name)
        if isinstance(default, Section):
            if isinstance(value, Mapping):
                default.update(value)
        elif isinstance(default, dict):
            setattr(out, f.name, dict(value) if isinstance(value, Mapping) else {})
        elif f.name in FROM_CONFIG:
            setattr(out, f.name, value or lookup(config, f.name) or default)
        elif f.name in record:
            setattr(out, f.name, value)
    return out


def read(path: Path) -> ReadRecord:
    """The record at `path` (`results.read_record`: a version it cannot read is a ValueError), typed."""
    return typed(results.read_record(path))
