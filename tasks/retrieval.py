"""Retrieval (LRA): AAN citation pairs, two towers, byte level (bytes + 1, pad 0, 257 ids), 4000 bytes per document.

Files `tsv_data/new_aan_pairs.{train,eval,test}.tsv` of the official `lra_release` archive (either nesting), or
`data/aan/` as the `OpenNLPLab/lra` Hugging Face mirror lays them out. No header; 5 tab-separated columns
`label, id1, id2, text1, text2`; labels `0/1` or `0.0/1.0` (parsed as a float, as the official pipeline). Fields are
whole papers: unbounded field size and no quote processing (the official reader has `use_quote_delim=False`; a
field that starts with `"` is text, not a quoted field). Line ends LF or CRLF. A malformed row is an error naming
`file:line`. Each document is cut to `max_length` UTF-8 bytes (the official `encode(s[:10000])[:4000]` is the same
cut: 10000 characters always hold more than 4000 bytes). Splits: the official files, `eval` serving as val.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.base import SPLITS, LRADataModule
from tasks.layout import DataSourceError, candidates, find_release_path
from tasks.sources import pack_bytes, path_stamp, source_error
from tasks.tokenizers import ByteTokenizer

RELATIVE_DIRS = ("tsv_data", "data/aan")  # official archive | OpenNLPLab/lra HF mirror
FILE_SPLITS = {"train": "train", "val": "eval", "test": "test"}
COLUMNS = ("label", "id1", "id2", "text1", "text2")
CHUNK_ROWS = 4096  # rows tokenized at once while streaming (bounded memory on the 8.5 GB train file)


@dataclass
class RetrievalConfig:
    name: str = "retrieval"
    max_length: int = 4000  # bytes kept per document (each tower)
    seq_len: int = 4096  # padded model length per tower
    vocab_size: int = ByteTokenizer.vocab_size
    num_classes: int = 2
    dual: bool = True
    file_prefix: str = "new_aan_pairs"


def _label(value: str, path: Path, line: int) -> int:
    try:
        number = float(value)
    except ValueError:
        raise DataSourceError(
            f"{path}:{line}: label {value[:40]!r} is not a number (expected 0/1 or 0.0/1.0)"
        ) from None
    if number not in (0.0, 1.0):
        raise DataSourceError(f"{path}:{line}: label {value!r} is neither 0 nor 1")
    return int(number)


def read_aan_tsv(path: Path, max_length: int, seq_len: int) -> dict[str, np.ndarray]:
    """Stream one AAN file into packed columns (bounded memory: `CHUNK_ROWS` rows of text at a time).

    Text is decoded with `surrogateescape`, so any byte survives the round trip and the ids are exactly the
    file's bytes (+1), as the official byte encoder sees them.
    """
    csv.field_size_limit(sys.maxsize)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    docs1: list[bytes] = []
    docs2: list[bytes] = []
    labels: list[int] = []

    def flush() -> None:
        if labels:
            ids1, len1 = pack_bytes(docs1, max_length, seq_len)
            ids2, len2 = pack_bytes(docs2, max_length, seq_len)
            parts.append((ids1, len1, ids2, len2, np.asarray(labels, dtype=np.int64)))
            docs1.clear()
            docs2.clear()
            labels.clear()

    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as fh:
        reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        for row in reader:
            if not row:
                continue
            line = reader.line_num
            if len(row) != len(COLUMNS):
                raise DataSourceError(
                    f"{path}:{line}: expected {len(COLUMNS)} tab-separated fields ({', '.join(COLUMNS)}), "
                    f"found {len(row)}"
                )
            labels.append(_label(row[0], path, line))
            docs1.append(row[3][:max_length].encode("utf-8", "surrogateescape")[:max_length])
            docs2.append(row[4][:max_length].encode("utf-8", "surrogateescape")[:max_length])
            if len(labels) >= CHUNK_ROWS:
                flush()
    flush()
    if not parts:
        raise DataSourceError(f"{path}: no rows")
    ids1, len1, ids2, len2, lab = (np.concatenate(cols) for cols in zip(*parts))
    return {"input_ids": ids1, "length": len1, "input_ids_2": ids2, "length_2": len2, "label": lab}


class RetrievalDataModule(LRADataModule):
    name = "retrieval"
    config = RetrievalConfig

    dual = True
    tokenizer_version = ByteTokenizer.version

    def __init__(self, cfg: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(cfg, *args, **kwargs)
        if self.max_length > self.seq_len:
            raise ValueError(f"task.max_length={self.max_length} exceeds task.seq_len={self.seq_len}")

    def files(self) -> dict[str, Path] | None:
        for relative in RELATIVE_DIRS:
            folder = find_release_path(self.data_dir, relative)
            if folder is None:
                continue
            files = {s: folder / f"{self.cfg['file_prefix']}.{FILE_SPLITS[s]}.tsv" for s in SPLITS}
            if all(p.is_file() for p in files.values()):
                return files
        return None

    def ensure_source(self) -> None:
        if self.files() is not None:
            return
        names = f"{self.cfg['file_prefix']}.{{train,eval,test}}.tsv"
        expected = [f"{p}/{names}" for rel in RELATIVE_DIRS for p in candidates(self.data_dir, rel)]
        d = Path(self.data_dir).expanduser()
        raise source_error(
            "retrieval (AAN)",
            expected,
            archive=(
                "https://storage.googleapis.com/long-range-arena/lra_release.gz (a gzipped tar, ~8 GB): "
                f"`tar xzf lra_release.gz -C {d}` gives lra_release/lra_release/tsv_data/"
            ),
            hf=(
                "the raw TSVs are mirrored in the dataset repo OpenNLPLab/lra: "
                f"`hf download OpenNLPLab/lra --repo-type dataset --include 'data/aan/*.tsv' --local-dir {d}` "
                "(gives data/aan/, accepted as is)"
            ),
            generator=None,
        )

    def cache_params(self) -> dict[str, Any]:
        files = self.files() or {}
        stamp = {s: path_stamp(p) for s, p in files.items()}
        return {"task": "retrieval", "tokenizer": self.tokenizer_version, "files": stamp, **self.cfg}

    def build_split(self, split: str) -> dict[str, np.ndarray]:
        files = self.files()
        if files is None:
            raise DataSourceError(f"AAN files vanished from {self.data_dir}")
        return read_aan_tsv(files[split], self.max_length, self.seq_len)

    def data_info(self) -> dict[str, Any]:
        info = super().data_info()
        files = self.files()
        info["text_length"] = self.max_length
        info["source"] = str(files["train"].parent) if files else None
        info["split"] = "official files: train / eval (used as val) / test; two towers of max_length bytes each"
        return info
