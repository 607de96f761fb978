"""The run's record: the per-example test outputs its test numbers come from (`TestOutputs`), and the one writer of
`results.json` (`Recorder`).

Why not Lightning's logged `test/acc`: under DDP, Lightning gives the test loader a `DistributedSampler` that *pads*
the split to a multiple of the world size by repeating its first examples (and `test/loss` is a mean of batch
means). Here each test example is counted once: every rank keeps the split indices of what it predicted (read from
its own loader's batch sampler, so it holds for any sampler), the ranks all-gather (index, label, prediction, loss),
and the first occurrence of each index (in the padded sequence's order, so a padding copy never wins) is kept. The
record takes the accuracy and mean loss of exactly these rows, written to `test_predictions.npz`
(`lra_bench.record.predictions`). With `trainer.limit_test_batches` the rows are a prefix of the split (the loader
never shuffles) and `test_examples` says how many; anything but a prefix (a custom sampler) is not written.

Why one writer of the record: it used to be a dict that a dozen modules wrote into, the diagnostics callback
included, so no one place said what a record holds or when it is on disk. Now the `Recorder` holds the typed record
(`lra_bench.record.schema.RunRecord`) and the stage fills it from what each part returns or exposes. It is written at
the start (a new run dir gets a `running` record at once), when the run dir's state is settled (`own`: from then on
this run replaces any earlier record), at each diagnostics measurement, and at the end (`finish`). Only rank 0
writes; a folder whose record this run does not own yet (an earlier run's, kept until this one is accepted) is not
touched.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pytorch_lightning as pl
import torch

from lra_bench.kit.say import say
from lra_bench.record import results
from lra_bench.record.builder import now
from lra_bench.record.predictions import FILENAME as PREDICTIONS_FILE
from lra_bench.record.predictions import save_predictions
from lra_bench.record.schema import RunRecord


@dataclass(frozen=True)
class TestResult:
    label: np.ndarray  # [K] int, rows 0..K-1 of the test split
    pred: np.ndarray  # [K] int
    loss: np.ndarray  # [K] float64, per-example cross-entropy
    split_size: int  # N, the whole test split

    @property
    def examples(self) -> int:
        return int(len(self.label))

    @property
    def accuracy(self) -> float | None:
        return float((self.pred == self.label).mean()) if len(self.label) else None

    @property
    def mean_loss(self) -> float | None:
        return float(self.loss.mean()) if len(self.loss) else None


def _single_loader(loaders: Any) -> Any:
    if isinstance(loaders, (list, tuple)):
        return loaders[0] if len(loaders) == 1 else None
    if isinstance(loaders, dict):
        return next(iter(loaders.values())) if len(loaders) == 1 else None
    return loaders


class TestOutputs(pl.Callback):
    """Collects `test_step`'s `{"pred", "loss"}` per batch; after the test, `result` holds the split's rows."""

    def __init__(self) -> None:
        self.result: TestResult | None = None
        self.problem: str | None = None  # why no result (said in the record's error-free warning)
        self._parts: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._parts, self.result, self.problem = [], None, None

    def on_test_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: dict[str, torch.Tensor],
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if isinstance(outputs, dict) and "pred" in outputs and "loss" in outputs:
            self._parts.append((batch_idx, outputs["pred"], outputs["loss"], batch["label"]))

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        loader = _single_loader(trainer.test_dataloaders)
        if loader is None:  # the same on every rank, so no rank waits in a gather alone
            self.problem = "not exactly one test loader"
            return
        batches = list(iter(loader.batch_sampler))  # this rank's split indices per batch (the loader never shuffles)
        idx = [torch.zeros(0, dtype=torch.long)]
        pred, label, loss = list(idx), list(idx), [torch.zeros(0, dtype=torch.float64)]
        for batch_idx, p, lo, lab in self._parts:
            idx.append(torch.as_tensor(batches[batch_idx][: len(p)], dtype=torch.long))
            pred.append(p.long().cpu())
            label.append(lab.long().cpu())
            loss.append(lo.double().cpu())
        local = torch.stack([torch.cat(idx), torch.cat(label), torch.cat(pred)])  # [3, n] int64
        rows, losses = self._gather(trainer, pl_module, local, torch.cat(loss))  # every rank takes part
        if rows.shape[1] == 0:
            self.problem = "no test batches"
            return
        self.result, self.problem = _in_split_order(rows, losses, len(loader.dataset))

    @staticmethod
    def _gather(
        trainer: pl.Trainer, pl_module: pl.LightningModule, local: torch.Tensor, loss: torch.Tensor
    ) -> tuple[np.ndarray, np.ndarray]:
        """`[3, total]` (index, label, pred) and `[total]` loss over all ranks, ordered by (local position, rank):
        the order of the sampler's padded sequence for a `DistributedSampler`."""
        if trainer.world_size == 1:
            return local.numpy(), loss.numpy()
        device = pl_module.device
        n = _gather(pl_module, torch.tensor(local.shape[1], device=device))
        most = int(n.max())
        if most == 0:
            return local.numpy(), loss.numpy()
        padded = torch.full((3, most), -1, dtype=torch.long)
        padded[:, : local.shape[1]] = local
        padded_loss = torch.zeros(most, dtype=torch.float64)
        padded_loss[: loss.shape[0]] = loss
        rows = _gather(pl_module, padded.to(device)).cpu()  # [world, 3, most]
        all_loss = _gather(pl_module, padded_loss.to(device)).cpu()  # [world, most]
        rows = rows.permute(1, 2, 0).reshape(3, -1)  # position-major, then rank
        all_loss = all_loss.permute(1, 0).reshape(-1)
        keep = rows[0] >= 0
        return rows[:, keep].numpy(), all_loss[keep].numpy()


