"""A fine-tune's pretrained run (`pretrained=<run dir or .ckpt>`): find it and check it, before anything is built.

`pretrained=<run dir>` takes `checkpoints/last.ckpt`, the state the pretraining run ended in; a `.ckpt` inside a
run's `checkpoints/` picks another one (e.g. its best-val `best-<step>.ckpt`). Either way the pretraining run's
record must say `stage=pretrain` and `status=completed`: a fine-tune never starts from a half-trained or foreign
checkpoint. The architecture keys of both configs must agree (`ARCH_KEYS`; seeds, dropout and the head's own keys
may differ), checked before anything is built.

The fine-tune's config gains `pretraining` (the objective) and `pretraining_fingerprint` (the pretraining run's
experiment fingerprint with its seeds left out, so the seeds of an SPT experiment pool like any other:
`lra_bench.config.stages.resolve_stage`), and its record a `pretrained` section with the path, the pretraining run's
own fingerprint and its settings (`PretrainedSource.describe`).

Here, below the run, because deriving those keys is part of settling a config: the protocol check
(`lra_bench.config.conformance`) derives them as the run does. Loading the encoder is the run's
(`lra_bench.run.pretrain.load_encoder`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lra_bench.errors import ConfigError
from lra_bench.kit.plain import plain_dict
from lra_bench.record import results
from lra_bench.record.checkpoint_file import CHECKPOINT_DIR, LAST, load_checkpoint
from lra_bench.record.identity import config_identity, fingerprint, flatten, under
from lra_bench.record.reader import ReadRecord, lookup, read
from lra_bench.record.schema import RunRecord

#: config keys that shape the encoder (every key below them is compared, except seeds)
ARCH_KEYS = (
    "task.name",
    "task.seq_len",
    "task.vocab_size",
    "model.dim",
    "model.depth",
    "model.num_heads",
    "model.head_dim",
    "model.ffn_dim",
    "model.pooling",
    "attn",
    "selector",
)


def _is_seed(key: str) -> bool:
    return key == "seed" or key.endswith(".seed")


def _name_first(key: str) -> tuple[bool, str]:
    """Component names (`attn.name`) before their knobs: a different attention explains the rest."""
    return (not key.endswith(".name"), key)


def family_fingerprint(config: dict[str, Any]) -> str:
    """The experiment fingerprint of a run's config with every seed left out: the same for all seeds of one
    pretraining recipe, different for any other change (objective, mask ratio, steps, model, data…)."""
    return fingerprint({k: v for k, v in config_identity(config).items() if not _is_seed(k)})


def run_fingerprint(record: RunRecord) -> str:
    """The run's own fingerprint: the record's, when the record carries one, else the config's."""
    return str(record.fingerprint or fingerprint(config_identity(record.config)))


@dataclass
class PretrainedSource:
    """A completed pretraining run and the checkpoint of it a fine-tune loads."""

    value: str
    checkpoint: Path
    run_dir: Path
    record: ReadRecord

    @property
    def objective(self) -> str:
        return str(lookup(self.record.pretrain, "objective") or self.record.config_at("objective"))

    @property
    def family_fingerprint(self) -> str:
        return family_fingerprint(self.record.config)

    def describe(self) -> dict[str, Any]:
        """The fine-tune record's `pretrained` section."""
        pre = self.record.pretrain or {}
        return {
            "path": str(self.checkpoint.resolve()),
            "run_dir": str(self.run_dir.resolve()),
            "fingerprint": run_fingerprint(self.record),
            "family_fingerprint": self.family_fingerprint,
            "objective": self.objective,
            "mask_ratio": pre.get("mask_ratio"),
            "loss": pre.get("loss"),
            "seed": self.record.seed,
            "steps": self.record.metrics.train_steps,
            "checkpoint_step": int(load_checkpoint(self.checkpoint).get("global_step", 0)),
            "final": pre.get("final"),
        }


def _where(value: str) -> tuple[Path, Path]:
    """(checkpoint, run dir) named by `pretrained=`."""
    path = Path(value).expanduser()
    if path.is_dir():
        return path / CHECKPOINT_DIR / LAST, path
    if path.is_file() and path.suffix == ".ckpt":
        return path, path.parent.parent if path.parent.name == CHECKPOINT_DIR else path.parent
    raise ConfigError(f"pretrained={value}: no such run dir or .ckpt file; give a stage=pretrain run's output dir")


def locate(cfg: DictConfig) -> PretrainedSource:
    """The pretraining run `cfg.pretrained` names, checked against `cfg` (one ConfigError line on any mismatch)."""
    value = str(cfg.pretrained)
    checkpoint, run_dir = _where(value)
    path = run_dir / results.FILENAME
    if not path.exists():
        raise ConfigError(f"pretrained={value}: {path} is missing; a fine-tune starts from a run of this harness")
    try:
        record = read(path)
    except (OSError, ValueError) as err:
        raise ConfigError(f"pretrained={value}: cannot read {path} ({err})") from None
    if record.stage != "pretrain":
        raise ConfigError(f"pretrained={value}: that run has stage={record.stage}, not stage=pretrain")
    if record.status != "completed":
        raise ConfigError(
            f"pretrained={value}: the pretraining run's status is {record.status}; finish it first "
            "(re-running its command resumes it)"
        )
    if not checkpoint.is_file():
        raise ConfigError(f"pretrained={value}: {checkpoint} is missing")
    check_architecture(value, record.config, plain_dict(cfg))
    return PretrainedSource(value, checkpoint, run_dir, record)


def check_architecture(value: str, pretrained: dict[str, Any], current: dict[str, Any]) -> None:
    """The encoder-shaping keys (`ARCH_KEYS`) of both configs agree, seeds aside; else one line listing them."""

    def view(config: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in flatten(config).items() if under(k, ARCH_KEYS) and not _is_seed(k)}

    a, b = view(pretrained), view(current)
    keys = sorted((k for k in set(a) | set(b) if a.get(k, "<unset>") != b.get(k, "<unset>")), key=_name_first)
    if keys:
        shown = ", ".join(f"{k} {a.get(k, '<unset>')} → {b.get(k, '<unset>')}" for k in keys[:6])
        more = f" (+{len(keys) - 6} more)" if len(keys) > 6 else ""
        raise ConfigError(
            f"pretrained={value}: its encoder differs from this run's in {shown}{more}; fine-tune with the "
            "pretraining run's task, model and attention settings"
        )
