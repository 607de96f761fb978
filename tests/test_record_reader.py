"""The typed reader (`lra_bench.record.reader`) gives back what the typed writer wrote, and reads the records of
every age a reader meets: schema 1 (as the first writer wrote it), and records missing whole sections."""

from __future__ import annotations

import json
from pathlib import Path

from lra_bench.record import results
from lra_bench.record.builder import new_record
from lra_bench.record.reader import read, typed
from lra_bench.record.schema import Metrics, RunInfo
from lra_bench.run.recorder import Recorder
from tests.conftest import compose

#: a version-1 record as the first writer wrote it (`num_landmarks`, no identity, no later metric or run keys)
SCHEMA_1 = {
    "schema_version": 1, "status": "completed", "error": None, "task": "listops", "attn": "nystrom",
    "selector": "segment_means", "protocol": "nystromformer", "num_landmarks": 64, "seed": 3,
    "run": {"name": "r", "output_dir": "/runs/r", "started_at": "2025-01-01T00:00:00+00:00",
            "finished_at": "2025-01-01T01:00:00+00:00", "wandb_id": None, "resumed_from_step": None},
    "metrics": {"val_acc": 0.37, "test_acc": 0.36, "best_step": 900, "train_steps": 1000, "step_time_median_s": 0.05,
                "tokens_per_s": 2e4, "peak_memory_mib": 512.0, "params": 1000, "data_share": 0.1},
    "diagnostics": {"latest": {"summary": {"mass_within_16": 0.5}}, "best": None},
    "data": {"text_length": None, "max_length": 2000, "seq_len": 2000, "tokenizer_version": None, "split": "test",
             "source": "generated"},
    "env": {"git_commit": "abc", "hardware": {"cpu": "x", "gpus": []}},
    "config": {"trainer": {"max_steps": 1000}, "logger": {"wandb": {"project": "p"}}},
}  # fmt: skip


def test_the_reader_gives_back_what_the_run_s_writer_wrote(tmp_path: Path) -> None:
    """A record built and written as a run does it (`new_record`, the `Recorder`), read back: the same JSON, and
    the typed fields hold its values, extras included."""
    built = new_record(compose(["experiment=cpu_small"]), tmp_path)
    built.metrics.update({"test_acc": 0.5, "step_time_median_s": 0.01, "peak_memory_kind": "rss"})
    built.data.update({"seq_len": 512, "majority_share": 0.25})
    built.run.segments = [{"started_at": built.run.started_at, "from_step": 0, "code": built.code}]
    built.diagnostics.update({"best": {"summary": {"mass_within_16": 0.9}}, "latest": {"summary": {}}})
    recorder = Recorder(built, tmp_path, is_zero=True)
    recorder.finish()
    rec = read(recorder.path)
    assert rec.to_dict() == json.loads(recorder.path.read_text()) == built.to_dict()
    assert (rec.metrics.test_acc, rec.metrics.extra) == (0.5, {"peak_memory_kind": "rss"})
    assert rec.data.get("majority_share") == 0.25
    assert rec.run.segments == built.run.segments and rec.run.finished_at == built.run.finished_at
    assert rec.env_part("hardware") == built.env["hardware"] and rec.config_at("trainer.max_steps") is not None
    assert rec.diagnostics_summary() == {"mass_within_16": 0.9}  # the best checkpoint's, not the latest's


def test_a_schema_1_record_reads_with_the_newer_keys_null(tmp_path: Path) -> None:
    path = tmp_path / results.FILENAME
    path.write_text(json.dumps(SCHEMA_1))
    rec = read(path)
    assert (rec.schema_version, rec.status, rec.task, rec.seed) == (1, "completed", "listops", 3)
    assert (rec.fingerprint, rec.identity, rec.off_protocol, rec.evaluation) == (None, None, None, None)
    assert (rec.stage, rec.pretraining) == ("supervised", "none")
    assert rec.metrics.test_acc == 0.36 and (rec.metrics.timed_steps, rec.metrics.test_examples) == (None, None)
    assert rec.run.output_dir == "/runs/r" and rec.run.segments is None and rec.run.planned_steps is None
    assert rec.config_at("trainer.max_steps") == 1000 and rec.config_at("logger.wandb.project") == "p"
    assert rec.config_at("trainer.nothing.here") is None and rec.config_at("logger.wandb.project.x") is None
    assert rec.diagnostics_summary() == {"mass_within_16": 0.5}  # no best marked: the latest
    assert rec.env_part("runtime") == {}  # not recorded then


def test_missing_or_null_sections_read_empty_and_the_stage_comes_from_an_older_config() -> None:
    rec = typed({"schema_version": 2, "status": "failed", "metrics": None, "env": None, "run": "not a section"})
    assert rec.metrics == Metrics() and rec.run == RunInfo() and rec.data.seq_len is None
    assert (rec.env, rec.config, rec.env_part("hardware"), rec.diagnostics_summary()) == ({}, {}, {}, {})
    assert rec.status == "failed" and rec.error is None and rec.config_at("trainer.max_steps") is None
    older = typed({"stage": None, "config": {"stage": "pretrain", "pretraining": "mlm"}})
    assert (older.stage, older.pretraining) == ("pretrain", "mlm")
    assert typed({"stage": "supervised", "config": {"stage": "pretrain"}}).stage == "supervised"  # the record wins


def test_changing_what_was_read_leaves_the_dict_it_was_read_from() -> None:
    record = json.loads(json.dumps(SCHEMA_1))
    rec = typed(record)
    rec.metrics.test_acc, rec.config["trainer"], rec.status = 0.0, None, "failed"
    assert record == SCHEMA_1
