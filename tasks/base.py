"""The data module every task shares: build tokenized splits once, cache them, serve fixed-length batches.

A task subclass implements `build_split(name) -> dict[str, np.ndarray]` (columns `input_ids [n, L]`,
`length [n]`, `label [n]`, plus `input_ids_2`/`length_2` for two-tower tasks) and `cache_params()` (every
preprocessing parameter). Batches are dicts: `input_ids` (long), `mask` (bool, True = real token), `label`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, is_dataclass
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

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


class LRADataModule(pl.LightningDataModule):
    """Base data module. `cfg` is the task config node as a plain dict (see the task's schema dataclass)."""

    task_name: str = ""
    dual: bool = False
    tokenizer_version: str = ""

    def __init__(
        self,
        cfg: dict[str, Any] | Any,
        data_dir: str,
        cache_dir: str,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.cfg = asdict(cfg) if is_dataclass(cfg) else dict(cfg)
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
        return {"task": self.task_name, "tokenizer": self.tokenizer_version, **self.cfg}

    def ensure_source(self) -> None:
        """Check (or generate) the raw source before building; raise `DataSourceError` if missing."""

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
        return cache.cache_path(self.cache_dir, self.task_name, self.cache_params())

    def prepare_data(self) -> None:
        if cache.exists(self.cache_path, SPLITS):
            return
        self.ensure_source()
        start = time.perf_counter()
        built = {split: cache.arrays_to_dataset(self.build_split(split)) for split in SPLITS}
        cache.save_splits(self.cache_path, built, self.cache_params())
        print(f"[{self.task_name}] cached tokenized splits in {self.cache_path} ({time.perf_counter() - start:.1f}s)")

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
            collate_fn=self.collate,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", self.batch_size, shuffle=True)

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
