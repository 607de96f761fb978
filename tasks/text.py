"""Text (LRA): IMDB sentiment at the byte level — UTF-8 byte b → id b + 1, pad 0, 257 ids (TFDS ByteTextEncoder).

Length: 4000 bytes kept (padded to 4096) by default — the LRA paper, the Skyformer and xformers harnesses and the
Nyströmformer authors' table; `max_length: 1000` (seq_len 1024) is the JAX repo's `base_tc_config` setting
(the `lra_original` protocol sets it). The result record states which (`data.text_length`).

Sources, first found wins (`source: auto`), or forced with `source: disk|raw|hf`:
  1. `<data_dir>/<disk_dir>` (default `imdb`): a `datasets` `save_to_disk` DatasetDict with train/test;
  2. `<data_dir>/<raw_dir>` (default `aclImdb`): the unpacked `aclImdb_v1.tar.gz`, `{train,test}/{neg,pos}/*.txt`
     (files in numeric id order, neg = 0 then pos = 1);
  3. `datasets.load_dataset(hf_name)` (default `imdb`): the hub when online, else the local HF cache.

`review_form` — which text of a review is tokenized:
  * `hf` (default): as the Hugging Face `imdb` builder reads it, the file as UTF-8 text with universal newlines
    (`open(path, encoding="UTF-8").read()`, huggingface/datasets@02bb18c `datasets/imdb/imdb.py`), not stripped;
    from the raw files we normalise `\r\n` and `\r` to `\n` the same way.
  * `tfds`: as TFDS `imdb_reviews` (plain_text), which LRA loads: the archive member's bytes, verbatim, with
    `.strip()` (`text = imdb_f.read().strip()` on the bytes: leading/trailing ASCII whitespace, i.e. space,
    `\t\n\r\x0b\x0c`; tensorflow/datasets@v4.0.1 `tensorflow_datasets/text/imdb.py`); `ByteTextEncoder` then
    encodes those bytes. From a disk/HF copy, the UTF-8 of its text is stripped the same way (its newlines are
    whatever that copy holds). The `lra_original` recipe sets it.

Splits (stated in `data_info`): train = IMDB train (25k); test = IMDB test (25k); val = the test set again, as
LRA, Nyströmformer, Skyformer, xformers and S4 all do (`val_split: test`), or `val_split: holdout`: a seeded
`holdout_fraction` of train (seed `holdout_seed`) becomes val and leaves train.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from tasks.hub_task import HubOrArchiveTask
from tasks.layout import DataSourceError
from tasks.sources import (
    MissingSourceError,
    is_disk_dataset,
    load_disk_dataset,
    load_hub_dataset,
    pack_bytes,
    path_stamp,
    plain,
)
from tasks.tokenizers import ByteTokenizer

RAW_SPLITS = ("train", "test")
CLASSES = ("neg", "pos")  # label 0, 1 (as TFDS and HF)


class TextSource(str, Enum):
    auto = "auto"
    disk = "disk"
    raw = "raw"
    hf = "hf"


class ValSplit(str, Enum):
    test = "test"
    holdout = "holdout"


class ReviewForm(str, Enum):
    hf = "hf"  # UTF-8 text, universal newlines, unstripped (HF `imdb`)
    tfds = "tfds"  # the file's bytes, .strip()ped (TFDS `imdb_reviews`, LRA)


@dataclass
class TextConfig:
    name: str = "text"
    max_length: int = 4000  # bytes kept per review (LRA paper); 1000 = the JAX repo's config
    seq_len: int = 4096  # padded model length
    vocab_size: int = ByteTokenizer.vocab_size
    num_classes: int = 2
    dual: bool = False
    source: TextSource = TextSource.auto
    disk_dir: str = "imdb"  # save_to_disk folder under data_dir
    raw_dir: str = "aclImdb"  # unpacked aclImdb_v1.tar.gz under data_dir
    hf_name: str = "imdb"
    val_split: ValSplit = ValSplit.test  # test: the test set doubles as validation (LRA) | holdout
    holdout_fraction: float = 0.1
    holdout_seed: int = 0
    review_form: ReviewForm = ReviewForm.hf  # tfds: the bytes, stripped, as TFDS imdb_reviews (LRA)


def _numeric_key(path: Path) -> tuple[int, str]:
    match = re.match(r"(\d+)", path.name)
    return (int(match.group(1)) if match else -1, path.name)


def read_aclimdb_split(root: Path, split: str, form: str = ReviewForm.hf.value) -> tuple[list[bytes], np.ndarray]:
    """Reviews of one aclImdb split as UTF-8 bytes in `form` (see the module docstring) and labels (neg 0, pos 1)."""
    docs: list[bytes] = []
    labels: list[int] = []
    for label, cls in enumerate(CLASSES):
        folder = root / split / cls
        files = sorted(folder.glob("*.txt"), key=_numeric_key)
        if not files:
            raise DataSourceError(f"{folder}: no *.txt reviews")
        for path in files:
            data = path.read_bytes()
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataSourceError(f"{path}: not valid UTF-8 ({err})") from None
            docs.append(data.replace(b"\r\n", b"\n").replace(b"\r", b"\n") if form == ReviewForm.hf.value else data)
        labels += [label] * len(files)
    return docs, np.asarray(labels, dtype=np.int64)


def holdout_indices(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) row indices: a seeded `fraction` of `n` rows (at least one) held out, both sorted."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"task.holdout_fraction={fraction}: expected a fraction strictly between 0 and 1")
    k = max(1, int(round(n * fraction)))
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[k:]), np.sort(perm[:k])


class TextDataModule(HubOrArchiveTask):
    name = "text"
    config = TextConfig
    source_title = "text (IMDB)"
    original_archive = ("IMDB", "aclImdb_v1.tar.gz", "https://ai.stanford.edu/~amaas/data/sentiment/")

    tokenizer_version = ByteTokenizer.version

    def __init__(self, cfg: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(cfg, *args, **kwargs)
        self.cfg = {k: plain(v) for k, v in self.cfg.items()}
        if self.max_length > self.seq_len:
            raise ValueError(f"task.max_length={self.max_length} exceeds task.seq_len={self.seq_len}")
        if self.cfg["review_form"] not in {v.value for v in ReviewForm}:
            valid = ", ".join(v.value for v in ReviewForm)
            raise ValueError(f"task.review_form={self.cfg['review_form']!r}: expected one of {valid}")
        self._raw: dict[str, tuple[list[bytes], np.ndarray]] | None = None
        self._packed: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    # -- where the data is ---------------------------------------------------------------------------
    @property
    def raw_path(self) -> Path:
        return Path(self.data_dir).expanduser() / self.cfg["raw_dir"]

    def raw_present(self) -> bool:
        return all((self.raw_path / s / c).is_dir() for s in RAW_SPLITS for c in CLASSES)

    def resolve_source(self) -> tuple[str, str]:
        """(kind, location) of the source that will be used, without reading it: disk | raw | hf."""
        choice = self.cfg["source"]
        if choice in ("auto", "disk") and is_disk_dataset(self.disk_path):
            return "disk", str(self.disk_path)
        if choice in ("auto", "raw") and self.raw_present():
            return "raw", str(self.raw_path)
        if choice in ("auto", "hf"):
            return "hf", self.cfg["hf_name"]
        return choice, ""

    def local_layouts(self) -> list[str]:
        return [
            f"{self.disk_path} (datasets save_to_disk folder with train/test)",
            f"{self.raw_path}/{{train,test}}/{{neg,pos}}/*.txt (unpacked aclImdb_v1.tar.gz)",
        ]

    def read_source(self) -> dict[str, tuple[list[bytes], np.ndarray]]:
        if self._raw is not None:
            return self._raw
        kind, where = self.resolve_source()
        try:
            if kind == "disk":
                splits = load_disk_dataset(Path(where), RAW_SPLITS)
                self._raw = {s: self._from_hf(ds, f"{where}[{s}]") for s, ds in splits.items()}
            elif kind == "raw":
                self._raw = {s: read_aclimdb_split(Path(where), s, self.cfg["review_form"]) for s in RAW_SPLITS}
            elif kind == "hf":
                hub, why = load_hub_dataset(where, RAW_SPLITS)
                if hub is None:
                    raise self.missing_error(why)
                self._raw = {s: self._from_hf(ds, f"hf:{where}[{s}]") for s, ds in hub.items()}
            else:
                raise self.missing_error(f"task.source={kind} but that source is not under {self.data_dir}")
        except MissingSourceError:
            raise
        except DataSourceError as err:  # a broken source: say what is wrong, and how to get a good one
            raise self.missing_error(str(err)) from None
        return self._raw

    @staticmethod
    def _from_hf(ds: Any, where: str) -> tuple[list[bytes], np.ndarray]:
        missing = [c for c in ("text", "label") if c not in ds.column_names]
        if missing:
            raise DataSourceError(f"{where}: missing column(s) {missing}; has {ds.column_names}")
        docs = [t.encode("utf-8") for t in ds["text"]]
        labels = np.asarray(ds["label"], dtype=np.int64)
        bad = np.setdiff1d(np.unique(labels), [0, 1])
        if bad.size:
            raise DataSourceError(f"{where}: labels {bad.tolist()} outside 0/1 (neg/pos)")
        return docs, labels

    # -- caching + building ----------------------------------------------------------------------------
    def cache_params(self) -> dict[str, Any]:
        kind, where = self.resolve_source()
        if kind == "disk":
            stamp: Any = path_stamp(Path(where), "**/*.arrow")
        elif kind == "raw":
            stamp = [path_stamp(Path(where) / s / c) for s in RAW_SPLITS for c in CLASSES]
        else:
            stamp = where
        keep = {k: v for k, v in self.cfg.items() if k not in ("disk_dir", "raw_dir", "hf_name", "source")}
        if keep["val_split"] == "test":
            del keep["holdout_fraction"], keep["holdout_seed"]
        return {"task": "text", "tokenizer": self.tokenizer_version, "source": [kind, stamp], **keep}

    def _pack(self, raw_split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if raw_split not in self._packed:
            docs, labels = self.read_source()[raw_split]
            if self.cfg["review_form"] == ReviewForm.tfds.value:
                docs = [doc.strip() for doc in docs]  # bytes.strip(): ASCII whitespace, as TFDS imdb_reviews
            ids, lengths = pack_bytes(docs, self.max_length, self.seq_len)
            self._packed[raw_split] = (ids, lengths, labels)
        return self._packed[raw_split]

    def build_split(self, split: str) -> dict[str, np.ndarray]:
        if split == "test" or (split == "val" and self.cfg["val_split"] == "test"):
            ids, lengths, labels = self._pack("test")
        else:
            ids, lengths, labels = self._pack("train")
            if self.cfg["val_split"] == "holdout":
                train_idx, val_idx = holdout_indices(
                    len(labels), self.cfg["holdout_fraction"], self.cfg["holdout_seed"]
                )
                rows = train_idx if split == "train" else val_idx
                ids, lengths, labels = ids[rows], lengths[rows], labels[rows]
        return {"input_ids": ids, "length": lengths, "label": labels}

    def prepare_data(self) -> None:
        super().prepare_data()
        self._raw, self._packed = None, {}  # the cache holds everything now

    def split_convention(self) -> str:
        if self.cfg["val_split"] == "test":
            return "train = IMDB train; val = IMDB test (the test set doubles as validation, as LRA); test = IMDB test"
        return (
            f"train = IMDB train minus a seeded {self.cfg['holdout_fraction']:g} holdout "
            f"(seed {self.cfg['holdout_seed']}); val = that holdout; test = IMDB test"
        )

    def data_info(self) -> dict[str, Any]:
        info = super().data_info()
        kind, where = self.resolve_source()
        info["text_length"] = self.max_length
        info["review_form"] = self.cfg["review_form"]
        info["split"] = self.split_convention()
        info["source"] = f"{kind}:{where}"
        return info
