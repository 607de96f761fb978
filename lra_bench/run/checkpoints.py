"""Checkpoints and resume: how each file is written (`RunCheckpointIO`), what is saved when and which file a resume
picks (`LastCheckpoint`, `find_resumable`), who requeues (`SubmititRequeue`), the NaN stop and the RNG state, and what
a checkpoint says about the experiment that made it (`IdentityStamp`, `check_fits`). Reading a checkpoint file is
`lra_bench.record.checkpoint_file`'s, below the run: the pre-flight and the config checks read them too.

Lightning's parts where they give the guarantee, ours where they do not — checked against the installed
pytorch-lightning 2.6.6 by tests/test_lightning_parts.py, which fails the day Lightning changes:

* **Atomic writes in the checkpoint's own folder** (`RunCheckpointIO`). Lightning writes through an fsspec
  transaction: `torch.save` into a `tempfile.mkstemp()` file in `$TMPDIR`, then `shutil.move` onto the final path —
  a copy, not a rename, when `$TMPDIR` is another filesystem (a node-local /tmp, a run dir on shared storage), so a
  full disk or a kill mid-copy leaves a truncated file (measured: a 160 kB checkpoint saved into a 96 kB tmpfs left a
  96 kB `best-4.ckpt` that does not load). Here the temp file is this process's own beside the target
  (`tasks.files.unique_tmp`), renamed into place, removed on any failure; the target keeps its previous content,
  and the checkpoint never has to fit into `$TMPDIR`.
* **`last.ckpt` is ours** (`LastCheckpoint`). `ModelCheckpoint(save_last=True, every_n_train_steps=N)` writes it after
  a validation only when a top-k file was written at that step, and at the end of training only if it never wrote
  one: a run whose `max_steps` is not a multiple of N never has its final state in it, and it keeps no previous
  file. Ours writes it every `every_n_train_steps`, after every validation, at the end of training and at a stop
  signal's step boundary, keeping the previous one as `last-prev.ckpt` (the new one is complete before the old one
  moves: a kill mid-write never leaves a half file as `last.ckpt`, a full disk leaves no temp file). Best-val
  checkpoints are Lightning's `ModelCheckpoint`.
* **The save at a stop signal is ours too**: `save_on_exception=True` and `OnExceptionCheckpoint` save on every
  exception, the NaN stop included — exactly the poisoned weights that stop exists to keep out.
  `LastCheckpoint.on_exception` saves only on `SIGTERMException` (a clean step boundary: SIGTERM, or Ctrl-C through
  `lra_bench.run.signals`).
* **A resume reads its file once.** `find_resumable` validates `last.ckpt` by loading it weights-only (a truncated
  or unreadable file falls back to `last-prev.ckpt`, then the newest `best-*.ckpt`, with a warning naming what was
  skipped); the identity check runs on that dict, and `RunCheckpointIO.preload` hands it to Lightning's
  `trainer.fit(ckpt_path=…)`. The hand-over is one-shot and keyed by the resolved path.
* `FiniteGuard` stops the run when a parameter turns NaN/Inf in an optimizer step, before any checkpoint callback
  runs (Lightning orders those last), so the last good checkpoint is never overwritten by a poisoned state.
* `RNGState` checkpoints the global RNGs (dropout), restored at train start: with the data order restored by
  `tasks.base.ResumableSampler`, a killed-and-resumed run ends with the same weights as an uninterrupted one
  (Lightning has no callback for this; `torch.random.fork_rng` guards the RNG where diagnostics must not draw).
* `SubmititRequeue`: exactly one requeue owner. Under submitit, Lightning's SLURM auto-requeue is off
  (`lra_bench.run.build.slurm_plugins`) and submitit's USR2 handler owns requeueing; we only defer it to the next
  step boundary: USR2 → SIGTERM to ourselves → Lightning finishes the step and raises `SIGTERMException` →
  `LastCheckpoint` saves → `train()` records the stop and calls submitit's handler, which requeues and exits. If no
  step boundary comes within `grace_s` (half the launcher's `signal_delay_s`), an alarm hands over at once (the
  periodic `last.ckpt` then serves). A plain SIGTERM (`scontrol requeue`, preemption, `scancel`) takes the same
  graceful path within SLURM's KillWait; SLURM itself requeues those jobs.

Only global rank 0 saves. The callbacks' state keys are their class names (Lightning's default): a renamed class
would orphan the state in older checkpoints.

Every checkpoint the harness writes carries, under the top-level key `lra_bench` (plain types: weights-only loadable):

    format       "lra-bench/checkpoint-meta/1"
    fingerprint  the run's fingerprint (`lra_bench.record.identity.fingerprint`)
    identity     the run's identity (flat dict)
    config       the run's resolved config (what `python -m lra_bench.evaluate` rebuilds the model from)
    code         {commit, dirty} of the segment that wrote it
    segments     [{started_at, from_step, code, kernels}] one per process that trained this run so far (`kernels`:
                 the kernel choices it ran with, `KERNEL_CHOICES`, so a resume on the other path shows)

Before a checkpoint is used (resumed, or tested by the eval entry), `check_fits` refuses with one line a file that
does not load, or one made by another model: its `ARCHITECTURE` keys differ from the run's ("checkpoint X was made
with attn.name="nystrom", model.dim=64; this run has …"). A checkpoint without the metadata is checked by its state
dict's names and shapes.
"""

