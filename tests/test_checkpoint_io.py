"""The run's `CheckpointIO` plugin (`lra_bench.run.checkpoints`): why Lightning's own write is not used (checked
on the installed Lightning: if it turns atomic across filesystems, the first test fails and says so), that ours
leaves the previous file or none on a full disk, and that a resume's checkpoint reaches Lightning without a
second read of the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO

from lra_bench.run.checkpoints import RunCheckpointIO
from tests.conftest import small_tmpfs


def _big() -> dict:
    return {"state_dict": {"w": torch.arange(40_000, dtype=torch.float32)}}  # ~160 kB: more than the 96 kB disk


def _loads(path: Path) -> bool:
    try:
        torch.load(path, weights_only=True)
    except Exception:
        return False
    return True


def test_lightning_leaves_a_truncated_checkpoint_on_a_full_disk_of_another_filesystem(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "run", "96k") as run:
        target = run / "best-4.ckpt"
        with pytest.raises(OSError):
            TorchCheckpointIO().save_checkpoint(_big(), target)  # temp file in $TMPDIR, then copied across
        assert target.exists() and not _loads(target)  # the final name holds a half file


def test_ours_keeps_the_previous_file_and_leaves_no_temp_file_on_a_full_disk(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "run", "96k") as run:
        target = run / "best-4.ckpt"
        RunCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(3)}}, target)
        with pytest.raises(OSError, match="No space left on device"):  # the record's error names the cause
            RunCheckpointIO().save_checkpoint(_big(), target)
        assert torch.equal(torch.load(target, weights_only=True)["state_dict"]["w"], torch.ones(3))
        assert sorted(p.name for p in run.iterdir()) == ["best-4.ckpt"]


def test_a_preloaded_checkpoint_is_handed_over_once_without_reading_the_file(tmp_path: Path) -> None:
    io = RunCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(2)}, "global_step": 4}, path)
    preloaded = {"state_dict": {"w": torch.zeros(2)}, "global_step": 4}
    io.preload(tmp_path / "." / "last.ckpt", preloaded)  # the same file by another spelling
    assert io.load_checkpoint(path, weights_only=True) is preloaded  # not the file's content: no second read
    assert torch.equal(io.load_checkpoint(path, weights_only=True)["state_dict"]["w"], torch.ones(2))  # one-shot
