"""The training stage: build data and model, settle what must be known before the first step, fit, test on the
best-val checkpoint, record (`train`). Called by `lra_bench.run.entry.run_stage`, which has validated the config and
holds the run dir's lock. Under DDP every rank runs it; only rank 0 writes the record, config tree and summary.

Before anything is written to a run dir that already holds a record, in order: the schedule can run as the record
will describe it (`check_schedule`: a batch larger than the train split gives 0 optimizer steps and Lightning would
"finish"; no validation before `max_steps` leaves no best-val checkpoint to test; a split it needs is empty); the
run's identity with its data's and how it deviates from its protocol (`RunSpec.identify`); the run dir holds
this experiment or none (`rundir.check_same_experiment`); a completed run is left byte-identical (unless
`retest=true`); the checkpoint to resume from loads and was made by this model (`Start.use_checkpoint`:
`checkpoints.check_fits`, warning when the code changed since). Every refusal is one `ConfigError` line.

Resuming is the default: the run dir is derived from the overrides (same command → same dir), and `ckpt_path=last`
continues from `checkpoints/last.ckpt` (`lra_bench.run.checkpoints`). A record says `completed` only when every
planned step ran (`check_steps_ran` turns a fit that returned early into a failure) and the best-val checkpoint was
tested. The record is this stage's alone (`lra_bench.run.recorder`): the callbacks and helpers return or expose
their numbers, and the helpers below put them into it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from pytorch_lightning.callbacks import ModelCheckpoint, ModelSummary
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from lra_bench.config.spec import RunSpec
from lra_bench.diagnostics.callback import DiagnosticsCallback
from lra_bench.errors import ConfigError
from lra_bench.kit.say import say
from lra_bench.record.checkpoint_file import CHECKPOINT_DIR, load_checkpoint, load_usable
from lra_bench.record.curves import write_curves
from lra_bench.record.schema import Identified, RunRecord
from lra_bench.run import checkpoints, pretrain, rundir
from lra_bench.run.build import (
    build_datamodule,
    build_module,
    instantiate_callbacks,
    majority_share,
    prepare_data,
    slurm_plugins,
    trainer_kwargs,
)
from lra_bench.run.console import chosen_preset, opening_line, print_config, print_summary, resume_command
from lra_bench.run.metrics import EfficiencyMonitor, build_loggers, finish_wandb
from lra_bench.run.recorder import Recorder, TestOutputs, run_test
from lra_bench.run.rundir import point_latest
from lra_bench.run.signals import StopSignals, tell
from lra_bench.run.terminal import progress_callbacks


def _size(dm: Any, split: str) -> int:
    data = dm.splits.get(split)
    return 0 if data is None else len(data)


def validation_interval(cfg: DictConfig, batches_per_epoch: int) -> int:
    """Training batches between validations (`trainer.val_check_interval`: batches, or a fraction of an epoch)."""
    value = cfg.trainer.get("val_check_interval", 1.0)
    if isinstance(value, float) and value <= 1.0:
        return max(1, int(batches_per_epoch * value))
    return int(value)


def check_schedule(cfg: DictConfig, dm: Any) -> None:
    """Raise `ConfigError` when the planned schedule cannot run as the record will describe it."""
    train_n, batch = _size(dm, "train"), int(cfg.data.batch_size)
    accumulate = int(cfg.trainer.get("accumulate_grad_batches", 1) or 1)
    max_steps = int(cfg.trainer.max_steps)
    steps_per_epoch = (train_n // batch) // accumulate
    if steps_per_epoch == 0:
        raise ConfigError(
            f"the train split has {train_n} examples: with data.batch_size={batch}"
            + (f" and trainer.accumulate_grad_batches={accumulate}" if accumulate > 1 else "")
            + f" that is 0 optimizer steps per epoch, so none of trainer.max_steps={max_steps} can run; use "
            f"data.batch_size <= {train_n // accumulate if accumulate > 1 else train_n}"
        )
    if cfg.train and _size(dm, "val") == 0:
        raise ConfigError(f"the val split is empty ({dm.name}): no best-val checkpoint to test; check the data")
    limit = cfg.trainer.get("limit_val_batches", 1.0)
    if cfg.train and limit is not None and float(limit) == 0:
        raise ConfigError(
            "trainer.limit_val_batches=0: no validation runs, so there is no best-val checkpoint to test; "
            "use a positive value"
        )
    interval = validation_interval(cfg, train_n // batch)
    if cfg.train and interval > max_steps * accumulate:
        raise ConfigError(
            f"trainer.val_check_interval={cfg.trainer.val_check_interval} ({interval} steps) > "
            f"trainer.max_steps={max_steps}: no validation would run, so there is no best-val checkpoint to test; "
            f"use trainer.val_check_interval <= {max_steps}"
        )
    tests = cfg.test and cfg.get("stage", "train") != "pretrain"  # a pretraining stage never tests
    if tests and _size(dm, "test") == 0:
        raise ConfigError(f"test=true but the test split is empty ({dm.name}); check the data or set test=false")


def check_steps_ran(trained: int, planned: int) -> None:
    """A fit that returned before `planned` steps is a failure, never a completion."""
    if trained < planned:
        raise RuntimeError(
            f"training stopped after {trained} of trainer.max_steps={planned} planned steps; "
            "re-running the same command resumes"
        )


def warmup_warning(cfg: DictConfig) -> str | None:
    """One line when the learning rate never reaches `optim.lr`: `optim.warmup_steps >= trainer.max_steps`.

    Every schedule (`lra_bench.run.module.adamw_with_schedule`, `onecycle` included) reaches its peak at the end of
    the warm-up, so a run shrunk by hand (`trainer.max_steps=20` under the protocol's 1,000 warm-up steps) trains at
    a few percent of its learning rate and typically predicts one class: trainable, but misleading, so it warns
    instead of refusing.
    """
    warmup, max_steps = int(cfg.optim.get("warmup_steps", 0) or 0), int(cfg.trainer.max_steps)
    if warmup < max_steps:
        return None
    reached = min(1.0, max_steps / warmup) if warmup else 1.0
    return (
        f"[lra-bench] warning: optim.warmup_steps={warmup} >= trainer.max_steps={max_steps}: the learning rate "
        f"never passes the warm-up (it reaches {100 * reached:.0f}% of optim.lr={cfg.optim.lr} at the last step); "
        f"set optim.warmup_steps below trainer.max_steps (e.g. optim.warmup_steps={max(1, max_steps // 10)}), or "
        "try experiment=smoke / experiment=cpu_small"
    )


@dataclass
class Start:
    finished: dict[str, Any] | None  # the run dir's completed record of this experiment (left untouched)
    previous: dict[str, Any] | None  # with retest=true: that completed record (its training numbers are kept)
    stamp: checkpoints.IdentityStamp | None  # the callback that writes the identity into every checkpoint

    def use_checkpoint(self, resume: checkpoints.Resume, module: Any, code: dict[str, Any] | None) -> str | None:
        """Refuse a checkpoint that does not load or was made by another model; warn when the code changed.
        Returns the record's `run.resumed_from` (the checkpoint's absolute path; None when starting fresh)."""
        if not resume.path or self.stamp is None:
            return None
        checkpoint = checkpoints.check_fits(resume.path, self.stamp.identity, module, resume.checkpoint)
        checkpoints.warn_if_code_changed(checkpoint, code or {}, resume.path)
        return str(Path(resume.path).resolve())


def start_run(cfg: DictConfig, output_dir: Path, record: RunRecord, found: Identified, is_zero: bool) -> Start:
    """After `check_schedule` and `identify` (the record holds their findings): is the run dir this experiment's,
    and is the run already completed there."""
    stored = rundir.check_same_experiment(output_dir, found.identity, found.fingerprint, record.data.to_dict())
    renewed = stored.get("migrated_from") if stored else None
    done = (
        rundir.finished_record(output_dir, found.fingerprint, *filter(None, [renewed]))
        if str(cfg.ckpt_path) == "last"
        else None
    )
    if done is not None and not cfg.get("retest"):
        return Start(finished=done, previous=None, stamp=None)
    if is_zero and (stored is None or renewed):
        rundir.write_identity(output_dir, found.identity, found.fingerprint, record.code or {}, renewed)
    stamp = checkpoints.IdentityStamp(found.identity, found.fingerprint, record.config, record.code or {})
    return Start(finished=None, previous=done, stamp=stamp)


EFFICIENCY_KEYS = (
    "step_time_median_s",
    "timed_steps",
    "step_time_iqr_s",
    "load_avg_1m",
    "tokens_per_s",
    "data_share",
    "peak_memory_mib",
    "peak_memory_kind",
)


@dataclass
class Watched:
    """The callbacks whose numbers the record takes after fit."""

    best: ModelCheckpoint  # best-val weights: the checkpoint the test runs on
    efficiency: EfficiencyMonitor
    test_outputs: TestOutputs


def train(spec: RunSpec) -> dict[str, Any]:
    """Run and return the result record (also written to `<output_dir>/results.json`)."""
    cfg, output_dir = spec.config, spec.output_dir
    is_zero = getattr(rank_zero_only, "rank", 0) == 0
    recorder = Recorder(spec.start_record(), output_dir, is_zero)
    recorder.write()
    if is_zero:
        print_config(cfg, save_to=output_dir / "config_tree.log", terminal=bool(cfg.print_config))
    requeue = checkpoints.SubmititRequeue(grace_s=requeue_grace_s())
    stop = StopSignals(output_dir / CHECKPOINT_DIR).install()  # SIGTERM/Ctrl-C: finish the step, save, exit 143/130
    trainer: pl.Trainer | None = None
    start: Start | None = None
    try:
        pl.seed_everything(int(cfg.seed), workers=True)
        if is_zero:  # what this run is, before its data is prepared (minutes, for a protocol's data)
            print(opening_line({**recorder.as_dict(), **spec.protocol}, chosen_preset()), flush=True)
        dm, module, start = prepare(spec, recorder)
        if start.finished is not None:
            if is_zero:
                print_summary(start.finished)
                print(f"[lra-bench] already completed: {recorder.path} left unchanged (retest=true tests again)")
            return start.finished
        resume = resume_checked(cfg, output_dir, recorder, start, module)
        watched, callbacks, bar = assemble_callbacks(cfg, dm, output_dir, recorder, start, [requeue, stop])
        trainer, checkpoint_io = build_trainer(cfg, output_dir, callbacks, bar, recorder.record)
        stop.trainer = trainer
        if resume.path is not None and resume.checkpoint is not None:
            checkpoint_io.preload(resume.path, resume.checkpoint)  # Lightning restores from it: no second read
            resume.checkpoint = None
        trainer.fit(module, datamodule=dm, ckpt_path=resume.path, weights_only=True)
        best = record_fit(cfg, trainer, module, watched, start, recorder.record)
        record_test(cfg, trainer, module, dm, best, watched, recorder, output_dir)
        recorder.record.status = "completed"
    except BaseException as err:
        replacement = record_stop(err, stop, trainer, start, recorder)
        if replacement is None:
            raise
        raise replacement from err
    finally:
        stop.close()  # the record and the exit come next: a signal from now on is told, not raised into them
        recorder.finish()
        finish_wandb()
        if is_zero and recorder.owned and stop.received is None:  # a stopped run draws them when it completes
            draw_curves(output_dir, recorder.as_dict())
        stopped = recorder.record.status == "interrupted"
        if is_zero and stopped:  # however and whenever it stopped: the step saved, the command that resumes
            step = trainer.global_step if trainer is not None else None
            tell(stop.stopped_line(step, resume_command(cfg, output_dir)))
        stop.restore(stopped)
        if requeue.pending:  # submitit's USR2 arrived: the step is saved, now let submitit requeue (exits)
            requeue.hand_over()
    if is_zero:
        print_summary(recorder.as_dict())
    return recorder.as_dict()


def prepare(spec: RunSpec, recorder: Recorder) -> tuple[Any, pl.LightningModule, Start]:
    """The data (rank 0 prepares it first), the module, and the start checks; the record takes what they find."""
    cfg, output_dir, source = spec.config, spec.output_dir, spec.source
    record, pretraining_stage = recorder.record, cfg.stage == "pretrain"
    dm = build_datamodule(cfg)
    prepare_data(dm, output_dir, recorder.is_zero)
    majority = majority_share(dm) if recorder.is_zero and not pretraining_stage else None
    record.data.update({**dm.data_info(), "majority_share": majority})
    if pretraining_stage:
        record.pretrain = pretrain.stage_info(cfg, dm)
    module = build_module(cfg, dm, source, record.pretrain)
    check_schedule(cfg, dm)
    found = spec.identify(rundir.data_identity_of(dm))
    record.set_identity(found)
    return dm, module, start_run(cfg, output_dir, record, found, recorder.is_zero)


def resume_checked(
    cfg: DictConfig, output_dir: Path, recorder: Recorder, start: Start, module: pl.LightningModule
) -> checkpoints.Resume:
    """The checkpoint to continue from, checked to fit; then the run owns its folder's record and says so."""
    record = recorder.record
    resume = resume_from(cfg, output_dir)
    record.run.resumed_from = start.use_checkpoint(resume, module, record.code)
    record.run.resumed_from_step = resume.step
    recorder.own()  # identity and protocol conformance are known now: readable while the run trains
    if recorder.is_zero:
        point_latest(cfg, output_dir)
        if warning := warmup_warning(cfg):
            print(warning, file=sys.stderr, flush=True)
    return resume