from __future__ import annotations

import io
import os
import random
import re
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO
from pytorch_lightning.callbacks import Checkpoint
from pytorch_lightning.utilities.exceptions import SIGTERMException
from pytorch_lightning.utilities.rank_zero import rank_zero_only, rank_zero_warn

from lra_bench.errors import ConfigError
from lra_bench.kit.say import say
from lra_bench.record.builder import now
from lra_bench.record.checkpoint_file import LAST, META_FORMAT, META_KEY, PREV, load_usable, meta_of, read_checkpoint
from lra_bench.record.identity import architecture, describe, differing_keys, kernel_choices
from lra_bench.record.provenance import code_label
from tasks.files import make_readable, unique_tmp


class RunCheckpointIO(TorchCheckpointIO):
    def __init__(self) -> None:
        super().__init__()
        self._preloaded: dict[str, dict[str, Any]] = {}

    def preload(self, path: str | Path, checkpoint: dict[str, Any]) -> None:
        """The next `load_checkpoint(path)` returns `checkpoint` (already read and checked) instead of the file."""
        self._preloaded[str(Path(path).resolve())] = checkpoint

    def load_checkpoint(
        self,
        path: Any,
        map_location: Callable | None = lambda storage, loc: storage,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        checkpoint = self._preloaded.pop(str(Path(path).resolve()), None)
        if checkpoint is not None:
            return checkpoint
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()  # serialised first, as Lightning does: a full disk is then an OSError naming errno
        torch.save(checkpoint, buffer)  # (torch.save onto the file reports it as "unexpected pos" instead)
        tmp = unique_tmp(target)
        try:
            with open(tmp, "wb") as fh:
                fh.write(buffer.getbuffer())
            make_readable(tmp)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)  # a failed write: no partial file, the target keeps its previous content


# -- choosing the checkpoint to resume from ----------------------------------------------------------------------
def _best_step(path: Path) -> int:
    match = re.search(r"(\d+)", path.stem)
    return int(match.group(1)) if match else -1


@dataclass
class Resume:
    """The checkpoint a run resumes from (`path` None: start fresh), as loaded when it was checked, and the files
    skipped on the way."""

    path: str | None = None
    step: int | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)
    checkpoint: dict[str, Any] | None = field(default=None, repr=False)

    @classmethod
    def of(cls, path: str | Path, checkpoint: dict[str, Any]) -> Resume:
        return cls(path=str(path), step=int(checkpoint.get("global_step", 0)), checkpoint=checkpoint)


def find_resumable(ckpt_dir: Path) -> Resume:
    """`last.ckpt`, else `last-prev.ckpt`, else the newest `best-*.ckpt` — the first that loads cleanly."""
    ckpt_dir = Path(ckpt_dir)
    candidates = [ckpt_dir / LAST, ckpt_dir / PREV]
    candidates += sorted(ckpt_dir.glob("best-*.ckpt"), key=_best_step, reverse=True)
    resume, skipped = Resume(), []
    for path in filter(Path.exists, candidates):
        checkpoint, problem = read_checkpoint(path)
        if checkpoint is not None:
            resume = Resume.of(path, checkpoint)
            break
        skipped.append((str(path), str(problem)))
    resume.skipped = skipped
    for passed_over, problem in skipped:
        rank_zero_warn(
            f"checkpoint {passed_over} is corrupt or unreadable ({problem}); "
            + (f"resuming from {resume.path} (step {resume.step}) instead" if resume.path else "starting fresh")
        )
    return resume


