"""Stopping a run by signal — SIGTERM (`kill`, `scancel`, preemption, `scontrol requeue`) and SIGINT (Ctrl-C) —
without losing work, and with an honest exit status.

Contract (tested with real signals on real `run.py` processes, tests/test_signals.py, and on a real SLURM cluster,
tests/test_slurm_signals.py):

* While Lightning runs a loop (fit, or the test of the best checkpoint), the first SIGTERM or SIGINT sets Lightning's
  own stop flag: the current step (and its validation) finishes, Lightning raises `SIGTERMException` at the step
  boundary and `lra_bench.run.checkpointing.LastCheckpoint` saves `last.ckpt` at that step. Lightning only watches
  SIGTERM; routing Ctrl-C through the same flag is what makes Ctrl-C save too (Lightning's own KeyboardInterrupt path
  saves nothing, and a state interrupted mid-step could not be trusted anyway).
* A second Ctrl-C stops at once (`KeyboardInterrupt`): the last checkpoint written stays the resume point.
* Outside a loop (building the data, the model) a signal stops at once with `SignalStop`: there is no step to finish.
* Telling the terminal never gets in the way: under `… | tee log` Ctrl-C kills tee too, and a message written to the
  dead pipe would raise inside the step instead of letting it finish and save (`lra_bench.run.runlog` keeps the
  message in run.log).
* The record's `error` line says what a re-run will find: the checkpoint it resumes from, and its step, or that none
  was saved (a stop before the first save starts again from step 0).
* `train()` records the run as `interrupted` and exits with 128 + the signal's number — 143 for SIGTERM, 130 for
  SIGINT — the shell's convention, so `sbatch`/`make`/a sweep see that the job did not finish. (Under submitit,
  `SubmititRequeue.hand_over` exits instead, the way submitit requeues.)

Handlers are installed for the duration of `train()` only (main thread) and the previous ones restored afterwards.
The instance is also a callback: Lightning resets its stop flag when it installs its own SIGTERM handler at the start
of every `fit`/`test`, so a signal that arrived during set-up is re-applied at `on_train_start`.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.trainer.states import TrainerStatus

from lra_bench.run.progress import say

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_code(signum: int) -> int:
    """The shell's exit status for a process stopped by `signum` (143 for SIGTERM, 130 for SIGINT)."""
    return 128 + int(signum)


def tell(message: str) -> None:
    """A message on stderr that cannot raise (`say`: on its own line, also under a progress bar)."""
    say(message, file=sys.stderr)


class SignalStop(KeyboardInterrupt):
    """A stop signal outside Lightning's loops. A KeyboardInterrupt so that no library's `except Exception` eats it."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"{signal.Signals(signum).name} before training started")
        self.signum = signum


class StopSignals(pl.Callback):
    """Owns SIGTERM/SIGINT during one run (see the module docstring). `received` is the first signal, or None;
    `checkpoints` is the run's checkpoint dir, which a re-run resumes from."""

    def __init__(self, checkpoints: str | Path | None = None) -> None:
        self.checkpoints = None if checkpoints is None else Path(checkpoints)
        self.received: int | None = None
        self.count = 0
        self.trainer: pl.Trainer | None = None
        self._previous: dict[int, Any] = {}

    # -- installation ------------------------------------------------------------------------------------------
    def install(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                if signal.getsignal(signum) == signal.SIG_IGN:
                    continue  # ignored on purpose (`nohup`, a shell's background job): stays ignored, as Python does
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    # -- the handler -------------------------------------------------------------------------------------------
    def _lightning_running(self) -> bool:
        trainer = self.trainer
        return trainer is not None and trainer.state.status == TrainerStatus.RUNNING

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        first = self.received is None
        if first:
            self.received = signum
        name = signal.Signals(signum).name
        if not first:
            if signum == signal.SIGINT:  # the user insists
                tell(f"[lra-bench] {name} again: stopping now; the last checkpoint written is the resume point")
                raise KeyboardInterrupt
            return  # a repeated SIGTERM: already stopping (SLURM follows up with SIGKILL after KillWait)
        trainer = self.trainer
        if trainer is None or not self._lightning_running():
            raise SignalStop(signum)
        trainer._signal_connector.received_sigterm = True  # Lightning's own flag: stop at the step boundary
        again = "; Ctrl-C again to stop at once" if signum == signal.SIGINT else ""
        tell(f"[lra-bench] {name}: stopping after this step and saving last.ckpt{again}")

    # -- callback: re-apply a stop that arrived while Lightning was setting up ---------------------------------
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.received is not None:
            trainer._signal_connector.received_sigterm = True

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.on_train_start(trainer, pl_module)

    # -- the outcome -------------------------------------------------------------------------------------------
    def describe(self, step: int | None) -> str:
        """The record's `error` line for an interrupted run."""
        name = signal.Signals(self.received).name if self.received else "a signal"
        where = f" at step {step}" if step is not None else ""
        return f"stopped by {name}{where}; {self.resume_point()}"

    def resume_point(self) -> str:
        """What re-running the same command starts from, as found on disk now (the checkpoint `ckpt_path=last`
        resumes from: `lra_bench.run.checkpointing.find_resumable`)."""
        if self.checkpoints is None:
            return "re-running the same command resumes from the last checkpoint saved, if any"
        from lra_bench.run.checkpointing import find_resumable

        resume = find_resumable(self.checkpoints)
        if resume.path is None:
            return "no checkpoint was saved: re-running the same command starts from step 0"
        shown = Path(resume.path).relative_to(self.checkpoints.parent)
        return f"re-running the same command resumes from {shown} (step {resume.step})"

    def exit_status(self) -> int:
        return exit_code(self.received or signal.SIGTERM)