def resume_from(cfg: DictConfig, output_dir: Path) -> checkpoints.Resume:
    """The checkpoint this run continues from, loaded once (see `lra_bench.run.checkpoints`)."""
    if cfg.ckpt_path in (None, "none", "null"):
        return checkpoints.Resume()
    if cfg.ckpt_path == "last":
        resume = checkpoints.find_resumable(output_dir / CHECKPOINT_DIR)
        if resume.path and getattr(rank_zero_only, "rank", 0) == 0:  # on the terminal (a Lightning record: run.log)
            say(f"[lra-bench] resuming from {resume.path} (step {resume.step})")
        return resume
    path = Path(str(cfg.ckpt_path)).expanduser()  # (validate() checked it too; the file may have changed since)
    return checkpoints.Resume.of(path, load_usable(path, shown=cfg.ckpt_path))


def assemble_callbacks(
    cfg: DictConfig, dm: Any, output_dir: Path, recorder: Recorder, start: Start, stops: list[pl.Callback]
) -> tuple[Watched, list[pl.Callback], bool]:
    """The harness's callbacks in the order their guarantees need, then the progress display and the user's own;
    `stops`: the requeue and signal handlers (they come after `last`: their hand-over follows the final save)."""
    assert start.stamp is not None  # a run that trains has its identity stamp (only a finished one has none)
    watched = Watched(
        # best-val weights, written after validations only (test runs on them); last.ckpt is LastCheckpoint's
        best=ModelCheckpoint(
            dirpath=str(output_dir / CHECKPOINT_DIR),
            filename="best-{step}",
            monitor="val/acc",
            mode="max",
            save_top_k=1,
            save_last=False,
            auto_insert_metric_name=False,
        ),
        efficiency=EfficiencyMonitor(warmup_steps=int(cfg.callbacks.stats_warmup_steps)),
        test_outputs=TestOutputs(),
    )
    last = checkpoints.LastCheckpoint(output_dir / CHECKPOINT_DIR, cfg.callbacks.checkpoint_every_n_steps)
    callbacks: list[pl.Callback] = [
        checkpoints.FiniteGuard(),  # before the checkpoint callbacks (Lightning runs those last)
        checkpoints.RNGState(),
        watched.best,
        last,
        *stops,
        watched.efficiency,
        start.stamp,
        watched.test_outputs,
        *_extra_callbacks(cfg, dm, recorder),
    ]
    progress, bar = progress_callbacks(cfg.callbacks.progress_bar, float(cfg.callbacks.get("status_every_s", 30)))
    # Lightning's plain layer table, which it logs (to run.log only: `lra_bench.run.terminal`); with rich installed
    # Lightning would pick its rich table, printed straight to the terminal
    summary = [ModelSummary()] if cfg.trainer.get("enable_model_summary", True) else []
    return watched, [*callbacks, *progress, *summary, *instantiate_callbacks(cfg)], bar


