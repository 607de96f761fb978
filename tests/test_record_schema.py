"""The typed record (`lra_bench.record.schema`) writes exactly the JSON shape readers know: the same keys in the same
order as the dict records written before it, and a section's extra keys (a task's `review_form`, the run's
`majority_share`, the efficiency monitor's `peak_memory_kind`) after the schema's, in the order they were set."""

from __future__ import annotations

import json
from pathlib import Path

from lra_bench.record import results
from lra_bench.record.schema import Identified, RunRecord

#: the schema-2 file layout, as written before the record was typed (key order included)
TOP = [
    "schema_version", "status", "error", "task", "attn", "selector", "protocol", "rank_budget", "seed",
    "fingerprint", "identity", "code", "off_protocol", "deviations", "evaluation", "predictions", "stage",
    "pretraining", "pretrained", "pretrain", "run", "metrics", "diagnostics", "data", "env", "config",
]  # fmt: skip
RUN = [
    "name", "output_dir", "started_at", "finished_at", "wandb_id", "resumed_from_step", "resumed_from",
    "planned_steps", "segments",
]  # fmt: skip
METRICS = [
    "val_acc", "test_acc", "test_loss", "test_examples", "best_step", "train_steps", "step_time_median_s",
    "tokens_per_s", "peak_memory_mib", "params", "data_share", "timed_steps", "step_time_iqr_s", "load_avg_1m",
]  # fmt: skip
DATA = ["text_length", "max_length", "seq_len", "tokenizer_version", "split", "source"]


def test_the_empty_record_has_the_schema_keys_in_file_order() -> None:
    record = results.empty_record()
    assert list(record) == TOP
    assert list(record["run"]) == RUN and list(record["metrics"]) == METRICS and list(record["data"]) == DATA
    assert record["diagnostics"] == {"latest": None, "best": None}
    assert (record["schema_version"], record["status"], record["stage"], record["pretraining"]) == (
        2,
        "running",
        "supervised",
        "none",
    )
    assert record["env"] == {} and record["config"] == {} and record["run"]["segments"] is None
    assert results.validate_record(record) == []


def test_extra_section_keys_follow_the_schema_keys_in_the_order_set(tmp_path: Path) -> None:
    record = RunRecord()
    record.data.update({"max_length": 64, "review_form": "bytes", "source": "x"})  # a text task's data_info
    record.data.update({"majority_share": 0.5})
    record.metrics.update({"step_time_median_s": 0.1, "peak_memory_kind": "rss", "params": 10})
    record.set_identity(Identified({"a": 1}, "0123456789abcdef", False, {}))
    path = tmp_path / results.FILENAME
    results.write_atomic(path, record.to_dict())
    written = json.loads(path.read_text())
    assert list(written) == TOP
    assert list(written["data"]) == [*DATA, "review_form", "majority_share"]
    assert list(written["metrics"]) == [*METRICS, "peak_memory_kind"]
    assert (written["data"]["max_length"], written["data"]["review_form"], written["metrics"]["params"]) == (
        64,
        "bytes",
        10,
    )
    assert (written["fingerprint"], written["identity"], written["off_protocol"]) == (
        "0123456789abcdef",
        {"a": 1},
        False,
    )
    assert record.data.get("majority_share") == 0.5 and record.metrics.get("params") == 10
