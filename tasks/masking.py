"""Self-pretraining data: the task's *training inputs only*, corrupted for a denoising objective.

Amos, Berant & Gupta, "Never Train from Scratch" (ICLR 2024, arXiv 2310.02980) pretrain on the downstream task's
own training split, then fine-tune. `PretrainingData` wraps a task's data module and serves batches built from its
`train` split alone: most of it for training, a seeded hold-out slice of it for the pretraining validation curve.
The task's `val` and `test` splits are never read (`test_dataloader` refuses), so a fine-tune evaluated on them
has seen none of their inputs. Labels are dropped before a batch leaves the collate.

Objectives (the masking follows IdoAmos/not-from-scratch@f919137, `src/dataloaders/base.py`,
`MaskedSequenceDatasetWrapper.mask`):

* `mlm` — each real token is chosen independently with probability `mask_ratio` (their `torch.rand < mlm_prob`),
  replaced by a dedicated mask id (`mask_id`, one past the task's vocabulary; they use a `<mask>` special), and is
  the only place the loss is computed (their `ignore_val=True`). No BERT 80/10/10 replacement: their code has none.
* `causal` — inputs unchanged; the target at position i is token i+1 (their `causal_lm`: `sample[1:]`, the last
  position ignored); the attention must run in its causal mode.

One deliberate difference: their code also masks the val split for the MLM validation curve
(`src/dataloaders/lra.py`, `ListOpsLM.setup`); here that curve comes from a hold-out of the training split, so the
whole pretraining stage reads nothing but training inputs.

Masks are a pure function of (seed, the batch's example indices): a resumed run redraws exactly the masks it would
have drawn, in the main process or a worker, while each epoch (a new permutation, so new batch compositions) gets
fresh masks — dynamic masking without any state to checkpoint. Two-tower tasks pretrain on both documents as
separate sequences (stacked along the batch).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from tasks.base import ArrowSplit, LRADataModule

IGNORE_INDEX = -100  # positions without a target (F.cross_entropy's default ignore_index)
OBJECTIVES = ("mlm", "causal")
HOLDOUT_STREAM = 0x5E1F  # the hold-out permutation's own RNG stream (independent of the training order)


def extra_tokens(pretraining: str | None) -> int:
    """Embedding rows beyond the task's vocabulary: the mask token of an `mlm`-pretrained encoder (kept when it is
    fine-tuned, as BERT keeps [MASK], so the pretrained embedding is loaded whole), none otherwise."""
    return 1 if pretraining == "mlm" else 0


def mlm_corrupt(
    ids: torch.Tensor, real: torch.Tensor, ratio: float, mask_id: int, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets): each real token is masked with probability `ratio` (input → `mask_id`, target = the
    original id); every other position has target `IGNORE_INDEX`."""
    chosen = torch.from_numpy(rng.random(tuple(ids.shape)) < ratio) & real
    inputs = torch.where(chosen, torch.full_like(ids, mask_id), ids)
    targets = torch.where(chosen, ids, torch.full_like(ids, IGNORE_INDEX))
    return inputs, targets


def next_token_targets(ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Target at position i = token i+1 where that is a real token, `IGNORE_INDEX` elsewhere (the last position)."""
    targets = torch.full_like(ids, IGNORE_INDEX)
    targets[:, :-1] = torch.where(real[:, 1:], ids[:, 1:], torch.full_like(ids[:, 1:], IGNORE_INDEX))
    return targets


class IndexedSplit(Dataset):
    """A subset of a cached split (`indices` into it) whose batches also carry those indices (`index`), so the
    collate can seed each batch's masks from the examples it holds."""

    def __init__(self, split: ArrowSplit, indices: np.ndarray) -> None:
        self.split, self.indices = split, np.asarray(indices, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int) -> dict[str, np.ndarray]:
        return self.__getitems__([position])

    def __getitems__(self, positions: list[int]) -> dict[str, np.ndarray]:
        index = self.indices[np.asarray(positions, dtype=np.int64)]
        rows = self.split.__getitems__(index.tolist())
        rows["index"] = index
        return rows


def holdout_split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, hold-out indices) of a training split of size n: a seeded `fraction` of it (at least one
    example when fraction > 0, never all of it) is held out of pretraining for its validation curve."""
    order = np.random.default_rng([seed, HOLDOUT_STREAM]).permutation(n)
    k = min(n - 1, max(1, round(fraction * n))) if fraction > 0 and n > 1 else 0
    return np.sort(order[k:]), np.sort(order[:k])


class PretrainingData(LRADataModule):
    """The pretraining view of a task: batches `{input_ids, mask, target}` from its training split only.

    A data module in its own right (the base class's resumable training loader, DDP batching and validation loader
    are reused as they are); it delegates preparing and caching to the wrapped task. It declares no `name`, so the
    registry does not list it as a task.
    """

    def __init__(
        self, task: LRADataModule, objective: str, mask_ratio: float, holdout_fraction: float, seed: int
    ) -> None:
        super().__init__(
            task.cfg,
            task.data_dir,
            task.cache_dir,
            batch_size=task.batch_size,
            eval_batch_size=task.eval_batch_size,
            num_workers=task.num_workers,
            seed=seed,
        )
        if objective not in OBJECTIVES:
            raise ValueError(f"objective={objective!r}: expected one of {', '.join(OBJECTIVES)}")
        self.task, self.objective = task, objective
        self.mask_ratio, self.holdout_fraction = float(mask_ratio), float(holdout_fraction)
        self.tokenizer_version = task.tokenizer_version

    @property
    def mask_id(self) -> int:
        """The mask token: one past the task's vocabulary (the network's embedding has one more row)."""
        return self.task.vocab_size

    @property
    def tokens(self) -> str:
        """The wrapped task's tokens: pretraining reads that cache."""
        return self.task.tokens

    def prepare_data(self) -> None:
        self.task.prepare_data()

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        self.task.setup()
        train = self.task.splits["train"]
        kept, held = holdout_split(len(train), self.holdout_fraction, self.seed)
        views = {"train": IndexedSplit(train, kept), "val": IndexedSplit(train, held)}
        self.splits = views  # type: ignore[assignment]  # views of an ArrowSplit: loaders need len, __getitems__

    def collate(self, rows: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        index = rows.pop("index")
        batch = self.task.collate(rows)  # the task's own ids and padding mask (e.g. Image's pixel0_is_padding)
        ids, real = batch["input_ids"], batch["mask"]
        if self.task.dual:
            ids, real = torch.cat([ids, batch["input_ids_2"]]), torch.cat([real, batch["mask_2"]])
        if self.objective == "mlm":
            rng = np.random.default_rng([self.seed, *np.asarray(index, dtype=np.int64).tolist()])
            inputs, targets = mlm_corrupt(ids, real, self.mask_ratio, self.mask_id, rng)
        else:
            inputs, targets = ids, next_token_targets(ids, real)
        return {"input_ids": inputs, "mask": real, "target": targets}

    def test_dataloader(self) -> DataLoader:
        raise RuntimeError("self-pretraining never reads the test split (nor val): there is nothing to test")

    def data_info(self) -> dict[str, Any]:
        info = self.task.data_info()
        self.setup()
        info["split"] = (
            f"self-pretraining on the train split's inputs only: {len(self.splits['train'])} examples trained on, "
            f"{len(self.splits['val'])} held out for the pretraining curve; the task's val/test splits unused"
        )
        return info