def build_trainer(
    cfg: DictConfig, output_dir: Path, callbacks: list[pl.Callback], bar: bool, record: RunRecord
) -> tuple[pl.Trainer, checkpoints.RunCheckpointIO]:
    """The Trainer with its loggers (the W&B run's id goes into the record) and the checkpoint I/O plugin."""
    checkpoint_io = checkpoints.RunCheckpointIO()  # atomic writes in the checkpoint's folder; the resume's one load
    loggers, wandb_id = build_loggers(cfg, output_dir, run_name=f"{cfg.task.name}-{cfg.attn.name}-{output_dir.name}")
    record.run.wandb_id = wandb_id
    trainer = pl.Trainer(
        **trainer_kwargs(cfg),
        callbacks=callbacks,
        logger=loggers or False,
        default_root_dir=str(output_dir),
        max_epochs=-1,
        check_val_every_n_epoch=None,
        enable_progress_bar=bar,
        plugins=[*slurm_plugins(), checkpoint_io],
    )
    return trainer, checkpoint_io


def record_fit(
    cfg: DictConfig, trainer: pl.Trainer, module: pl.LightningModule, watched: Watched, start: Start, record: RunRecord
) -> str:
    """The training numbers into the record; returns the best-val checkpoint, the one to test."""
    assert start.stamp is not None
    record.run.segments = start.stamp.segments
    check_steps_ran(int(trainer.global_step), int(cfg.trainer.max_steps))
    record.metrics.update(watched.efficiency.summary(module))
    record.metrics.train_steps = int(trainer.global_step)
    best = watched.best.best_model_path or None
    if not best:  # start_run made sure validations run: a missing best-val checkpoint is a failure
        raise RuntimeError("no best-val checkpoint was written, so there is nothing to test")
    record.metrics.best_step = int(load_checkpoint(best).get("global_step", 0))
    score = watched.best.best_model_score
    record.metrics.val_acc = float(score) if score is not None else None
    if start.previous is not None:  # retest: nothing trained, so the training numbers stay as recorded
        record.metrics.update({k: start.previous["metrics"].get(k) for k in EFFICIENCY_KEYS})
        record.run.segments = start.previous["run"].get("segments") or record.run.segments
    return best


