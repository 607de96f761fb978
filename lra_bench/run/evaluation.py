"""Testing exactly one checkpoint: `python run.py train=false ckpt_path=PATH` and `python -m lra_bench.evaluate PATH`.

The checkpoint's weights *and* buffers (GPA's codebook, Performer's features) are loaded by Lightning's own
`trainer.test(ckpt_path=...)`, after `checkpoints.check_fits` has refused a checkpoint of another model, so its test
accuracy and loss are the ones its training run recorded for it (same per-example computation).

An evaluation writes `results.json` with status `evaluated` (and `evaluation` = {checkpoint, checkpoint_step,
checkpoint_fingerprint}) plus `test_predictions.npz` into its own folder, never into a training run's (a folder
holding a training record is refused): `run.py train=false` into its Hydra run dir, `python -m lra_bench.evaluate`
into `<run dir>/eval/<checkpoint name>/` or `--out DIR`. Re-running the same evaluation leaves its record
byte-identical (`retest=true` / `--retest` tests again). The leaderboard never counts evaluations as training runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from omegaconf import DictConfig
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from lra_bench.config.spec import RunSpec, settle
from lra_bench.errors import ConfigError
from lra_bench.record import results
from lra_bench.record.checkpoint_file import CHECKPOINT_DIR, meta_of
from lra_bench.record.schema import RunRecord
from lra_bench.run import checkpoints, rundir
from lra_bench.run.build import (
    build_datamodule,
    build_module,
    majority_share,
    prepare_data,
    slurm_plugins,
    trainer_kwargs,
)
from lra_bench.run.checkpoints import check_fits
from lra_bench.run.console import print_summary
from lra_bench.run.recorder import Recorder, TestOutputs, run_test
from lra_bench.run.terminal import quiet_terminal, tee_output


def checkpoint_to_test(cfg: DictConfig, output_dir: Path) -> str:
    """The absolute path of the checkpoint `train=false` tests; a missing one is a one-line error."""
    value = cfg.get("ckpt_path")
    if value in (None, "none", "null"):
        raise ConfigError(
            "train=false needs ckpt_path=<a .ckpt file>, the checkpoint to test "
            "(e.g. <run dir>/checkpoints/best-<step>.ckpt)"
        )
    if value == "last":
        found = checkpoints.find_resumable(Path(output_dir) / CHECKPOINT_DIR).path
        if found is None:
            raise ConfigError(
                f"train=false with ckpt_path=last: no checkpoint in {Path(output_dir) / CHECKPOINT_DIR}; "
                "give ckpt_path=<a .ckpt file>"
            )
        return str(Path(found).resolve())
    path = Path(str(value)).expanduser()
    if not path.is_file():
        raise ConfigError(f"ckpt_path={value}: no such file; train=false needs an existing .ckpt to test")
    return str(path.resolve())


def evaluate_into(cfg: DictConfig, out: Path) -> None:
    """`evaluate` into `out` as `python -m lra_bench.evaluate` runs it: the folder made, and the terminal teed to
    `out/run.log` (rank 0) and quieted as `run.py`'s is, so the terminal shows what a person reads."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / "run.log" if getattr(rank_zero_only, "rank", 0) == 0 else None
    with tee_output(log), quiet_terminal():
        evaluate(settle(cfg, out))


def evaluate(spec: RunSpec) -> dict[str, Any]:
    """Test the checkpoint `ckpt_path` with the model the config describes; write and return the `evaluated`
    record. Called by `lra_bench.run.entry.run_stage` (run dir locked) and `evaluate_into`."""
    cfg, output_dir = spec.config, spec.output_dir
    is_zero = getattr(rank_zero_only, "rank", 0) == 0
    ckpt = checkpoint_to_test(cfg, output_dir)
    existing = rundir.read_existing_record(output_dir)
    if existing is not None and existing.get("evaluation") is None:
        raise ConfigError(
            f"{output_dir / results.FILENAME} is a training run's record (status {existing.get('status')}); an "
            "evaluation never replaces it: evaluate into another folder (drop run_name=, or --out DIR)"
        )
    recorder = Recorder(spec.start_record(), output_dir, is_zero)
    record = recorder.record
    record.run.planned_steps = None
    record.evaluation = {"checkpoint": ckpt, "checkpoint_step": None, "checkpoint_fingerprint": None}
    recorder.owned = existing is None  # a new folder records even a refusal; an earlier evaluation is kept till now
    recorder.write()
    try:
        pl.seed_everything(int(cfg.seed), workers=True)
        dm = build_datamodule(cfg)
        prepare_data(dm, output_dir, is_zero)
        record.data.update({**dm.data_info(), "majority_share": majority_share(dm) if is_zero else None})
        module = build_module(cfg, dm)
        found = spec.identify(rundir.data_identity_of(dm))
        record.set_identity(found)
        record.evaluation = checkpoint_facts(ckpt, found.identity, module)
        if existing is not None and _same_evaluation(existing, record) and not cfg.get("retest"):
            if is_zero:
                print_summary(existing)
                print(f"[lra-bench] already evaluated: {recorder.path} left unchanged (retest=true tests again)")
            return existing
        recorder.own()
        outputs = TestOutputs()
        trainer = pl.Trainer(
            **trainer_kwargs(cfg),
            callbacks=[outputs],
            logger=False,
            default_root_dir=str(output_dir),
            enable_checkpointing=False,
            enable_progress_bar=bool(cfg.callbacks.progress_bar),
            plugins=slurm_plugins(),
        )
        recorder.add_test(run_test(trainer, module, dm, ckpt, outputs, output_dir))
        record.metrics.params = sum(p.numel() for p in module.parameters())
        record.status = "evaluated"
    except BaseException as err:
        recorder.fail(err)
        raise
    finally:
        recorder.finish()
    if is_zero:
        print_summary(recorder.as_dict())
    return recorder.as_dict()


def checkpoint_facts(ckpt: str, identity: dict[str, Any], module: pl.LightningModule) -> dict[str, Any]:
    """The record's `evaluation` section, once the checkpoint is known to fit the model (`check_fits`)."""
    checkpoint = check_fits(ckpt, identity, module)
    meta = meta_of(checkpoint) or {}
    return {
        "checkpoint": ckpt,
        "checkpoint_step": int(checkpoint.get("global_step", 0)),
        "checkpoint_fingerprint": meta.get("fingerprint"),
    }


def _same_evaluation(existing: dict[str, Any], record: RunRecord) -> bool:
    """Whether `existing` is a finished evaluation of the same checkpoint (path, step, fingerprint) by the same
    experiment (fingerprint, data included)."""
    return (
        existing.get("status") == "evaluated"
        and existing.get("fingerprint") == record.fingerprint
        and existing.get("evaluation") == record.evaluation
    )