def _in_split_order(rows: np.ndarray, losses: np.ndarray, split_size: int) -> tuple[TestResult | None, str | None]:
    index, first = np.unique(rows[0], return_index=True)  # sorted; the first occurrence of each index wins
    label, pred, loss = rows[1][first], rows[2][first], losses[first]
    if not np.array_equal(index, np.arange(len(index))):
        return None, f"the test covered {len(index)} examples that are not the split's first {len(index)}"
    return TestResult(label=label, pred=pred, loss=loss, split_size=int(split_size)), None


@dataclass(frozen=True)
class Tested:
    """What a test adds to the record: `metrics` (test_acc; test_loss and test_examples too when the per-example
    outputs exist) and `predictions`, the file name of those outputs beside the record (None: not written)."""

    metrics: dict[str, Any]
    predictions: str | None


def run_test(
    trainer: pl.Trainer, module: pl.LightningModule, dm: Any, ckpt: str, outputs: TestOutputs, output_dir: Path
) -> Tested:
    """Test `ckpt` (weights and buffers: GPA's codebook) and return its per-example numbers for the record; rank 0
    writes `test_predictions.npz` beside the record."""
    trainer.test(module, datamodule=dm, ckpt_path=ckpt, weights_only=True, verbose=False)  # the summary has them
    result = outputs.result
    if result is None:
        exact = trainer.world_size == 1 and trainer.callback_metrics.get("test/acc") is not None
        if trainer.is_global_zero:
            say(f"[lra-bench] warning: no per-example test outputs ({outputs.problem})", file=sys.stderr)
        return Tested({"test_acc": float(trainer.callback_metrics["test/acc"]) if exact else None}, None)
    if trainer.is_global_zero:
        save_predictions(Path(output_dir) / PREDICTIONS_FILE, result.label, result.pred)
    metrics = {"test_acc": result.accuracy, "test_loss": result.mean_loss, "test_examples": result.examples}
    return Tested(metrics, PREDICTIONS_FILE)


def _gather(pl_module: pl.LightningModule, tensor: torch.Tensor) -> torch.Tensor:
    """`all_gather` of one tensor (Lightning types the result for any collection of tensors)."""
    gathered = pl_module.all_gather(tensor)
    if not isinstance(gathered, torch.Tensor):
        raise TypeError(f"all_gather of a tensor returned a {type(gathered).__name__}")
    return gathered


class DiagnosticsSource(Protocol):
    """What the record reads from the diagnostics callback (`lra_bench.diagnostics.callback`)."""

    latest: dict[str, Any] | None
    best: dict[str, Any] | None


class Recorder:
    def __init__(self, record: RunRecord, output_dir: Path, is_zero: bool) -> None:
        self.record = record
        self.path = Path(output_dir) / results.FILENAME
        self.is_zero = is_zero
        self.owned = not self.path.exists()  # a folder's existing record is replaced only once the run is accepted
        self.diagnostics: DiagnosticsSource | None = None

    def write(self) -> None:
        """Write the record as it stands now (rank 0, once this run owns the folder's record)."""
        if self.diagnostics is not None:
            self.record.diagnostics.update({"latest": self.diagnostics.latest, "best": self.diagnostics.best})
        if self.is_zero and self.owned:
            results.write_atomic(self.path, self.record.to_dict())

    def own(self) -> None:
        """This run is accepted in its folder: its record replaces any earlier one, now."""
        self.owned = True
        self.write()

    def add_test(self, tested: Tested) -> None:
        self.record.metrics.update(tested.metrics)
        if tested.predictions is not None:
            self.record.predictions = tested.predictions

    def fail(self, err: BaseException) -> None:
        self.record.status, self.record.error = "failed", f"{type(err).__name__}: {err}"

    def finish(self) -> None:
        """The last write: when the run ended (completed, failed, interrupted, or refused)."""
        self.record.run.finished_at = now()
        self.write()

    def as_dict(self) -> dict[str, Any]:
        return self.record.to_dict()