def record_test(
    cfg: DictConfig,
    trainer: pl.Trainer,
    module: pl.LightningModule,
    dm: Any,
    best: str,
    watched: Watched,
    recorder: Recorder,
    output_dir: Path,
) -> None:
    """Test the best-val checkpoint into the record; a pretraining stage has no task head and no test: its record
    holds the curve (`pretrain.final_section`) and no classification accuracy."""
    record = recorder.record
    if isinstance(module, pretrain.PretrainModule):
        assert record.pretrain is not None  # stage_info, set when the stage started
        record.pretrain = pretrain.final_section(record.pretrain, record.metrics.val_acc, module)
        record.metrics.val_acc = record.metrics.test_acc = None
    elif cfg.test:
        recorder.add_test(run_test(trainer, module, dm, best, watched.test_outputs, output_dir))


def record_stop(
    err: BaseException, stop: StopSignals, trainer: pl.Trainer | None, start: Start | None, recorder: Recorder
) -> BaseException | None:
    """Record how the run ended on `err`; return the exception to raise instead (None: `err` itself).

    Stopped by a signal (SIGTERMException at a step boundary, Ctrl-C, submitit's requeue): an error while shutting
    down (W&B's service gets the SIGTERM too) is part of the stop, and must not end the job as a normal failure: a
    submitit job that returns leaves a result that the sweep would take as final."""
    record = recorder.record
    interrupt = isinstance(err, (KeyboardInterrupt, SystemExit))
    signalled = stop.received is not None or (trainer is not None and trainer.received_sigterm)
    if not interrupt and not signalled:
        recorder.fail(err)
        return None
    record.status = "interrupted"
    if start is not None and start.stamp is not None:  # the attempts so far, up to the saved step
        record.run.segments = start.stamp.segments
    record.error = stop.describe(trainer.global_step if trainer is not None else None)
    if stop.received is not None:  # exit 143 (SIGTERM) or 130 (Ctrl-C), the shell's convention
        return SystemExit(stop.exit_status())
    if not interrupt:
        return SystemExit(f"stopped by a signal ({type(err).__name__}: {err})")
    return None


