"""The data module every task shares: build tokenized splits once, cache them, serve fixed-length batches.

A task subclass implements `build_split(name) -> dict[str, np.ndarray]` (columns `input_ids [n, L]`,
`length [n]`, `label [n]`, plus `input_ids_2`/`length_2` for two-tower tasks) and `cache_params()` (every
preprocessing parameter). Batches are dicts: `input_ids` (long), `mask` (bool, True = real token), `label`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, is_dataclass
from typing import Any, ClassVar

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from tasks import cache

SPLITS = ("train", "val", "test")


class ArrowSplit(Dataset):
    """A cached split; `__getitems__` fetches a whole batch in one Arrow slice (no per-row Python)."""

    def __init__(self, table: Any, columns: tuple[str, ...]) -> None:
        self.table, self.columns = table, columns

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return self.__getitems__([index])

    def __getitems__(self, indices: list[int]) -> dict[str, np.ndarray]:
        rows = self.table[list(indices)]
        return {c: np.asarray(rows[c]) for c in self.columns}


class ResumableSampler(DistributedSampler):
    """Training order as a pure function of (seed, epoch, position), so a resumed run sees the same batches.

    Epoch `e` is the permutation drawn from numpy's `default_rng([seed, e])`, cut to whole global batches; rank `r`
    of `w` takes every `w`-th index from `r` (DistributedSampler's convention). On each `iter()` the position is
    read from `consumed_batches()` — batches already trained on, i.e. `global_step × accumulate_grad_batches`,
    which Lightning restores from the checkpoint — so epoch and offset follow from it and the batches already seen
    in the current epoch are skipped. Nothing extra is stored in the checkpoint, and a checkpoint written at
    `every_n_train_steps` or after a validation resumes alike. Without a position source (no trainer) it follows
    `set_epoch` like any DistributedSampler. A DistributedSampler subclass so Lightning keeps it under DDP.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        seed: int,
        num_replicas: int = 1,
        rank: int = 0,
        consumed_batches: Callable[[], int | None] | None = None,
    ) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)
        self.size = len(dataset)  # type: ignore[arg-type]
        self.batch_size = batch_size
        self.batches_per_epoch = self.size // (batch_size * num_replicas)
        self.num_samples = self.batches_per_epoch * batch_size  # per rank
        self.total_size = self.num_samples * num_replicas
        self.consumed_batches = consumed_batches

    def __len__(self) -> int:
        return self.num_samples

    def order(self, epoch: int) -> np.ndarray:
        """This rank's indices for `epoch`, in order."""
        perm = np.random.default_rng([self.seed, epoch]).permutation(self.size)[: self.total_size]
        return perm[self.rank :: self.num_replicas]

    def position(self) -> tuple[int, int]:
        """(epoch, batches already consumed in it) at this moment."""
        consumed = self.consumed_batches() if self.consumed_batches is not None else None
        if consumed is None:
            return self.epoch, 0
        return divmod(int(consumed), max(1, self.batches_per_epoch))

    def __iter__(self) -> Iterator[int]:
        if self.batches_per_epoch == 0:
            return iter(())
        epoch, offset = self.position()
        return iter(self.order(epoch)[offset * self.batch_size :].tolist())


