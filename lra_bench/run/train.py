"""One training run: validate the config, build data + model, fit, test on the best-val checkpoint, record.

Resuming is the default: the run's output dir is derived from its overrides (same command → same dir), and
`ckpt_path=last` continues from `<output_dir>/checkpoints/last.ckpt` when it exists (a corrupt one falls back to
`last-prev.ckpt`, then the best checkpoint; see `lra_bench.run.checkpointing`, which also owns requeue handling).
Under DDP every rank runs this function; only rank 0 writes the result record, config tree and summary.

Before anything is written to a run dir that already holds a record, `lra_bench.run.start.start_run` settles the
schedule, the run's identity (a folder of another experiment is refused), whether the run is already completed
(then its record is left byte-identical) and whether the checkpoint fits. `train=false` tests one checkpoint
instead (`lra_bench.run.evaluation`).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
from omegaconf import DictConfig
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.utilities.rank_zero import rank_zero_only

from lra_bench import runtime
from lra_bench.config.plain import plain_dict
from lra_bench.config.validate import check_writable, validate
from lra_bench.record import conformance, results
from lra_bench.record.builder import new_record, now
from lra_bench.run import checkpointing, pretrain
from lra_bench.run.build import build_datamodule, build_model
from lra_bench.run.checkpoint_io import RunCheckpointIO
from lra_bench.run.console import conformance_line, print_config, print_summary
from lra_bench.run.efficiency import EfficiencyMonitor
from lra_bench.run.latest import point_latest
from lra_bench.run.lock import RunDirLock
from lra_bench.run.loggers import build_loggers, finish_wandb
from lra_bench.run.progress import progress_callbacks
from lra_bench.run.schedule import check_steps_ran, warmup_warning
from lra_bench.run.signals import StopSignals
from lra_bench.run.start import start_run
from lra_bench.run.test_outputs import TestOutputs, test_and_record
from lra_bench.run.user_callbacks import instantiate_callbacks
from models.heads import LanguageModel

CHECKPOINT_DIR = "checkpoints"
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


def trainer_kwargs(cfg: DictConfig) -> dict[str, Any]:
    kwargs = plain_dict(cfg.trainer)
    kwargs["gradient_clip_val"] = cfg.optim.grad_clip_val
    kwargs["gradient_clip_algorithm"] = cfg.optim.grad_clip_algorithm
    return kwargs


def slurm_plugins() -> list[Any]:
    """Under SLURM exactly one component owns requeueing: submitit (or the user's sbatch), not Lightning.

    Lightning would otherwise pick `SLURMEnvironment(auto_requeue=True)` by itself (a SIGUSR1 handler that
    requeues, and a SIGTERM bypass) whenever the job runs under srun. Lightning's plain SIGTERM notifier stays:
    it only stops training at the next step boundary.
    """
    if "SLURM_JOB_ID" not in os.environ:
        return []
    from pytorch_lightning.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def check_launch(cfg: DictConfig) -> None:
    """Refuse Lightning's `ddp` script launcher inside a Hydra multirun (outside SLURM/torchrun).

    That launcher starts ranks 1.. by re-running the command line with `hydra.run.dir=<run dir>`: right for a
    single run (the children land in the same dir), wrong in a multirun, where the command line is the whole
    sweep and the job's dir is the sweep subdir. Under SLURM, srun starts the ranks, so it is fine there.
    """
    strategy = str(cfg.trainer.get("strategy", "auto"))
    devices = cfg.trainer.get("devices", 1)
    if not strategy.startswith("ddp") or "spawn" in strategy or "fork" in strategy or str(devices) in ("1", "[0]"):
        return
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from pytorch_lightning.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    if SLURMEnvironment.detect() or TorchElasticEnvironment.detect():
        return
    from lra_bench.errors import ConfigError

    raise ConfigError(
        f"trainer.strategy={strategy} with trainer.devices={devices} inside a Hydra multirun: Lightning's ddp "
        "launcher would re-run the whole sweep for every rank. Use hydra/launcher=slurm (srun starts the ranks; "
        "hydra.launcher.tasks_per_node=trainer.devices), run the job without -m, or trainer.strategy=ddp_spawn."
    )


def requeue_grace_s() -> float:
    """How long after submitit's USR2 we may wait for a step boundary: half the launcher's signal_delay_s."""
    try:
        from hydra.core.hydra_config import HydraConfig

        delay = HydraConfig.get().launcher.get("signal_delay_s") if HydraConfig.initialized() else None
    except Exception:  # not under Hydra, or a launcher without the key
        delay = None
    return max(5.0, 0.5 * float(delay)) if delay else 60.0


def launch_token() -> str:
    """The same string on every rank of one launch (srun tasks, or ddp children of one parent), new per launch."""
    if "SLURM_JOB_ID" in os.environ:
        return f"slurm-{os.environ['SLURM_JOB_ID']}-{os.environ.get('SLURM_RESTART_COUNT', '0')}"
    return f"pid-{os.getppid() if os.environ.get('LOCAL_RANK', '0') != '0' else os.getpid()}"


def prepare_data(dm: Any, output_dir: Path, is_zero: bool, timeout_s: float = 6 * 3600) -> None:
    """Rank 0 generates/caches the data; other ranks wait for its marker, then load the cache (no races)."""
    marker = output_dir / ".data-ready"
    token = launch_token()
    if is_zero:
        dm.prepare_data()
        dm.setup()
        marker.write_text(token + "\n")
        return
    deadline = time.monotonic() + timeout_s
    while not (marker.exists() and marker.read_text().strip() == token):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 did not prepare the data within {timeout_s:.0f}s ({marker})")
        time.sleep(1.0)
    dm.setup()


def resume_from(cfg: DictConfig, output_dir: Path) -> checkpointing.Resume:
    """The checkpoint this run continues from, loaded once (see `lra_bench.run.checkpoint_io`)."""
    if cfg.ckpt_path in (None, "none", "null"):
        return checkpointing.Resume()
    if cfg.ckpt_path == "last":
        resume = checkpointing.find_resumable(output_dir / CHECKPOINT_DIR)
        checkpointing.log_resume(resume)
        return resume
    path = Path(str(cfg.ckpt_path)).expanduser()  # (validate() checked it too; the file may have changed since)
    return checkpointing.Resume.of(path, checkpointing.load_usable(path, shown=cfg.ckpt_path))


def checkpoint_step(path: str | None) -> int | None:
    if not path:
        return None
    return int(checkpointing.load_checkpoint(path).get("global_step", 0))


def majority_share(dm: Any) -> float | None:
    split = dm.splits.get("val")
    if split is None or len(split) == 0:
        return None
    _, counts = np.unique(np.asarray(split.table["label"]), return_counts=True)
    return float(counts.max() / counts.sum())


def metric(trainer: pl.Trainer, key: str) -> float | None:
    value = trainer.callback_metrics.get(key)
    return None if value is None else float(value)


def train(cfg: DictConfig, output_dir: Path) -> dict[str, Any]:
    """Run and return the result record (also written to `<output_dir>/results.json`)."""
    if cfg.get("stage") == "spt":  # self-pretraining then fine-tuning: two runs of this function (lra_bench.spt)
        from lra_bench.spt import run_spt

        return run_spt(cfg, output_dir)
    validate(cfg)
    runtime.set_threads(cfg.get("threads"))  # before the record: `env.runtime` says what the run used
    source = conformance.derive_run_keys(cfg)  # stage keys checked, `pretraining` derived (as the protocol check does)
    pretraining_stage = cfg.stage == "pretrain"
    check_launch(cfg)
    check_writable(output_dir)
    is_zero = getattr(rank_zero_only, "rank", 0) == 0
    lock = RunDirLock(output_dir).acquire() if is_zero else None  # before the record: never clobber a live run's
    if not cfg.train:  # test one checkpoint (lra_bench.run.evaluation)
        from lra_bench.run.evaluation import evaluate

        try:
            return evaluate(cfg, output_dir)
        finally:
            if lock is not None:
                lock.release()

    def write_record() -> None:
        if is_zero and owned:
            results.write_atomic(record_path, record)

    record = new_record(cfg, output_dir)
    record.update(
        stage=str(cfg.stage),
        pretraining=str(cfg.pretraining),
        pretrained=source.describe() if source else None,
    )
    record_path = output_dir / results.FILENAME
    owned = not record_path.exists()  # a folder's existing record is replaced only once start_run accepted the run
    write_record()
    if is_zero:
        print_config(cfg, save_to=output_dir / "config_tree.log", terminal=bool(cfg.print_config))

    requeue = checkpointing.SubmititRequeue(grace_s=requeue_grace_s())
    stop = StopSignals(output_dir / CHECKPOINT_DIR).install()  # SIGTERM/Ctrl-C: finish the step, save, exit 143/130
    trainer: pl.Trainer | None = None
    start = None
    try:
        pl.seed_everything(int(cfg.seed), workers=True)
        dm = build_datamodule(cfg)
        prepare_data(dm, output_dir, is_zero)
        record["data"].update(dm.data_info())
        record["data"]["majority_share"] = majority_share(dm) if is_zero and not pretraining_stage else None
        if pretraining_stage:
            record["pretrain"] = pretrain.stage_info(cfg, dm)
        module = _build_module(cfg, dm, source, record.get("pretrain"))
        start = start_run(cfg, dm, output_dir, record, is_zero)
        if start.finished is not None:
            if is_zero:
                print_summary(start.finished)
                print(f"[lra-bench] already completed: {record_path} left unchanged (retest=true tests again)")
            return start.finished
        resume = resume_from(cfg, output_dir)
        start.use_checkpoint(resume, module, record)
        owned = True
        record["run"]["resumed_from_step"] = resume.step
        write_record()  # identity and protocol conformance are known now: readable while the run trains
        if is_zero:
            point_latest(cfg, output_dir)
            print(conformance_line(record))
            if warning := warmup_warning(cfg):
                print(warning, file=sys.stderr, flush=True)
        # best-val weights, written after validations only (test runs on them); last.ckpt is LastCheckpoint's
        checkpoint = ModelCheckpoint(
            dirpath=str(output_dir / CHECKPOINT_DIR),
            filename="best-{step}",
            monitor="val/acc",
            mode="max",
            save_top_k=1,
            save_last=False,
            auto_insert_metric_name=False,
        )
        last = checkpointing.LastCheckpoint(output_dir / CHECKPOINT_DIR, cfg.callbacks.checkpoint_every_n_steps)
        efficiency = EfficiencyMonitor(warmup_steps=int(cfg.callbacks.stats_warmup_steps))
        test_outputs = TestOutputs()
        callbacks: list[pl.Callback] = [
            checkpointing.FiniteGuard(),  # before the checkpoint callbacks (Lightning runs those last)
            checkpointing.RNGState(),
            checkpoint,
            last,
            requeue,  # after `last`: its on_train_end hand-over comes after the final save
            stop,
            efficiency,
            start.stamp,  # type: ignore[list-item]
            test_outputs,
            *_extra_callbacks(cfg, dm, record),
        ]
        progress, bar = progress_callbacks(cfg.callbacks.progress_bar, float(cfg.callbacks.get("status_every_s", 30)))
        callbacks += [*progress, *model_summary(cfg), *instantiate_callbacks(cfg)]
        checkpoint_io = RunCheckpointIO()  # atomic writes in the checkpoint's folder; the resume's one load
        loggers, wandb_id = build_loggers(
            cfg, output_dir, run_name=f"{cfg.task.name}-{cfg.attn.name}-{output_dir.name}"
        )
        record["run"]["wandb_id"] = wandb_id
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
        stop.trainer = trainer
        if resume.path is not None and resume.checkpoint is not None:
            checkpoint_io.preload(resume.path, resume.checkpoint)  # Lightning restores from it: no second read
            resume.checkpoint = None
        if cfg.train:
            trainer.fit(module, datamodule=dm, ckpt_path=resume.path, weights_only=True)
        record["run"]["segments"] = start.stamp.segments  # type: ignore[union-attr]
        check_steps_ran(int(trainer.global_step), int(cfg.trainer.max_steps))
        record["metrics"].update(efficiency.summary(module))
        record["metrics"]["train_steps"] = int(trainer.global_step)
        best = checkpoint.best_model_path or None
        if not best:  # start_run made sure validations run: a missing best-val checkpoint is a failure
            raise RuntimeError("no best-val checkpoint was written, so there is nothing to test")
        record["metrics"]["best_step"] = checkpoint_step(best)
        record["metrics"]["val_acc"] = (
            float(checkpoint.best_model_score) if checkpoint.best_model_score is not None else None
        )
        if start.previous is not None:  # retest: nothing trained, so the training numbers stay as recorded
            record["metrics"].update({k: start.previous["metrics"].get(k) for k in EFFICIENCY_KEYS})
            record["run"]["segments"] = start.previous["run"].get("segments") or record["run"]["segments"]
        if isinstance(module, pretrain.PretrainModule):  # no task head and no test: the record holds the curve
            pretrain.finish_record(record, module)
        elif cfg.test:
            test_and_record(trainer, module, dm, best, test_outputs, record, output_dir)
        record["status"] = "completed"
    except BaseException as err:
        signalled = stop.received is not None or (trainer is not None and trainer.received_sigterm)
        if not isinstance(err, (KeyboardInterrupt, SystemExit)) and not signalled:
            record["status"], record["error"] = "failed", f"{type(err).__name__}: {err}"
            raise
        # stopped by a signal (SIGTERMException at a step boundary, Ctrl-C, submitit's requeue): an error while
        # shutting down (W&B's service gets the SIGTERM too) is part of the stop, and must not end the job as a
        # normal failure: a submitit job that returns leaves a result that the sweep would take as final
        record["status"] = "interrupted"
        if start is not None and start.stamp is not None:  # the attempts so far, up to the saved step
            record["run"]["segments"] = start.stamp.segments
        record["error"] = stop.describe(trainer.global_step if trainer is not None else None)
        if stop.received is not None:  # exit 143 (SIGTERM) or 130 (Ctrl-C), the shell's convention
            raise SystemExit(stop.exit_status()) from err
        if not isinstance(err, (KeyboardInterrupt, SystemExit)):
            raise SystemExit(f"stopped by a signal ({type(err).__name__}: {err})") from err
        raise
    finally:
        stop.restore()
        record["run"]["finished_at"] = now()
        write_record()
        finish_wandb()
        if is_zero and owned and stop.received is None:  # a stopped run draws them when it completes
            draw_curves(output_dir, record)
        if lock is not None:
            lock.release()
        if requeue.pending:  # submitit's USR2 arrived: the step is saved, now let submitit requeue (exits)
            requeue.hand_over()
    if is_zero:
        print_summary(record)
    return record


def model_summary(cfg: DictConfig) -> list[pl.Callback]:
    """Lightning's plain layer table, which it logs (so it lands in run.log only: `lra_bench.run.quiet`); with rich
    installed Lightning would pick its rich table, printed straight to the terminal."""
    if not cfg.trainer.get("enable_model_summary", True):
        return []
    from pytorch_lightning.callbacks import ModelSummary

    return [ModelSummary()]


def draw_curves(output_dir: Path, record: dict[str, Any]) -> None:
    """`curves.png` beside the record; a failure to draw is one line, never the run's failure."""
    from lra_bench.run.curves import write_curves

    try:
        write_curves(output_dir, record)
    except Exception as err:  # a plot must never turn a finished run into a failed one
        print(f"[lra-bench] curves.png not drawn: {type(err).__name__}: {err}", file=sys.stderr, flush=True)


def _build_module(cfg: DictConfig, dm: Any, source: Any = None, pretrain_info: Any = None) -> pl.LightningModule:
    from lra_bench.run.module import LRAModule

    model = build_model(cfg, dm)
    if pretrain_info is not None:  # stage=pretrain: the LM objective (lra_bench.run.pretrain)
        if not isinstance(model, LanguageModel):
            raise TypeError(f"stage=pretrain built a {type(model).__name__}, not a LanguageModel")
        return pretrain.build_pretrain_module(cfg, dm, model, {k: v for k, v in pretrain_info.items() if k != "curve"})
    if isinstance(model, LanguageModel):
        raise TypeError("a LanguageModel outside stage=pretrain")
    if source is not None:  # pretrained=: the pretrained encoder, a fresh head (lra_bench.run.pretrained)
        from lra_bench.run.pretrained import load_encoder

        load_encoder(model, source)
    return LRAModule(model, dm.num_classes, plain_dict(cfg.optim), int(cfg.trainer.max_steps))


def _extra_callbacks(cfg: DictConfig, dm: Any, record: dict[str, Any]) -> list[pl.Callback]:
    """Callbacks contributed by other parts of the harness (diagnostics, …), each optional."""
    out: list[pl.Callback] = []
    if cfg.diagnostics.enabled and cfg.stage != "pretrain":  # diagnostics compare with bidirectional softmax
        try:
            from lra_bench.diagnostics.callback import DiagnosticsCallback
        except ImportError:
            return out
        out.append(DiagnosticsCallback(cfg.diagnostics, dm, record))
    return out
