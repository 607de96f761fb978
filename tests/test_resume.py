"""Resume: a run killed with SIGKILL and started again with the same command ends exactly like an uninterrupted one.

That needs the data order restored mid-epoch (`tasks.base.ResumableSampler`, a pure function of seed, epoch and
position, the position being `global_step` restored by Lightning), the dropout RNG restored
(`lra_bench.run.checkpoints.RNGState`) and a `last.ckpt` that is written periodically and after validations
(`LastCheckpoint`). Deterministic CPU training, so "the same" means bit-identical weights.
"""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from tasks.base import ResumableSampler
from tests.conftest import (
    checkpoint_step,
    fault,
    kill_at_checkpoint,
    max_weight_difference,
    resumable_tiny_listops,
    run_cli,
    run_record,
)


class _Sized(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def _stream(sampler: ResumableSampler, position: list[int], batches: int) -> list[int]:
    """What a trainer would consume: iterate epoch after epoch, `position[0]` counting consumed batches."""
    out: list[int] = []
    while len(out) < batches * sampler.batch_size:
        for i, idx in enumerate(iter(sampler)):
            out.append(idx)
            if (i + 1) % sampler.batch_size == 0:
                position[0] += 1
            if len(out) == batches * sampler.batch_size:
                break
    return out


def test_sampler_order_is_a_function_of_seed_epoch_and_position() -> None:
    ds, bs = _Sized(50), 4  # 12 batches per epoch, 2 samples dropped
    pos = [0]
    full = _stream(ResumableSampler(ds, bs, seed=7, consumed_batches=lambda: pos[0]), pos, 40)
    for cut in (5, 12, 17, 30):  # mid-epoch, epoch boundary, later epochs
        pos2 = [cut]
        tail = _stream(ResumableSampler(ds, bs, seed=7, consumed_batches=lambda p=pos2: p[0]), pos2, 40 - cut)
        assert tail == full[cut * bs :], f"resumed at batch {cut}: order differs"
    epoch0, epoch1 = full[: 12 * bs], full[12 * bs : 24 * bs]
    assert len(set(epoch0)) == 48 and epoch0 != epoch1  # a permutation per epoch, a new one each epoch
    other = [0]
    assert _stream(ResumableSampler(ds, bs, seed=8, consumed_batches=lambda: other[0]), other, 12) != epoch0


def test_sampler_ranks_split_each_epoch() -> None:
    ds = _Sized(50)
    ranks = [ResumableSampler(ds, 4, seed=0, num_replicas=2, rank=r, consumed_batches=lambda: 7) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 24  # 6 global batches of 2×4 per epoch
    # 7 batches consumed = epoch 1, batch 1: each rank has 5 batches of 4 left in this epoch
    assert [len(list(iter(s))) for s in ranks] == [20, 20]
    assert list(iter(ranks[0])) == ranks[0].order(1)[4:].tolist()
    for e in range(3):
        assert not set(ranks[0].order(e)) & set(ranks[1].order(e))
        assert len(np.union1d(ranks[0].order(e), ranks[1].order(e))) == 48


def test_sampler_without_trainer_follows_set_epoch() -> None:
    s = ResumableSampler(_Sized(20), 5, seed=1)
    first = list(iter(s))
    s.set_epoch(1)
    assert sorted(first) == sorted(iter(s)) and first != list(iter(s))


# -- end to end -----------------------------------------------------------------------------------------------------
# 24 steps of 8 batches per epoch: three epochs; last.ckpt after validations at 6, 12, 18, 24 and periodically at
# 5, 10, 15, 20
RESUME_ARGS = [*resumable_tiny_listops(24), "attn=nystrom"]


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The uninterrupted reference run (shared by the kill tests)."""
    root = tmp_path_factory.mktemp("resume")
    run_cli([*RESUME_ARGS, "run_name=straight"], root)
    return root, run_record(root / "outputs" / "listops" / "nystrom" / "straight")


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("kill_at", "saved_by"),
    [(10, "every_n_train_steps, mid-epoch"), (12, "after a validation, mid-epoch")],
)
def test_sigkill_then_same_command_matches_an_uninterrupted_run(
    straight_run: tuple[Path, dict], kill_at: int, saved_by: str
) -> None:
    root, reference = straight_run
    base = root / "outputs" / "listops" / "nystrom"
    name = f"killed{kill_at}"
    killed_args = [*RESUME_ARGS, f"run_name={name}", *fault(step_sleep_s=0.4)]  # slow steps: time to kill
    killed = base / name
    last = killed / "checkpoints" / "last.ckpt"
    proc = kill_at_checkpoint(killed_args, root, last, kill_at, root / f"{name}-first-attempt.log")
    assert proc.returncode == -signal.SIGKILL
    assert run_record(killed)["status"] == "running"  # SIGKILL: nothing could record the end
    assert checkpoint_step(last) == kill_at, f"meant to resume from the checkpoint saved {saved_by}"

    run_cli(killed_args, root)  # the same command again
    resumed = run_record(killed)
    assert resumed["status"] == "completed" and resumed["run"]["resumed_from_step"] == kill_at
    for key in ("val_acc", "test_acc", "train_steps", "best_step"):
        assert resumed["metrics"][key] == reference["metrics"][key], key
    assert resumed["metrics"]["train_steps"] == 24
    diff = max_weight_difference(base / "straight", killed)
    assert diff == 0.0, f"final weights differ by up to {diff:g} (resumed from the checkpoint saved {saved_by})"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_rerunning_a_finished_run_reports_the_same_numbers(straight_run: tuple[Path, dict]) -> None:
    root, reference = straight_run
    path = root / "outputs" / "listops" / "nystrom" / "straight" / "results.json"
    before = path.read_bytes()
    proc = run_cli([*RESUME_ARGS, "run_name=straight"], root)
    assert "already completed" in proc.stdout and path.read_bytes() == before  # left as it was, not re-tested
    again = run_record(root / "outputs" / "listops" / "nystrom" / "straight")
    keys = ("val_acc", "test_acc", "train_steps", "best_step", "step_time_median_s", "peak_memory_mib")
    assert {k: again["metrics"][k] for k in keys} == {k: reference["metrics"][k] for k in keys}
