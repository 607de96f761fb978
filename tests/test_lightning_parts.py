"""Lightning's parts where they serve, ours where they do not — and the reasons, checked on the installed Lightning.

* `ModelCheckpoint(save_last=True)` misses a run's final state and `save_on_exception` saves a NaN-poisoned one:
  the two facts `lra_bench.run.checkpoints` keeps its own `last.ckpt` for (if Lightning changes, these fail and
  say that its part may now serve);
* user callbacks are `_target_` nodes under `callbacks:` (`+callbacks.x._target_=...` on the command line);
* `val_acc_best` survives a resume (its MaxMetric state is in the checkpoint);
* the diagnostics' RNG guard is `torch.random.fork_rng` and leaves the training RNG untouched.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint, OnExceptionCheckpoint

from lra_bench.errors import ConfigError
from lra_bench.run import checkpoints
from tests.conftest import TINY_LISTOPS, compose, fault


class _Tiny(pl.LightningModule):
    """One linear layer on random data; `poison_at` turns the weights NaN and raises, as FiniteGuard would."""

    def __init__(self, poison_at: int | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.poison_at = poison_at

    def training_step(self, batch, batch_idx):
        if self.poison_at is not None and self.global_step == self.poison_at:
            with torch.no_grad():
                self.layer.weight.fill_(float("nan"))
            raise FloatingPointError("parameters became non-finite")
        return self.layer(batch[0]).pow(2).mean()

    def train_dataloader(self):
        data = torch.utils.data.TensorDataset(torch.randn(64, 4))
        return torch.utils.data.DataLoader(data, batch_size=4)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(tmp_path: Path, callbacks: list, max_steps: int = 7, module: _Tiny | None = None) -> None:
    trainer = pl.Trainer(
        max_steps=max_steps,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(module or _Tiny())


def _step(path: Path) -> int:
    return int(torch.load(path, map_location="cpu", weights_only=True)["global_step"])


def test_lightning_save_last_misses_the_final_state_ours_does_not(tmp_path: Path) -> None:
    theirs = ModelCheckpoint(dirpath=tmp_path / "theirs", save_last=True, every_n_train_steps=3, save_top_k=1)
    ours = checkpoints.LastCheckpoint(tmp_path / "ours", every_n_train_steps=3)
    _fit(tmp_path, [theirs, ours], max_steps=7)
    assert _step(tmp_path / "theirs" / "last.ckpt") == 6  # Lightning 2.6: the run's last step (7) never got there
    assert _step(tmp_path / "ours" / "last.ckpt") == 7
    assert _step(tmp_path / "ours" / "last-prev.ckpt") == 6


def test_lightning_exception_checkpoints_save_a_poisoned_state_ours_does_not(tmp_path: Path) -> None:
    theirs = OnExceptionCheckpoint(dirpath=str(tmp_path / "theirs"))
    ours = checkpoints.LastCheckpoint(tmp_path / "ours", every_n_train_steps=100)
    with pytest.raises(FloatingPointError):
        _fit(tmp_path, [theirs, ours], module=_Tiny(poison_at=3))
    saved = torch.load(tmp_path / "theirs" / "on_exception.ckpt", map_location="cpu", weights_only=True)
    assert torch.isnan(saved["state_dict"]["layer.weight"]).all()  # what FiniteGuard's stop exists to prevent
    assert not (tmp_path / "ours" / "last.ckpt").exists()


# -- the harness on top ---------------------------------------------------------------------------------------------
SMALL = [
    *[a for a in TINY_LISTOPS if not a.startswith(("trainer.max_steps", "trainer.val_check_interval"))],
    "attn=full",
    "trainer.val_check_interval=2",
    "trainer.log_every_n_steps=1",
    "diagnostics.enabled=false",
]


def _train(tmp_path: Path, *overrides: str, extra: list | None = None) -> dict:
    import lra_bench.run.train as train_module
    from lra_bench.run.entry import run_stage

    cfg = compose([*SMALL, f"data_dir={tmp_path / 'data'}", *overrides])
    if extra:
        original = train_module._extra_callbacks
        train_module._extra_callbacks = lambda *a: [*original(*a), *extra]
        try:
            return run_stage(cfg, tmp_path / "run")
        finally:
            train_module._extra_callbacks = original
    return run_stage(cfg, tmp_path / "run")


def _metrics(tmp_path: Path) -> list[dict[str, str]]:
    rows = []
    for path in sorted((tmp_path / "run" / "csv").rglob("metrics.csv")):
        with open(path) as fh:
            rows += list(csv.DictReader(fh))
    return rows


def test_a_callback_added_from_the_command_line_runs(tmp_path: Path) -> None:
    _train(
        tmp_path,
        "trainer.max_steps=4",
        "+callbacks.lr_monitor._target_=pytorch_lightning.callbacks.LearningRateMonitor",
        "+callbacks.lr_monitor.logging_interval=step",
    )
    assert any(row.get("lr-AdamW") for row in _metrics(tmp_path))  # the monitor logged the learning rate


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["+callbacks.x._target_=no.such.Callback"], r"^callbacks\.x\._target_=no\.such\.Callback: cannot import"),
        (["+callbacks.x._target_=collections.OrderedDict"], r"^callbacks\.x\._target_=collections\.OrderedDict is a"),
        (["+callbacks.x.foo=1"], r"^callbacks\.x: a node under callbacks: must be a Lightning callback"),
    ],
)
def test_a_bad_callback_node_is_one_line(tmp_path: Path, overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        _train(tmp_path, "trainer.max_steps=2", *overrides)
    assert "\n" not in str(err.value)


class _BestAtStart(pl.Callback):
    def __init__(self) -> None:
        self.best: float | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.best = float(pl_module.val_acc_best.compute())


def test_val_acc_best_survives_a_resume_that_reads_last_ckpt_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the first segment dies at step 7 (a NaN loss: the last good last.ckpt is step 6's, after its validation);
    # the same experiment (fault injection is not part of its identity) then resumes from step 6
    with pytest.raises(FloatingPointError):
        _train(tmp_path, "trainer.max_steps=8", *fault(nan_loss_at_step=7))
    before = max(float(r["val/acc"]) for r in _metrics(tmp_path) if r.get("val/acc"))
    probe = _BestAtStart()
    reads: list[str] = []
    load = torch.load

    def counting_load(f: Any, *args: Any, **kwargs: Any) -> Any:  # Lightning passes an open file, we a path
        reads.append(Path(str(getattr(f, "path", getattr(f, "name", f)))).name)
        return load(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", counting_load)
    record = _train(tmp_path, "trainer.max_steps=8", extra=[probe])
    assert reads.count("last.ckpt") == 1, reads  # checked, identity-checked and restored from one read
    assert record["run"]["resumed_from_step"] == 6
    assert probe.best == pytest.approx(before)  # restored: a fresh MaxMetric starts at -inf
    logged = [float(r["val/acc_best"]) for r in _metrics(tmp_path) if r.get("val/acc_best")]
    every_val = [float(r["val/acc"]) for r in _metrics(tmp_path) if r.get("val/acc")]
    assert logged[-1] == pytest.approx(max(every_val))


def test_the_diagnostics_rng_guard_is_fork_rng_and_restores_the_stream() -> None:
    from lra_bench.diagnostics.callback import preserved_rng

    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    with preserved_rng():
        torch.rand(100)  # draws inside the guard
    assert torch.equal(torch.rand(3), expected)