def requeue_grace_s() -> float:
    """How long after submitit's USR2 we may wait for a step boundary: half the launcher's signal_delay_s."""
    try:
        delay = HydraConfig.get().launcher.get("signal_delay_s") if HydraConfig.initialized() else None
    except Exception:  # not under Hydra, or a launcher without the key
        delay = None
    return max(5.0, 0.5 * float(delay)) if delay else 60.0


def draw_curves(output_dir: Path, record: dict[str, Any]) -> None:
    """`curves.png` beside the record; a failure to draw is one line, never the run's failure."""
    try:
        write_curves(output_dir, record)
    except Exception as err:  # a plot must never turn a finished run into a failed one
        print(f"[lra-bench] curves.png not drawn: {type(err).__name__}: {err}", file=sys.stderr, flush=True)


def _extra_callbacks(cfg: DictConfig, dm: Any, recorder: Recorder) -> list[pl.Callback]:
    """Callbacks contributed by other parts of the harness (diagnostics, …), each optional; the record reads what
    they expose (the diagnostics' `latest`/`best`), and they ask it to write (`on_update`)."""
    if not cfg.diagnostics.enabled or cfg.stage == "pretrain":  # diagnostics compare with bidirectional softmax
        return []
    diagnostics = DiagnosticsCallback(cfg.diagnostics, dm, on_update=recorder.write)
    recorder.diagnostics = diagnostics
    return [diagnostics]