# -- last.ckpt -------------------------------------------------------------------------------------------------
class LastCheckpoint(Checkpoint):
    """Keep `<dirpath>/last.ckpt` (and the previous one as `last-prev.ckpt`) current; see the module docstring.

    A `Checkpoint` subclass so that Lightning runs it after every other callback (its state, e.g. the best score,
    is then final). Saves go through `trainer.save_checkpoint` on every rank (DDP: rank 0 writes, all wait).
    """

    def __init__(self, dirpath: str | Path, every_n_train_steps: int | None = None) -> None:
        self.dirpath = Path(dirpath)
        self.every_n_train_steps = int(every_n_train_steps or 0)
        self.saved_step: int | None = None

    def save(self, trainer: pl.Trainer) -> None:
        last, prev = self.dirpath / LAST, self.dirpath / PREV
        tmp = unique_tmp(last)  # this process's own temp file (only rank 0 writes it), removed on any failure
        if trainer.is_global_zero:
            self.dirpath.mkdir(parents=True, exist_ok=True)
        try:
            trainer.save_checkpoint(str(tmp), weights_only=False)
            if trainer.is_global_zero:
                make_readable(tmp)
                if last.exists() and self.saved_step != trainer.global_step:  # same step again: keep the older prev
                    os.replace(last, prev)
                os.replace(tmp, last)
        finally:
            tmp.unlink(missing_ok=True)  # a full disk: the partial file goes, last.ckpt stays the previous one
        self.saved_step = trainer.global_step

    def _fitting(self, trainer: pl.Trainer) -> bool:
        return trainer.state.fn == "fit" and not trainer.sanity_checking and not getattr(trainer, "fast_dev_run", False)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        step, every = trainer.global_step, self.every_n_train_steps
        if every and step % every == 0 and step != self.saved_step and self._fitting(trainer):
            self.save(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # also at a step already saved: the post-validation state carries the new best score
        if self._fitting(trainer) and trainer.global_step > 0:
            self.save(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._fitting(trainer) and trainer.global_step != self.saved_step:
            self.save(trainer)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # Lightning raises SIGTERMException at a clean step boundary (after the step's validation). Other
        # exceptions leave a state we do not trust. Multi-process: no collective save from an exception path.
        # (the run's last line says what is saved: `lra_bench.run.signals.StopSignals.stopped_line`)
        step = trainer.global_step
        if isinstance(exception, SIGTERMException) and trainer.world_size == 1 and 0 < step != self.saved_step:
            self.save(trainer)


# -- reliability ----------------------------------------------------------------------------------------------
class FiniteGuard(pl.Callback):
    """Stop when a parameter became NaN/Inf in an optimizer step, before a checkpoint callback can save it."""

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        with torch.no_grad():
            flags = [torch.isfinite(p).all() for p in pl_module.parameters()]
            finite = bool(torch.stack(flags).all()) if flags else True
        if not finite:
            bad = [n for n, p in pl_module.named_parameters() if not bool(torch.isfinite(p).all())]
            raise FloatingPointError(
                f"parameters became non-finite in the optimizer step at step {trainer.global_step} "
                f"({', '.join(bad[:3])}{', …' if len(bad) > 3 else ''}); stopping (last good checkpoint kept). "
                "Lower optim.lr or set optim.grad_clip_val."
            )


class RNGState(pl.Callback):
    """Checkpoint the global torch/CUDA/numpy/python RNGs (weights-only loadable); restore them at train start."""

    def __init__(self) -> None:
        self._pending: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state: dict[str, Any] = {
            "torch": torch.get_rng_state(),
            "numpy": {
                "kind": str(kind),
                "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "cached": float(cached),
            },
            "python": random.getstate(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._pending is None:
            return
        state, self._pending = self._pending, None
        torch.set_rng_state(state["torch"])
        n = state["numpy"]
        np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
        cuda = state.get("cuda")
        if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)  # (another GPU count: the CUDA streams start from the seed)


# -- the requeue owner -------------------------------------------------------------------------------------------
def _handler_name(handler: Any) -> str:
    if handler in (signal.SIG_DFL, signal.SIG_IGN, None):
        return {signal.SIG_DFL: "SIG_DFL", signal.SIG_IGN: "SIG_IGN"}.get(handler, "None")
    parts = getattr(handler, "signal_handlers", None)  # Lightning's _HandlersCompose
    if isinstance(parts, list):
        return "+".join(_handler_name(h) for h in parts)
    func = getattr(handler, "__func__", handler)
    owner = getattr(getattr(handler, "__self__", None), "__class__", None)
    module = getattr(owner or func, "__module__", "") or ""
    name = getattr(func, "__qualname__", None) or type(handler).__name__
    return f"{module.split('.')[0]}:{name}" if module else str(name)


def is_submitit_handler(handler: Any) -> bool:
    owner = getattr(handler, "__self__", None)
    return owner is not None and type(owner).__module__.startswith("submitit")


class SubmititRequeue(Checkpoint):
    """Under submitit, save `last.ckpt` at the next step boundary before submitit requeues (the chain: module
    docstring). Installed at train start only when submitit's USR2 handler is in place and the run is one process (in
    DDP, submitit's handler stays as is and the periodic `last.ckpt` is the resume point). A `Checkpoint` subclass
    only so that Lightning orders it after `LastCheckpoint`."""

    def __init__(self, grace_s: float = 60.0) -> None:
        self.grace_s = grace_s
        self._submitit_handler: Any = None
        self._old_alarm: Any = None
        self.pending = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        handler = signal.getsignal(signal.SIGUSR2)
        if "SLURM_JOB_ID" in os.environ and trainer.is_global_zero:
            env = trainer._accelerator_connector.cluster_environment
            owner = "submitit" if is_submitit_handler(handler) else "SLURM/sbatch (no submitit handler)"
            handlers = (
                f"{k}={_handler_name(signal.getsignal(getattr(signal, k)))}" for k in ("SIGUSR1", "SIGUSR2", "SIGTERM")
            )
            say(
                f"[lra-bench] requeue owner: {owner}; lightning cluster_environment={type(env).__name__} "
                f"auto_requeue={getattr(env, 'auto_requeue', None)}; signal handlers: " + ", ".join(handlers)
            )
        if trainer.world_size == 1 and is_submitit_handler(handler):
            self._submitit_handler = handler
            signal.signal(signal.SIGUSR2, self._on_usr2)

    def _on_usr2(self, signum: int, frame: Any) -> None:
        if self.pending:
            return
        say(f"[lra-bench] caught {signal.Signals(signum).name}: saving at the next step boundary, then requeueing")
        self.pending = True
        self._old_alarm = signal.signal(signal.SIGALRM, self._on_alarm)
        signal.alarm(max(1, int(self.grace_s)))
        signal.raise_signal(signal.SIGTERM)  # Lightning: finish this step, then raise SIGTERMException

    def _on_alarm(self, signum: int, frame: Any) -> None:
        say(f"[lra-bench] no step boundary within {self.grace_s:.0f}s: requeueing without a final save")
        self.hand_over()

    def hand_over(self) -> None:
        """Run submitit's USR2 handler now: it requeues this job and exits (SystemExit)."""
        signal.alarm(0)
        if self._old_alarm is not None:
            signal.signal(signal.SIGALRM, self._old_alarm)
            self._old_alarm = None
        handler, self._submitit_handler, self.pending = self._submitit_handler, None, False
        if handler is not None:
            signal.signal(signal.SIGUSR2, handler)
            handler(signal.SIGUSR2, None)

    def _restore(self) -> None:
        if self._submitit_handler is not None and not self.pending:
            signal.signal(signal.SIGUSR2, self._submitit_handler)
            self._submitit_handler = None

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.pending:  # the signal came in the last step: LastCheckpoint saved the final state already
            self.hand_over()
        self._restore()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore()


# -- checkpoint identity -----------------------------------------------------------------------------------------
class IdentityStamp(pl.Callback):
    """Writes the run's identity into every checkpoint and keeps the list of training segments: each attempt's
    start (`started_at`, `from_step`, `code`, and the `kernels` it computes with: a checkpoint resumes under the
    other kernel choice, `lra_bench.record.identity.KERNEL_CHOICES`) and, at every checkpoint it saves, how far it got
    (`saved_at`, `to_step`) — so the wall time that made the weights is known even for an attempt that was killed."""

    def __init__(self, identity: dict[str, Any], fingerprint: str, config: dict[str, Any], code: dict) -> None:
        self.identity, self.fingerprint, self.config, self.code = identity, fingerprint, config, code
        self.segments: list[dict[str, Any]] = []

    def state_dict(self) -> dict[str, Any]:
        return {"segments": list(self.segments)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.segments = list(state_dict.get("segments", []))

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        start = {"started_at": now(), "from_step": int(trainer.global_step), "code": self.code}
        self.segments.append({**start, "kernels": kernel_choices(self.identity)})

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        if self.segments:  # how far this attempt got, and when: a segment's wall time is saved_at − started_at
            self.segments[-1].update(saved_at=now(), to_step=int(trainer.global_step))
        checkpoint[META_KEY] = {
            "format": META_FORMAT,
            "fingerprint": self.fingerprint,
            "identity": self.identity,
            "config": self.config,
            "code": self.code,
            "segments": list(self.segments),
        }


def check_fits(
    path: str | Path, identity: dict[str, Any], module: Any | None = None, checkpoint: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Load the checkpoint at `path` (unless it is given, as already loaded) and refuse it (one line) when it was
    made by another model than `identity` describes (or, without metadata, when its state dict does not fit
    `module`). Returns the checkpoint."""
    if checkpoint is None:
        checkpoint = load_usable(path)
    meta = meta_of(checkpoint)
    if meta is not None:
        made, this = architecture(meta.get("identity") or {}), architecture(identity)
        keys = sorted(  # the component names first, then changed values, then knobs only one side has
            differing_keys([made, this]),
            key=lambda k: (not k.endswith(".name"), k not in made or k not in this, k),
        )
        if keys:
            raise ConfigError(
                f"checkpoint {path} was made with {describe(made, keys)}; this run has {describe(this, keys)} "
                "(use a checkpoint of this model, or the overrides it was trained with)"
            )
    elif module is not None:
        problem = state_dict_mismatch(checkpoint.get("state_dict") or {}, module.state_dict())
        if problem:
            raise ConfigError(f"checkpoint {path} does not fit this model: {problem}")
    return checkpoint


def state_dict_mismatch(saved: dict[str, Any], expected: dict[str, Any]) -> str | None:
    """Missing, unexpected and differently shaped tensors (a lazily sized buffer, shape `[0]`, takes any shape)."""
    missing = [k for k in expected if k not in saved]
    unexpected = [k for k in saved if k not in expected]
    shapes = [
        f"{k} {tuple(saved[k].shape)} vs {tuple(v.shape)}"
        for k, v in expected.items()
        if k in saved and hasattr(v, "shape") and v.numel() > 0 and tuple(saved[k].shape) != tuple(v.shape)
    ]
    found = (("missing", missing), ("unexpected", unexpected), ("shape", shapes))
    parts = [f"{label}: {', '.join(items[:3])}{', …' if len(items) > 3 else ''}" for label, items in found if items]
    return "; ".join(parts) or None


def warn_if_code_changed(checkpoint: dict[str, Any], code: dict[str, Any], path: str) -> None:
    """Warn when the code differs from the one that wrote `checkpoint`'s last segment."""
    meta = meta_of(checkpoint)
    before = (meta or {}).get("code") or {}
    same = (before.get("commit"), before.get("dirty")) == (code.get("commit"), code.get("dirty"))
    if meta is None or same or getattr(rank_zero_only, "rank", 0) != 0:
        return
    print(
        f"[lra-bench] warning: the code changed since {path} was written ({code_label(before)} → "
        f"{code_label(code)}); resuming anyway — the record lists every segment's code in run.segments",
        file=sys.stderr,
        flush=True,
    )
