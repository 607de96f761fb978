"""What a training run settles before its first step: schedule, identity, run-dir ownership, the checkpoint.

Called by `lra_bench.run.train.train` once the data is prepared and the network built, before anything is written
to a run dir that already holds a record. In order (the first two called by the stage, whose record stores what
they find): the schedule can run (`schedule.check_schedule`); the run's identity and fingerprint, and how it
deviates from its protocol (`identify`, `lra_bench.record.conformance`); the run dir holds this experiment or none
(`run_state.check_same_experiment`); a run already completed is left as it is (unless `retest=true`); then
`Start.use_checkpoint`: the checkpoint to resume from loads and was made by this model
(`checkpoint_identity.check_fits`, which also warns when the code changed since it was written). Every refusal is
one `ConfigError` line, and nothing has been written to a folder that already holds a record.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lra_bench.record import conformance
from lra_bench.record.identity import config_identity, fingerprint, run_identity
from lra_bench.record.schema import Identified, RunRecord
from lra_bench.run import run_state
from lra_bench.run.checkpoint_identity import IdentityStamp, check_fits, warn_if_code_changed
from lra_bench.run.checkpointing import Resume


@dataclass
class Start:
    finished: dict[str, Any] | None  # the run dir's completed record of this experiment (left untouched)
    previous: dict[str, Any] | None  # with retest=true: that completed record (its training numbers are kept)
    stamp: IdentityStamp | None  # the callback that writes the identity into every checkpoint

    def use_checkpoint(self, resume: Resume, module: Any, code: dict[str, Any] | None) -> str | None:
        """Refuse a checkpoint that does not load or was made by another model; warn when the code changed.
        Returns the record's `run.resumed_from` (the checkpoint's absolute path; None when starting fresh)."""
        if not resume.path or self.stamp is None:
            return None
        checkpoint = check_fits(resume.path, self.stamp.identity, module, resume.checkpoint)
        warn_if_code_changed(checkpoint, code or {}, resume.path)
        return str(Path(resume.path).resolve())


def protocol_check(record: RunRecord) -> dict[str, Any]:
    """`conformance.check` of the run: from its config alone, so a run knows before its data is prepared whether
    it is on protocol (the data part of an identity is no part of a protocol: `conformance.deviations` skips it)."""
    identity = config_identity(record.config)
    return conformance.check(identity, str(record.task), str(record.protocol), str(record.attn), record.selector)


def identify(record: RunRecord, dm: Any, checked: dict[str, Any] | None = None) -> Identified:
    """The run's identity, fingerprint and protocol deviations (`RunRecord.set_identity` stores them); `checked`:
    the run's `protocol_check`, when it was made already."""
    identity = run_identity(record.config, run_state.data_identity_of(dm))
    found = checked if checked is not None else protocol_check(record)
    return Identified(identity, fingerprint(identity), found["off_protocol"], found["deviations"])


def start_run(cfg: DictConfig, output_dir: Path, record: RunRecord, found: Identified, is_zero: bool) -> Start:
    """After `check_schedule` and `identify` (the record holds their findings): is the run dir this experiment's,
    and is the run already completed there."""
    stored = run_state.check_same_experiment(output_dir, found.identity, found.fingerprint)
    done = run_state.finished_record(output_dir, found.fingerprint) if str(cfg.ckpt_path) == "last" else None
    if done is not None and not cfg.get("retest"):
        return Start(finished=done, previous=None, stamp=None)
    if is_zero and stored is None:
        run_state.write_identity(output_dir, found.identity, found.fingerprint, record.code or {})
    stamp = IdentityStamp(found.identity, found.fingerprint, record.config, record.code or {})
    return Start(finished=None, previous=done, stamp=stamp)
