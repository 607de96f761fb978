"""`python -m lra_bench.leaderboard DIR --wandb` and the sweep callback log a real W&B run, offline, and we read back
what W&B wrote: the run record from the `.wandb` transaction log (parsed with wandb's own protobuf schema; the
file is a LevelDB-style log, the format `wandb sync` uploads), and the tables and images from the run's files."""

from __future__ import annotations

import csv
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from lra_bench.leaderboard.render import GROUP_COLUMNS
from lra_bench.leaderboard.sweep_callback import LeaderboardCallback
from lra_bench.record import results
from tests.conftest import REPO, compose

BLOCK = 32 * 1024
HEADER = 7  # ":W&B" + magic (2 bytes) + version (1 byte), then 32 KiB blocks of (crc32, length, type) records


def read_wandb_log(path: Path) -> list[Any]:
    """Every `wandb_internal_pb2.Record` in a `.wandb` file."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, chunks, records = HEADER, b"", []
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # block trailer padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if kind == 0 and length == 0:
            pos += left - 7
            continue
        if pos + length > len(data):  # the service is still writing this record
            break
        chunk, pos = data[pos : pos + length], pos + length
        if kind in (1, 2):  # FULL, FIRST
            chunks = chunk
        else:  # MIDDLE, LAST
            chunks += chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(chunks)
            records.append(record)
    return records


def read_finished_log(path: Path, patience_s: float = 60.0) -> list[Any]:
    """`read_wandb_log` once the run's exit record is there: in-process, `run.finish()` can return a moment
    before W&B's service process has flushed the log (a subprocess's exit waits for it), so a read can also meet a
    record whose bytes are only partly on disk."""
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + patience_s
    while True:
        try:
            records = read_wandb_log(path)
        except DecodeError:
            if time.monotonic() > deadline:
                raise
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def _history(records: list[Any]) -> dict[str, Any]:
    items: dict[str, Any] = {}
    for rec in records:
        if rec.WhichOneof("record_type") == "history":
            for item in rec.history.item:
                items[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return items


def _sweep(root: Path, group: str) -> None:
    for attn, accs in (("full", (0.40, 0.42)), ("nystrom", (0.39, 0.40))):
        for seed, acc in enumerate(accs):
            rec = results.empty_record()
            rec.update(status="completed", task="listops", attn=attn, protocol="nystromformer", seed=seed)
            rec["metrics"].update(test_acc=acc, val_acc=acc, step_time_median_s=0.1 if attn == "full" else 0.04,
                                  peak_memory_mib=800.0 if attn == "full" else 300.0)  # fmt: skip
            rec["data"]["seq_len"] = 1024
            rec["config"] = {"logger": {"wandb": {"project": "lra-test", "entity": None, "group": group}}}
            rec["env"] = {"hardware": {"cpu": "test cpu", "gpus": []}}
            results.write_atomic(root / f"{attn}_{seed}" / results.FILENAME, rec)


def _offline_run(directory: Path) -> Path:
    (run,) = sorted((directory / "wandb").glob("offline-run-*"))
    return run


@pytest.mark.slow
def test_cli_logs_tables_and_charts_to_an_offline_run_in_the_sweeps_group(tmp_path: Path) -> None:
    _sweep(tmp_path, group="leaderboard-nystromformer")
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "elsewhere"), "MPLBACKEND": "Agg"}
    out = tmp_path / "board"
    proc = subprocess.run([sys.executable, "-m", "lra_bench.leaderboard", str(tmp_path), "--wandb", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    run_dir = _offline_run(out)
    assert f"W&B: {run_dir}" in proc.stdout
    records = read_finished_log(next(run_dir.glob("run-*.wandb")))
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.run_group, run.job_type, run.project) == ("leaderboard-nystromformer", "leaderboard", "lra-test")
    assert run.display_name == f"leaderboard-{tmp_path.name}"
    history = _history(records)
    assert history["leaderboard/groups/_type"] == "table-file" and history["leaderboard/groups/nrows"] == 2
    table = json.loads((run_dir / "files" / history["leaderboard/groups/path"]).read_text())
    assert table["columns"] == list(GROUP_COLUMNS)
    with open(out / "leaderboard.csv", newline="") as fh:
        csv_rows = list(csv.DictReader(fh))
    by_attn = {row[table["columns"].index("attn")]: row for row in table["data"]}
    for row in csv_rows:  # the W&B table is the CSV's table
        assert by_attn[row["attn"]][table["columns"].index("test_acc_mean")] == pytest.approx(
            float(row["test_acc_mean"])
        )
    # the tiny sweep is off-protocol: no on-protocol full attention to be the Pareto chart's speed reference
    assert history.get("leaderboard/pareto/nrows", 0) == 0
    charts = {k.split("/")[2] for k in history if k.startswith("leaderboard/charts/") and k.endswith("/_type")}
    assert charts == {"leaderboard_listops"}
    for name in charts:
        assert history[f"leaderboard/charts/{name}/_type"] == "image-file"
        assert (run_dir / "files" / history[f"leaderboard/charts/{name}/path"]).read_bytes()[:4] == b"\x89PNG"


def test_disabled_mode_logs_nothing(tmp_path: Path) -> None:
    _sweep(tmp_path, group="g")
    env = {**os.environ, "WANDB_MODE": "disabled", "MPLBACKEND": "Agg"}
    out = tmp_path / "board"
    argv = [sys.executable, "-m", "lra_bench.leaderboard", str(tmp_path), "--wandb", "--no-plots", "--out", str(out)]
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert not (out / "wandb").exists() and "W&B:" not in proc.stdout


@pytest.mark.slow
def test_sweep_callback_logs_the_same_run_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep whose runs log offline gets an offline leaderboard run in its sweep dir and its W&B group."""
    _sweep(tmp_path, group="my-sweep")
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = compose([f"hydra.sweep.dir={tmp_path}", "logger.wandb.group=my-sweep", "logger.wandb.project=lra-test"],
                  return_hydra_config=True)  # fmt: skip
    callback = LeaderboardCallback(plots=False)
    callback.on_multirun_start(cfg)
    callback.on_multirun_end(cfg)
    records = read_finished_log(next(_offline_run(tmp_path).glob("run-*.wandb")))
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.run_group, run.job_type) == ("my-sweep", "leaderboard")
    assert _history(records)["leaderboard/groups/nrows"] == 2
