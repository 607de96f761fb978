"""ListOps loader on fixtures written in the official format (header, CRLF/LF, malformed rows, nestings)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.layout import DataSourceError
from tasks.listops import ListOpsConfig, ListOpsDataModule, read_listops_tsv

ROWS = [("( ( ( [MAX 2 ) 9 ) ] )", 9), ("( ( ( [MIN 4 ) 1 ) ] )", 1), ("( ( ( [SM 7 ) 8 ) ] )", 5)]


def write(path: Path, rows=ROWS, newline: str = "\r\n", header: str = "Source\tTarget") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [header] + [f"{s}\t{t}" for s, t in rows]
    path.write_bytes((newline.join(lines) + newline).encode())
    return path


def layout(root: Path, nesting: str = "", newline: str = "\r\n") -> Path:
    folder = root / nesting / "listops-1000" if nesting else root / "listops-1000"
    for split in ("train", "val", "test"):
        write(folder / f"basic_{split}.tsv", newline=newline)
    return root


@pytest.mark.parametrize("newline", ["\r\n", "\n"])
def test_reads_crlf_and_lf(tmp_path: Path, newline: str) -> None:
    sources, labels = read_listops_tsv(write(tmp_path / "x.tsv", newline=newline))
    assert sources == [s for s, _ in ROWS] and labels.tolist() == [9, 1, 5]
    assert not any(s.endswith("\r") for s in sources)


def test_malformed_row_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.tsv", rows=[ROWS[0], ("( [MIN 1 ] )\textra", 3)])
    with pytest.raises(DataSourceError, match=r"bad\.tsv:3: expected 2 tab-separated fields"):
        read_listops_tsv(path)
    path = write(tmp_path / "bad2.tsv", rows=[ROWS[0], ("( [MIN 1 ] )", "x")])
    with pytest.raises(DataSourceError, match=r"bad2\.tsv:3: Target 'x' is not an integer"):
        read_listops_tsv(path)
    path = write(tmp_path / "bad3.tsv", header="source\ttarget")
    with pytest.raises(DataSourceError, match=r"bad3\.tsv:1: expected the header"):
        read_listops_tsv(path)


@pytest.mark.parametrize("nesting", ["", "lra_release", "lra_release/lra_release"])
def test_datamodule_reads_every_nesting(tmp_path: Path, nesting: str) -> None:
    root = layout(tmp_path / "data", nesting)
    cfg = ListOpsConfig(max_length=6, seq_len=8, generate_if_missing=False)
    dm = ListOpsDataModule(cfg, str(root), str(tmp_path / "cache"), batch_size=2)
    dm.setup()
    batch = next(iter(dm.val_dataloader()))
    assert batch["input_ids"].shape == (2, 8)
    assert batch["mask"][0].tolist() == [True] * 4 + [False] * 4  # [MAX 2 9 X
    assert batch["label"].tolist() == [9, 1]
    stats = dm.describe()
    assert stats["train"]["count"] == 3 and stats["train"]["length_max"] == 4


def test_cache_is_keyed_by_preprocessing(tmp_path: Path) -> None:
    root = layout(tmp_path / "data")
    a = ListOpsDataModule(ListOpsConfig(max_length=6, seq_len=8), str(root), str(tmp_path / "c"))
    b = ListOpsDataModule(ListOpsConfig(max_length=3, seq_len=8), str(root), str(tmp_path / "c"))
    assert a.cache_path != b.cache_path
    a.setup()
    assert a.cache_path.exists() and (a.cache_path / "params.json").exists()
    b.setup()
    assert b.splits["train"][0]["length"].tolist() == [3]


def test_missing_data_error_names_path_and_command(tmp_path: Path) -> None:
    cfg = ListOpsConfig(generate_if_missing=False)
    dm = ListOpsDataModule(cfg, str(tmp_path / "nowhere"), str(tmp_path / "cache"))
    with pytest.raises(DataSourceError) as err:
        dm.prepare_data()
    msg = str(err.value)
    assert str(tmp_path / "nowhere" / "listops-1000") in msg
    assert "python -m tasks.generate.listops --out" in msg


def test_generates_once_when_missing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = ListOpsConfig(
        max_length=64,
        seq_len=64,
        gen_num_train=12,
        gen_num_val=4,
        gen_num_test=4,
        gen_min_length=5,
        gen_max_length=64,
        gen_max_depth=4,
    )
    dm = ListOpsDataModule(cfg, str(tmp_path / "d"), str(tmp_path / "cache"))
    dm.setup()
    assert "generating" in capsys.readouterr().out
    assert (tmp_path / "d" / "listops-1000" / "basic_train.tsv").exists()
    assert len(dm.splits["train"]) == 12
    again = ListOpsDataModule(cfg, str(tmp_path / "d"), str(tmp_path / "cache"))
    again.setup()
    assert "generating" not in capsys.readouterr().out


def test_the_record_names_the_data_origin(tmp_path: Path) -> None:
    """Generated trees are recorded as generated (generator, its seed, a fingerprint of the bytes), the release's files
    as official: a record never calls generated data 'official files'."""
    import hashlib

    official = ListOpsDataModule(
        ListOpsConfig(generate_if_missing=False), str(layout(tmp_path / "o")), str(tmp_path / "c")
    )
    info = official.data_info()
    files = [tmp_path / "o" / "listops-1000" / f"basic_{s}.tsv" for s in ("train", "val", "test")]
    digest = hashlib.sha256(b"".join(hashlib.sha256(p.read_bytes()).hexdigest().encode() for p in files)).hexdigest()
    assert info["origin"] == {"kind": "official", "files": "lra_release listops-1000", "fingerprint": digest[:16]}
    assert info["split"].startswith("official files")

    cfg = ListOpsConfig(
        max_length=64, seq_len=64, gen_num_train=6, gen_num_val=3, gen_num_test=3, gen_min_length=5, gen_max_length=64
    )
    generated = ListOpsDataModule(cfg, str(tmp_path / "g"), str(tmp_path / "c"))
    generated.prepare_data()
    info = generated.data_info()
    assert info["origin"]["kind"] == "generated" and info["origin"]["generator"] == "tasks.generate.listops"
    assert info["origin"]["knobs"]["gen_seed"] == cfg.gen_seed
    assert info["split"].startswith("generated files") and "official" not in info["split"]
    assert len(info["origin"]["fingerprint"]) == 16 and info["origin"]["fingerprint"] != digest[:16]
