"""Every task × {full, nystrom, gpa} trains a few steps through `run.py` on tiny fixtures in the official formats
and writes a completed `results.json` that records the protocol, lengths, tokenizer and split convention.

The matrix runs as three Hydra multiruns (tasks that accept the same overrides share one), so the interpreter
and its imports start three times, not eighteen.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from lra_bench.registry import ATTENTIONS
from tasks.generate import listops as listops_generator
from tests.conftest import TINY_LISTOPS, run_cli
from tests.test_tasks_image import write_cifar_pickles
from tests.test_tasks_pathfinder import write_pathfinder
from tests.test_tasks_retrieval import ROWS, write_aan
from tests.test_tasks_text import write_aclimdb

pytestmark = pytest.mark.slow

ATTNS = ("full", "nystrom", "gpa")
COMMON = [a for a in TINY_LISTOPS if not a.startswith(("task.", "data.batch_size="))] + ["data.batch_size=4"]


def _sequences(data: Path) -> list[str]:
    """ListOps (official TSV layout), IMDB (aclImdb folder) and AAN (tsv_data) at 64 tokens."""
    listops_generator.write_splits(
        data / "listops-1000", 48, 12, 12, progress=False, seed=0, max_depth=4, max_args=5, min_length=8, max_length=64
    )
    write_aclimdb(data)
    write_aan(data / "tsv_data", rows=ROWS * 3)
    return ["task.max_length=64", "task.seq_len=64"]


def _images(data: Path) -> list[str]:
    """CIFAR-10 (pickle folder) and Pathfinder-32 (text metadata, one zero-byte PNG): 1024 pixel tokens."""
    write_cifar_pickles(data)
    write_pathfinder(data, per_folder=10, empty=(5,))
    return []


def _pathx(data: Path) -> list[str]:
    """Path-X's own code path and config on 32-px images (16,384 tokens are too many for a CPU smoke test),
    with LRA's pixel-0-is-padding mask: black pixels masked, which every attention must survive."""
    write_pathfinder(data, per_folder=10)
    return ["task.resolution=32", "task.seq_len=1024", "task.max_length=1024", "task.pixel0_is_padding=true"]


GROUPS: dict[str, tuple[tuple[str, ...], Callable[[Path], list[str]]]] = {
    "sequences": (("listops", "text", "retrieval"), _sequences),
    "images": (("image", "pathfinder"), _images),
    "pathx": (("pathx",), _pathx),
}


@pytest.mark.parametrize("group", list(GROUPS))
def test_tasks_train_with_every_attention(group: str, tmp_path: Path) -> None:
    tasks, write = GROUPS[group]
    attns = list(ATTNS)
    assert set(attns) <= set(ATTENTIONS.names())
    data = tmp_path / "data"
    data.mkdir()
    task_args = write(data)
    sweep = tmp_path / "multirun"
    run_cli(
        [
            "hydra.mode=MULTIRUN",
            f"task={','.join(tasks)}",
            f"attn={','.join(attns)}",
            *task_args,
            *COMMON,
            f"data_dir={data}",
            f"hydra.sweep.dir={sweep}",
        ],
        tmp_path,
        timeout=900,
    )
    records = [json.loads(p.read_text()) for p in sorted(sweep.rglob("results.json"))]
    assert sorted((r["task"], r["attn"]) for r in records) == sorted((t, a) for t in tasks for a in attns)
    for record in records:
        where = f"task={record['task']} attn={record['attn']}"
        assert record["status"] == "completed", f"{where}: {record.get('error')}"
        assert record["protocol"] == "nystromformer", where
        assert record["metrics"]["train_steps"] == 4 and record["metrics"]["val_acc"] is not None, where
        assert record["metrics"]["test_acc"] is not None, where
        d = record["data"]
        assert d["tokenizer_version"] and d["split"] and d["source"], where
        assert d["seq_len"] == (64 if group == "sequences" else 1024), where
        if record["task"] in ("text", "retrieval"):
            assert d["text_length"] == 64, where
