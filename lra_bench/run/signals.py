"""Stopping a run by signal — SIGTERM (`kill`, `scancel`, preemption, `scontrol requeue`) and SIGINT (Ctrl-C) —
without losing work, and with an honest exit status.

Contract (tested with real signals on real `run.py` processes, tests/test_signals.py, and on a real SLURM cluster,
tests/test_slurm_signals.py):

* While Lightning runs a loop (fit, or the test of the best checkpoint), the first SIGTERM or SIGINT sets Lightning's
  own stop flag: the current step (and its validation) finishes, Lightning raises `SIGTERMException` at the step
  boundary and `LastCheckpoint` saves `last.ckpt` there. Routing Ctrl-C through that flag is what makes Ctrl-C save
  too (Lightning's own KeyboardInterrupt path saves nothing, and a state interrupted mid-step could not be trusted).
* A second Ctrl-C stops the step at once (`KeyboardInterrupt`): the last checkpoint written stays the resume point.
  Anywhere else — a save under way, the run already stopping outside a loop, or `close()`d: writing its record and
  exiting — a further signal is told and changes nothing, so no traceback cuts the record or the last line short.
  Once the last line is said (`stopped_line`), a further signal is ignored without a word.
* Outside a loop (building the data, the model) a signal stops at once with `SignalStop`: there is no step to finish.
* The run's last line (`stopped_line`) says the step the checkpoint on disk holds and the command that resumes from
  it; the record's `error` line says what a re-run will find (that checkpoint and its step, or none: step 0).
  Telling the terminal never gets in the way: under `… | tee log` Ctrl-C kills tee too, and a write to the dead pipe
  would raise inside the step (`lra_bench.run.terminal` keeps the message in run.log).
* `train()` records the run as `interrupted` and exits with 128 + the signal's number — 143 for SIGTERM, 130 for
  SIGINT — so `sbatch`/`make`/a sweep see that the job did not finish (under submitit, `SubmititRequeue.hand_over`
  exits instead, the way submitit requeues).

Handlers are installed for the duration of `train()` only (main thread) and the previous ones restored afterwards (a
stopped run's process keeps Ctrl-C ignored while it exits: `restore`). Lightning resets its stop flag when it installs
its own SIGTERM handler at the start of every `fit`/`test`, so a signal that arrived during set-up is re-applied at
`on_train_start`: the instance is also a callback.
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

from lra_bench.kit.say import say
from lra_bench.run.checkpoints import find_resumable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


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
        self.closing = False  # `close()`: the run writes its record and exits; a signal can only be told
        self.last_said = False  # `stopped_line` was made: the run's last line is out, a signal is then ignored
        self._previous: dict[int, Any] = {}

    # -- installation ------------------------------------------------------------------------------------------
    def install(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                if signal.getsignal(signum) == signal.SIG_IGN:
                    continue  # ignored on purpose (`nohup`, a shell's background job): stays ignored, as Python does
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def close(self) -> None:
        """From here on the run only writes its record and exits: a signal is told, never raised into that."""
        self.closing = True

    def restore(self, stopped: bool = False) -> None:
        """The previous handlers back. `stopped`: the run was stopped and its process only exits from here, so
        Ctrl-C stays ignored: a KeyboardInterrupt in Hydra's or W&B's exit code would print a traceback after the
        run's last line (and exit 130 is what it exits with anyway)."""
        for signum, handler in self._previous.items():
            signal.signal(signum, signal.SIG_IGN if stopped and signum == signal.SIGINT else handler)
        self._previous.clear()

    # -- the handler -------------------------------------------------------------------------------------------
    def _lightning_running(self) -> bool:
        trainer = self.trainer
        return trainer is not None and trainer.state.status == TrainerStatus.RUNNING

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        name = signal.Signals(signum).name
        if self.closing:
            if not self.last_said:
                tell(f"[lra-bench] {name}: the run is writing its record and exiting")
            return
        if self.received is not None:
            if signum == signal.SIGINT and self._lightning_running():  # the user insists: the step stops now
                tell(f"[lra-bench] {name} again: stopping now; the last checkpoint written is the resume point")
                raise KeyboardInterrupt
            if signum == signal.SIGINT:  # a save or the stop itself is under way: cut short, it would lose work
                tell(f"[lra-bench] {name} again: already stopping")
            return  # a repeated SIGTERM: already stopping (SLURM follows up with SIGKILL after KillWait)
        self.received = signum
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

    def saved(self) -> tuple[Path, int | None] | None:
        """The checkpoint a re-run resumes from, as found on disk now (the one `ckpt_path=last` takes:
        `lra_bench.run.checkpoints.find_resumable`), relative to the run dir, and its step; None when none is."""
        if self.checkpoints is None:
            return None
        resume = find_resumable(self.checkpoints)
        if resume.path is None:
            return None
        return Path(resume.path).relative_to(self.checkpoints.parent), resume.step

    def resume_point(self) -> str:
        """What re-running the same command starts from (`saved`)."""
        if self.checkpoints is None:
            return "re-running the same command resumes from the last checkpoint saved, if any"
        found = self.saved()
        if found is None:
            return "no checkpoint was saved: re-running the same command starts from step 0"
        return f"re-running the same command resumes from {found[0]} (step {found[1]})"

    def stopped_line(self, step: int | None, resume: str) -> str:
        """The run's last line once stopped: the signal, the step, what is saved (`saved`) and `resume`, the
        command that continues from it (`lra_bench.run.console.resume_command`)."""
        name = signal.Signals(self.received).name if self.received else "a signal"
        where = f" at step {step}" if step is not None else " before training"
        found = self.saved()
        self.last_said = True  # the caller says it now: a later signal must not print after it
        if found is None:
            return f"[lra-bench] stopped by {name}{where}: nothing saved; to start again from step 0: {resume}"
        return f"[lra-bench] stopped by {name}{where}: saved {found[0]} at step {found[1]}; to resume: {resume}"

    def exit_status(self) -> int:
        """The shell's exit status for a process stopped by the signal (143 for SIGTERM, 130 for SIGINT)."""
        return 128 + int(self.received or signal.SIGTERM)
