"""`experiment=spt/<task>` through run.py: both stages, the record links, skipping a finished pretraining stage, and
resuming after SIGKILL in either stage to exactly the weights (and pretraining curve) of an uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import pytest

from lra_bench.record.identity import config_identity, fingerprint
from tests.conftest import (
    checkpoint_step,
    fault,
    kill_at_checkpoint,
    max_weight_difference,
    resumable_tiny_listops,
    run_cli,
    run_record,
)

SPT_ARGS = [*resumable_tiny_listops(12), "experiment=spt/listops", "attn=full", "spt.pretrain.trainer.max_steps=12"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("spt-e2e")
    run_cli([*SPT_ARGS, "run_name=straight"], root)
    return root, root / "outputs" / "listops" / "full" / "straight"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_one_command_pretrains_then_finetunes_and_links_the_records(straight: tuple[Path, Path]) -> None:
    root, job = straight
    pre, fine = run_record(job / "pretrain"), run_record(job / "finetune")
    assert (pre["status"], pre["stage"], pre["pretraining"]) == ("completed", "pretrain", "mlm")
    assert (fine["status"], fine["stage"], fine["pretraining"]) == ("completed", "supervised", "mlm")
    assert pre["metrics"]["train_steps"] == 12 and fine["metrics"]["train_steps"] == 12
    assert 0.0 <= fine["metrics"]["test_acc"] <= 1.0 and pre["metrics"]["test_acc"] is None
    linked = fine["pretrained"]
    assert linked["run_dir"] == str((job / "pretrain").resolve()) and linked["checkpoint_step"] == 12
    assert linked["fingerprint"] == (pre.get("fingerprint") or fingerprint(config_identity(pre["config"])))
    assert fine["config"]["pretraining_fingerprint"] == linked["family_fingerprint"]
    assert not (job / "results.json").exists()  # the job dir holds its stages' records only

    started = pre["run"]["started_at"]
    proc = run_cli([*SPT_ARGS, "run_name=straight"], root)  # the same command again
    assert "pretraining stage already completed" in proc.stdout
    assert run_record(job / "pretrain")["run"]["started_at"] == started  # not rerun, not even resumed
    again = run_record(job / "finetune")
    assert again == fine  # a completed fine-tune is left as it is too (its record byte-identical: not re-tested)

    proc = run_cli([*SPT_ARGS, "run_name=straight", "spt.mask_ratio=0.3"], root, check=False)
    assert proc.returncode == 2
    assert "holds a completed pretraining run of another configuration (differs in: spt.mask_ratio)" in proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("stage", "kill_at"), [("pretrain", 10), ("finetune", 10)])
def test_sigkill_in_either_stage_then_same_command_matches_an_uninterrupted_run(
    straight: tuple[Path, Path], stage: str, kill_at: int
) -> None:
    root, reference = straight
    name = f"killed-{stage}"
    args = [*SPT_ARGS, f"run_name={name}", *fault(step_sleep_s=0.4)]  # slow steps: time to kill
    job = root / "outputs" / "listops" / "full" / name
    last = job / stage / "checkpoints" / "last.ckpt"
    kill_at_checkpoint(args, root, last, kill_at, root / f"{name}-first-attempt.log", timeout_s=400)
    assert run_record(job / stage)["status"] == "running" and checkpoint_step(last) == kill_at

    proc = run_cli(args, root)  # the same command again
    if stage == "finetune":
        assert "pretraining stage already completed" in proc.stdout
    assert run_record(job / stage)["run"]["resumed_from_step"] == kill_at
    for part in ("pretrain", "finetune"):
        got, want = run_record(job / part), run_record(reference / part)
        assert got["status"] == "completed"
        assert got["metrics"]["train_steps"] == want["metrics"]["train_steps"] == 12
        diff = max_weight_difference(job / part, reference / part)
        assert diff == 0.0, f"{part}: final weights differ by up to {diff:g} after a kill in the {stage} stage"
        for key in ("val_acc", "test_acc", "best_step"):
            assert got["metrics"][key] == want["metrics"][key], (part, key)
    assert run_record(job / "pretrain")["pretrain"]["curve"] == run_record(reference / "pretrain")["pretrain"]["curve"]
