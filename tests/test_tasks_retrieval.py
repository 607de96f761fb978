"""Retrieval (AAN): the official TSV with its quirks (no header, 0.0/1.0 labels, quotes, CRLF, huge fields)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tasks.layout import DataSourceError
from tasks.retrieval import RetrievalConfig, RetrievalDataModule
from tasks.sources import MissingSourceError

LONG_PAPER = "Abstract: attention ∑ " * 300  # ~7000 bytes: longer than 4000

# (label as written, id1, id2, text1, text2): quotes that a quoting CSV reader would swallow, a field that
# starts with `"` right after a tab, multi-byte UTF-8, a paper longer than 4000 bytes.
ROWS = [
    ("1", "P05-1045", "W04-3250", '"Quoted title" opens this paper', 'second paper ends with a quote"'),
    ("0.0", "J93-2004", "P02-1040", "Ünïcödé paper — 中文", '"'),
    ("1.0", "C00-1011", "N03-1033", LONG_PAPER, "short"),
    ("0", "A00-1001", "A00-1002", 'He said "hi', 'and "bye" too'),
]


def write_aan(
    folder: Path, rows: list[tuple[str, ...]] = ROWS, crlf_split: str = "eval", trailing_newline: bool = True
) -> Path:
    """`new_aan_pairs.{train,eval,test}.tsv`: no header, 5 tab-separated columns, raw bytes (so CRLF stays)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "eval", "test"):
        end = "\r\n" if split == crlf_split else "\n"
        body = end.join("\t".join(r) for r in rows) + (end if trailing_newline else "")
        (folder / f"new_aan_pairs.{split}.tsv").write_bytes(body.encode("utf-8"))
    return folder


def make_dm(data_dir: Path, tmp_path: Path, **cfg) -> RetrievalDataModule:
    cfg.setdefault("max_length", 48)
    cfg.setdefault("seq_len", 64)
    return RetrievalDataModule(
        RetrievalConfig(**cfg), data_dir=str(data_dir), cache_dir=str(tmp_path / "cache"), batch_size=2
    )


def tokens(table, col: str, i: int) -> list[int]:
    n = int(table["length" if col == "input_ids" else "length_2"][i])
    row = np.asarray(table[col][i])
    assert not row[n:].any()
    return row[:n].tolist()


def ids_of(text: str, n: int) -> list[int]:
    return [b + 1 for b in text.encode("utf-8")[:n]]


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_rows_parse_exactly(tmp_path: Path, split: str) -> None:
    write_aan(tmp_path / "data" / "tsv_data")
    dm = make_dm(tmp_path / "data", tmp_path)
    dm.setup()
    table = dm.splits[split].table
    assert len(table) == len(ROWS)  # a quote-processing reader would merge rows 1-2 and 4
    assert np.asarray(table["label"]).tolist() == [1, 0, 1, 0]
    for i, (_, _, _, t1, t2) in enumerate(ROWS):
        assert tokens(table, "input_ids", i) == ids_of(t1, 48)
        assert tokens(table, "input_ids_2", i) == ids_of(t2, 48)  # no stray \r from CRLF files
    assert dm.data_info()["split"].startswith("official files: train / eval")


def test_default_4000_bytes_per_document(tmp_path: Path) -> None:
    write_aan(tmp_path / "data" / "tsv_data")
    dm = RetrievalDataModule(RetrievalConfig(), data_dir=str(tmp_path / "data"), cache_dir=str(tmp_path / "c"))
    dm.setup()
    table = dm.splits["train"].table
    assert int(table["length"][2]) == 4000 and tokens(table, "input_ids", 2) == ids_of(LONG_PAPER, 4000)
    assert dm.data_info()["text_length"] == 4000


def test_dual_batches(tmp_path: Path) -> None:
    write_aan(tmp_path / "data" / "tsv_data", trailing_newline=False)
    dm = make_dm(tmp_path / "data", tmp_path)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"input_ids", "mask", "label", "input_ids_2", "mask_2"}
    assert batch["input_ids"].shape == batch["input_ids_2"].shape == (2, 64)
    assert (batch["mask_2"].sum(1) == (batch["input_ids_2"] > 0).sum(1)).all()


@pytest.mark.parametrize("relative", ["lra_release/lra_release/tsv_data", "lra_release/tsv_data", "data/aan"])
def test_layouts(tmp_path: Path, relative: str) -> None:
    write_aan(tmp_path / "data" / relative)
    dm = make_dm(tmp_path / "data", tmp_path)
    assert dm.files() is not None and dm.data_info()["source"].endswith(relative)


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        (("1", "a", "b", "only four"), r"new_aan_pairs.test.tsv:3: expected 5 tab-separated fields"),
        (("yes", "a", "b", "x", "y"), r"new_aan_pairs.test.tsv:3: label 'yes' is not a number"),
        (("2", "a", "b", "x", "y"), r"new_aan_pairs.test.tsv:3: label '2' is neither 0 nor 1"),
    ],
)
def test_malformed_row_names_file_and_line(tmp_path: Path, bad_row: tuple[str, ...], message: str) -> None:
    folder = write_aan(tmp_path / "data" / "tsv_data")
    rows = [*ROWS[:2], bad_row, *ROWS[2:]]
    (folder / "new_aan_pairs.test.tsv").write_bytes(("\n".join("\t".join(r) for r in rows) + "\n").encode())
    with pytest.raises(DataSourceError, match=message):
        make_dm(tmp_path / "data", tmp_path).prepare_data()


def test_missing_files_one_error_three_ways(tmp_path: Path) -> None:
    folder = write_aan(tmp_path / "data" / "tsv_data")
    (folder / "new_aan_pairs.eval.tsv").unlink()
    with pytest.raises(MissingSourceError) as info:
        make_dm(tmp_path / "data", tmp_path).prepare_data()
    msg = str(info.value)
    assert f"{tmp_path / 'data' / 'tsv_data'}/new_aan_pairs.{{train,eval,test}}.tsv" in msg
    assert "lra_release.gz" in msg and "OpenNLPLab/lra" in msg and "3. our generator: none" in msg
