"""End to end through run.py: the result record, the summary, and resuming by re-running the same command."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lra_bench.record.results import read_record, validate_record
from tests.conftest import TINY_LISTOPS, run_cli


def record_of(tmp_path: Path, run_name: str) -> dict:
    paths = list((tmp_path / "outputs").rglob(f"{run_name}/results.json"))
    assert len(paths) == 1, paths
    return read_record(paths[0])


def test_tiny_run_writes_a_complete_record(tmp_path: Path) -> None:
    proc = run_cli(["attn=nystrom", "attn.num_landmarks=8", "run_name=tiny", *TINY_LISTOPS], tmp_path)
    record = record_of(tmp_path, "tiny")
    assert validate_record(record) == []
    assert record["status"] == "completed" and record["error"] is None
    assert (record["task"], record["attn"], record["selector"], record["protocol"]) == (
        "listops",
        "nystrom",
        "segment_means",
        "nystromformer",
    )
    m = record["metrics"]
    assert m["train_steps"] == 4 and m["best_step"] in (2, 4)
    for key in ("val_acc", "test_acc"):
        assert 0.0 <= m[key] <= 1.0
    assert m["step_time_median_s"] > 0 and m["tokens_per_s"] > 0 and m["peak_memory_mib"] > 0
    assert m["params"] > 1000 and 0.0 <= m["data_share"] < 1.0
    assert record["data"]["tokenizer_version"] == "listops-v1" and record["data"]["seq_len"] == 64
    assert record["env"]["packages"]["torch"] and record["env"]["hardware"]["cpu_count"]
    assert record["config"]["attn"]["num_landmarks"] == 8 and record["seed"] == 0
    out = Path(record["run"]["output_dir"])
    assert (out / "checkpoints" / "last.ckpt").exists() and list(out.glob("checkpoints/best-*.ckpt"))
    assert (out / "csv").is_dir() and (out / ".hydra" / "config.yaml").exists()
    assert "test accuracy" in proc.stdout and "results.json" in proc.stdout  # the summary


def test_a_run_without_its_data_leaves_no_folder(tmp_path: Path) -> None:
    """Refused for want of data before its first step: the message, exit 2, and no run folder (it used to stay
    behind as a `failed` run, listed beside the runs that trained)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_cli(["task=text", "attn=full", f"data_dir={empty}"], tmp_path, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "error: text (IMDB): " in proc.stderr, proc.stderr[-3000:]
    assert list((tmp_path / "outputs").iterdir()) == [], list((tmp_path / "outputs").rglob("*"))
    assert list(empty.iterdir()) == []


def test_a_run_without_its_data_keeps_a_folder_that_held_a_run(tmp_path: Path) -> None:
    """The same refusal in a folder an earlier run trained in (a resume): the folder and its record stay as they
    were."""
    data = tmp_path / "data"
    args = ["attn=full", "run_name=kept", *TINY_LISTOPS, f"data_dir={data}"]
    run_cli(args, tmp_path)
    out = tmp_path / "outputs" / "listops" / "full" / "kept"
    record = (out / "results.json").read_bytes()
    shutil.rmtree(data / "listops-1000")  # the data is gone
    proc = run_cli([*args, "task.generate_if_missing=false"], tmp_path, check=False)
    assert proc.returncode == 2 and "error: ListOps files basic_{train,val,test}.tsv not found" in proc.stderr
    assert (out / "results.json").read_bytes() == record and (out / "checkpoints" / "last.ckpt").exists()


@pytest.mark.slow
def test_another_schedule_in_the_same_folder_is_refused(tmp_path: Path) -> None:
    """`run_name=` forces the folder; `trainer.max_steps=6` is another experiment than the 4-step run in it, so it
    is refused (it used to resume the 4-step run's checkpoint and record the result as its own)."""
    args = ["attn=full", "run_name=resume", *TINY_LISTOPS]
    run_cli(args, tmp_path)
    first = record_of(tmp_path, "resume")
    assert first["metrics"]["train_steps"] == 4 and first["run"]["resumed_from_step"] is None
    path = Path(first["run"]["output_dir"]) / "results.json"
    before = path.read_bytes()
    proc = run_cli([*args, "trainer.max_steps=6"], tmp_path, check=False)
    assert proc.returncode == 2
    assert "holds another experiment" in proc.stderr and "trainer.max_steps: 4 → 6" in proc.stderr
    assert path.read_bytes() == before
    assert json.loads(before)["status"] == "completed"