class ResumableDataLoader(DataLoader):
    """The training DataLoader. Its `ResumableSampler` resumes by itself from `global_step`, so there is no state to
    store; `state_dict`/`load_state_dict` only tell Lightning that this loader is resumable mid-epoch."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


class LRADataModule(pl.LightningDataModule):
    """Base data module. `cfg` is the task config node as a plain dict (see the task's schema dataclass)."""

    #: the `task=` option name; a class with its own `name` is discovered by `lra_bench.registry`
    name: str = ""  # (an attribute on LightningDataModule too, where it is informational)
    #: the config dataclass (the task node's schema)
    config: ClassVar[type | None] = None
    dual: bool = False
    tokenizer_version: str = ""

    def __init__(
        self,
        cfg: Any,
        data_dir: str,
        cache_dir: str,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.cfg: dict[str, Any] = asdict(cfg) if is_dataclass(cfg) and not isinstance(cfg, type) else dict(cfg)
        self.data_dir, self.cache_dir = data_dir, cache_dir
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers, self.seed = num_workers, seed
        self.splits: dict[str, ArrowSplit] = {}
        self.data_wait_s = 0.0

    # -- what a task provides --------------------------------------------------------------------------
    @property
    def seq_len(self) -> int:
        return int(self.cfg["seq_len"])

    @property
    def max_length(self) -> int:
        return int(self.cfg.get("max_length") or self.cfg["seq_len"])

    @property
    def vocab_size(self) -> int:
        return int(self.cfg["vocab_size"])

    @property
    def num_classes(self) -> int:
        return int(self.cfg["num_classes"])

    def cache_params(self) -> dict[str, Any]:
        """Every preprocessing parameter (source paths included): any change gives a new cache."""
        return {"task": self.name, "tokenizer": self.tokenizer_version, **self.cfg}

    def ensure_source(self) -> None:
        """Check (or generate) the raw source; raise `DataSourceError` if missing. Called on every
        `prepare_data`, so it must be cheap when the source is already there."""

    def build_split(self, split: str) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def data_info(self) -> dict[str, Any]:
        """What the result record says about the data (lengths, tokenizer, split convention, source)."""
        return {
            "max_length": self.max_length,
            "seq_len": self.seq_len,
            "tokenizer_version": self.tokenizer_version,
            "text_length": None,
            "split": None,
            "source": None,
        }

    # -- caching ---------------------------------------------------------------------------------------
    @property
    def cache_path(self):
        return cache.cache_path(self.cache_dir, self.name, self.cache_params())

    @property
    def tokens(self) -> str:
        """The digest of the tokenized splits (`tasks.cache.tokens_digest`): the data's part of a run's identity."""
        return cache.tokens_digest(self.cache_path, SPLITS)

    def prepare_data(self) -> None:
        self.ensure_source()  # cheap when the source is in place; may (re)generate it
        if cache.exists(self.cache_path, SPLITS):
            return
        start = time.perf_counter()
        built = {split: cache.arrays_to_dataset(self.build_split(split)) for split in SPLITS}
        cache.save_splits(self.cache_path, built, self.cache_params())
        cache.tokens_digest(self.cache_path, SPLITS)  # the identity's data part, once per cache
        print(f"[{self.name}] cached tokenized splits in {self.cache_path} ({time.perf_counter() - start:.1f}s)")

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        self.prepare_data()
        columns = ("input_ids", "length", "label") + (("input_ids_2", "length_2") if self.dual else ())
        for split in SPLITS:
            self.splits[split] = ArrowSplit(cache.load_split(self.cache_path, split), columns)

    # -- batches ---------------------------------------------------------------------------------------
    def make_mask(self, ids: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        return torch.arange(ids.shape[1])[None, :] < length[:, None]

    def collate(self, rows: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        ids = torch.from_numpy(rows["input_ids"].astype(np.int64))
        batch = {"input_ids": ids, "label": torch.from_numpy(rows["label"].astype(np.int64))}
        batch["mask"] = self.make_mask(ids, torch.from_numpy(rows["length"].astype(np.int64)))
        if self.dual:
            ids2 = torch.from_numpy(rows["input_ids_2"].astype(np.int64))
            batch["input_ids_2"] = ids2
            batch["mask_2"] = self.make_mask(ids2, torch.from_numpy(rows["length_2"].astype(np.int64)))
        return batch

    def per_device_batch(self, batch_size: int) -> int:
        world = getattr(self.trainer, "world_size", 1) if self.trainer is not None else 1
        return max(1, batch_size // max(world, 1))

    def _loader(self, split: str, batch_size: int, shuffle: bool) -> DataLoader:
        generator = torch.Generator().manual_seed(self.seed) if shuffle else None
        return DataLoader(
            self.splits[split],
            batch_size=self.per_device_batch(batch_size),
            shuffle=shuffle,
            drop_last=shuffle,
            generator=generator,
            collate_fn=self.collate,  # type: ignore[arg-type]  # torch types it for a list; `__getitems__` gives a dict
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        batch_size = self.per_device_batch(self.batch_size)
        split = self.splits["train"]
        sampler = ResumableSampler(split, batch_size, self.seed, world, rank, self._consumed_train_batches)
        return ResumableDataLoader(
            split,
            batch_size=batch_size,
            sampler=sampler,
            drop_last=True,
            generator=torch.Generator().manual_seed(self.seed),  # worker seeds: keep the global RNG untouched
            collate_fn=self.collate,  # type: ignore[arg-type]  # as in `_loader`
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def _consumed_train_batches(self) -> int | None:
        """Training batches consumed so far on this rank (restored by Lightning on resume); None without a trainer."""
        trainer = self.trainer
        if trainer is None:
            return None
        return int(trainer.global_step) * int(trainer.accumulate_grad_batches)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", self.eval_batch_size, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", self.eval_batch_size, shuffle=False)

    # -- statistics (for `tasks.prepare`) ----------------------------------------------------------------
    def describe(self) -> dict[str, dict[str, Any]]:
        self.setup()
        stats: dict[str, dict[str, Any]] = {}
        for split, ds in self.splits.items():
            table = ds.table
            labels = np.asarray(table["label"])
            lengths = np.asarray(table["length"])
            values, counts = np.unique(labels, return_counts=True)
            stats[split] = {
                "count": int(len(labels)),
                "labels": {int(v): int(c) for v, c in zip(values, counts)},
                "majority_share": float(counts.max() / max(len(labels), 1)) if len(labels) else 0.0,
                "length_min": int(lengths.min()) if len(lengths) else 0,
                "length_median": float(np.median(lengths)) if len(lengths) else 0.0,
                "length_max": int(lengths.max()) if len(lengths) else 0,
                "at_max_length_share": float(np.mean(lengths >= self.max_length)) if len(lengths) else 0.0,
            }
        return stats
