"""The result record as types: one dataclass per section of `results.json` (schema version 2, described in
`lra_bench.record.results`), so a run builds its record from named, typed fields and writes it in one place.

Why sections keep an `extra` mapping: a task adds its own data facts (`review_form`, `difficulty`), the run adds
`majority_share`, the efficiency monitor `peak_memory_kind`. Records have always carried them after the schema's
keys, in the order they were set; `to_dict` writes them there, so the JSON keeps its exact shape.

`RunRecord().to_dict()` is the empty record (`results.empty_record`), and the section key tuples
(`results.METRIC_KEYS`, …) are these dataclasses' field names: each key and each default is written once, here.
Readers get these types back from `lra_bench.record.reader` (`typed`, `read`), tolerant of older records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

SCHEMA_VERSION = 2
STATUSES = ("running", "completed", "failed", "interrupted", "evaluated")


@dataclass
class Section:
    """A mapping-shaped part of the record: its schema fields, then the `extra` keys in the order they were set."""

    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The schema's keys of this section, in their order in `results.json`."""
        return tuple(f.name for f in fields(cls) if f.name != "extra")

    def update(self, values: Mapping[str, Any]) -> None:
        """Set each value: a schema key as its field, any other key as an extra."""
        known = self.keys()
        for key, value in values.items():
            if key in known:
                setattr(self, key, value)
            else:
                self.extra[key] = value

    def get(self, key: str) -> Any:
        return getattr(self, key) if key in self.keys() else self.extra.get(key)

    def to_dict(self) -> dict[str, Any]:
        return {**{key: getattr(self, key) for key in self.keys()}, **self.extra}


@dataclass
class RunInfo(Section):
    name: str | None = None
    output_dir: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    wandb_id: str | None = None
    resumed_from_step: int | None = None
    resumed_from: str | None = None
    planned_steps: int | None = None
    segments: list[dict[str, Any]] | None = None  # [{started_at, from_step, code, kernels}], one per attempt


@dataclass
class Metrics(Section):
    val_acc: float | None = None
    test_acc: float | None = None
    test_loss: float | None = None
    test_examples: int | None = None
    best_step: int | None = None
    train_steps: int | None = None
    step_time_median_s: float | None = None
    tokens_per_s: float | None = None
    peak_memory_mib: float | None = None
    params: int | None = None
    data_share: float | None = None
    timed_steps: int | None = None
    step_time_iqr_s: float | None = None
    load_avg_1m: float | None = None


@dataclass
class Diagnostics(Section):
    latest: dict[str, Any] | None = None  # per layer/head quantities (lra_bench.diagnostics.metrics)
    best: dict[str, Any] | None = None  # the same, at the best validation so far


@dataclass
class DataInfo(Section):
    text_length: int | None = None
    max_length: int | None = None
    seq_len: int | None = None
    tokenizer_version: str | None = None
    split: str | None = None
    source: str | None = None


@dataclass
class Identified:
    """What a run's identity check found (`lra_bench.run.train.identify`): the values the record stores."""

    identity: dict[str, Any]
    fingerprint: str
    off_protocol: bool | None
    deviations: dict[str, Any] | None


@dataclass
class RunRecord:
    """One run's `results.json`: the top-level keys in their file order, then the sections."""

    schema_version: int = SCHEMA_VERSION
    status: str = "running"  # one of STATUSES
    error: str | None = None
    task: str | None = None
    attn: str | None = None
    selector: str | None = None
    protocol: str | None = None
    rank_budget: int | None = None
    seed: Any = None  # an int; whatever the config said when it is not one (a failed job's record)
    fingerprint: str | None = None
    identity: dict[str, Any] | None = None
    code: dict[str, Any] | None = None
    off_protocol: bool | None = None
    deviations: dict[str, Any] | None = None
    evaluation: dict[str, Any] | None = None
    predictions: str | None = None
    stage: str = "supervised"
    pretraining: str = "none"
    pretrained: dict[str, Any] | None = None
    pretrain: dict[str, Any] | None = None
    run: RunInfo = field(default_factory=RunInfo)
    metrics: Metrics = field(default_factory=Metrics)
    diagnostics: Diagnostics = field(default_factory=Diagnostics)
    data: DataInfo = field(default_factory=DataInfo)
    env: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    def set_identity(self, found: Identified) -> None:
        self.identity, self.fingerprint = found.identity, found.fingerprint
        self.off_protocol, self.deviations = found.off_protocol, found.deviations

    def to_dict(self) -> dict[str, Any]:
        """The record as `results.json` holds it (plain dicts, the schema's key order)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if isinstance(value, Section) else value
        return out
