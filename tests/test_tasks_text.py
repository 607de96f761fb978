"""Text (IMDB, byte level): every source format with its quirks, splits, caching, the missing-source error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tasks.sources import MissingSourceError, pack_bytes
from tasks.text import TextConfig, TextDataModule

# Reviews with the quirks a loader must survive: multi-byte UTF-8, CRLF, HTML breaks, quotes, a very long one.
LONG_REVIEW = "Long review é. " * 400  # 6400 bytes: longer than 4000
REVIEWS = {
    "neg": ['Terrible film. <br /><br />"Avoid".', "Bad\r\nacting, worse plot", "Ennuyeux à mourir — 2/10", "Meh."],
    "pos": ["Great movie! 日本語 subtitles 👍", LONG_REVIEW, "Loved it\twith tabs", "A+"],
}


def write_aclimdb(
    root: Path, reviews: dict[str, list[str]] = REVIEWS, test_reviews: dict[str, list[str]] | None = None
) -> Path:
    """`root/aclImdb/{train,test}/{neg,pos}/<id>_<rating>.txt` as the official archive (ids deliberately not in
    lexicographic order: 2 sorts before 10). Written as raw bytes so CRLF survives."""
    base = root / "aclImdb"
    for split, data in (("train", reviews), ("test", test_reviews or reviews)):
        for cls, texts in data.items():
            folder = base / split / cls
            folder.mkdir(parents=True, exist_ok=True)
            ids = [10 * i + 2 if i % 2 else i + 2 for i in range(len(texts))]
            for idx, text in zip(ids, texts):
                rating = 2 if cls == "neg" else 9
                (folder / f"{idx}_{rating}.txt").write_bytes(text.encode("utf-8"))
    (base / "README").write_text("fixture\n")
    return base


def write_imdb_disk(path: Path, n_train: int = 6, n_test: int = 4) -> Path:
    """An HF `save_to_disk` DatasetDict with the `imdb` schema (text, ClassLabel neg/pos)."""
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

    features = Features({"text": Value("string"), "label": ClassLabel(names=["neg", "pos"])})

    def rows(n: int, tag: str) -> dict[str, list]:
        return {"text": [f"{tag} review {i} ✓" for i in range(n)], "label": [i % 2 for i in range(n)]}

    DatasetDict(
        {
            "train": Dataset.from_dict(rows(n_train, "train"), features=features),
            "test": Dataset.from_dict(rows(n_test, "test"), features=features),
            "unsupervised": Dataset.from_dict({"text": ["x"], "label": [0]}, features=features),
        }
    ).save_to_disk(str(path))
    return path


def make_dm(tmp_path: Path, **cfg) -> TextDataModule:
    cfg.setdefault("max_length", 64)
    cfg.setdefault("seq_len", 80)
    return TextDataModule(
        TextConfig(**cfg), data_dir=str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"), batch_size=4
    )


def ids_of(text: str, max_length: int) -> list[int]:
    return [b + 1 for b in text.encode("utf-8")[:max_length]]


def row_of(dm: TextDataModule, split: str, i: int) -> tuple[list[int], int, int]:
    table = dm.splits[split].table
    length = int(table["length"][i])
    ids = np.asarray(table["input_ids"][i])
    assert not ids[length:].any(), "padding must be 0"
    return ids[:length].tolist(), length, int(table["label"][i])


def test_aclimdb_bytes_order_and_quirks(tmp_path: Path) -> None:
    write_aclimdb(tmp_path / "data")
    dm = make_dm(tmp_path)
    dm.setup()
    assert [len(dm.splits[s]) for s in ("train", "val", "test")] == [8, 8, 8]
    # neg first (label 0), files in numeric id order: ids 2, 12, 4, 32 → 2, 4, 12, 32
    order = [2, 4, 12, 32]
    written = [10 * i + 2 if i % 2 else i + 2 for i in range(4)]
    expected_neg = [REVIEWS["neg"][written.index(k)] for k in order]
    for i, text in enumerate(expected_neg):
        ids, length, label = row_of(dm, "train", i)
        assert label == 0
        assert ids == ids_of(text.replace("\r\n", "\n"), 64)  # universal newlines, as the HF builder
    # multi-byte UTF-8: every byte is its own token (bytes + 1, vocab 257)
    texts_pos = [REVIEWS["pos"][written.index(k)] for k in order]
    i_jp = 4 + texts_pos.index(REVIEWS["pos"][0])
    ids, length, label = row_of(dm, "train", i_jp)
    assert label == 1 and ids == ids_of(REVIEWS["pos"][0], 64) and length == len(REVIEWS["pos"][0].encode())
    assert max(ids) <= 256 and min(ids) >= 1
    # the long review is cut at max_length bytes
    i_long = 4 + texts_pos.index(LONG_REVIEW)
    ids, length, _ = row_of(dm, "train", i_long)
    assert length == 64 and ids == ids_of(LONG_REVIEW, 64)
    info = dm.data_info()
    assert info["text_length"] == 64 and info["tokenizer_version"] == "bytes-v1"
    assert "val = IMDB test" in info["split"] and info["source"].startswith("raw:")


def test_default_length_4000_of_4096(tmp_path: Path) -> None:
    write_aclimdb(tmp_path / "data")
    dm = TextDataModule(TextConfig(), data_dir=str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"))
    dm.setup()
    lengths = np.asarray(dm.splits["test"].table["length"])
    assert dm.seq_len == 4096 and lengths.max() == 4000  # the 6400-byte review is cut at 4000
    batch = next(iter(dm.val_dataloader()))
    assert batch["input_ids"].shape[1] == 4096 and batch["mask"].sum(1).max() <= 4000


def test_save_to_disk_comes_first(tmp_path: Path) -> None:
    write_aclimdb(tmp_path / "data")
    write_imdb_disk(tmp_path / "data" / "imdb")
    dm = make_dm(tmp_path)
    dm.setup()
    assert [len(dm.splits[s]) for s in ("train", "val", "test")] == [6, 4, 4]
    ids, _, label = row_of(dm, "train", 3)
    assert ids == ids_of("train review 3 ✓", 64) and label == 1
    assert dm.data_info()["source"].startswith("disk:")
    forced = make_dm(tmp_path, source="raw")
    forced.setup()
    assert len(forced.splits["train"]) == 8


def test_holdout_split_is_seeded_and_disjoint(tmp_path: Path) -> None:
    many = {"neg": [f"bad {i}" for i in range(10)], "pos": [f"good {i}" for i in range(10)]}
    write_aclimdb(tmp_path / "data", many)
    dm = make_dm(tmp_path, val_split="holdout", holdout_fraction=0.25, holdout_seed=3)
    dm.setup()
    assert [len(dm.splits[s]) for s in ("train", "val", "test")] == [15, 5, 20]

    def texts(split: str) -> set[bytes]:
        t = dm.splits[split].table
        return {
            bytes((np.asarray(t["input_ids"][i])[: int(t["length"][i])] - 1).astype(np.uint8)) for i in range(len(t))
        }

    assert not texts("train") & texts("val")
    assert "holdout" in dm.data_info()["split"]
    again = make_dm(tmp_path, val_split="holdout", holdout_fraction=0.25, holdout_seed=3)
    assert again.cache_path == dm.cache_path  # same parameters → same cache
    other = make_dm(tmp_path, val_split="holdout", holdout_fraction=0.25, holdout_seed=4)
    assert other.cache_path != dm.cache_path


def test_cache_is_reused_and_keyed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_aclimdb(tmp_path / "data")
    make_dm(tmp_path).setup()
    dm = make_dm(tmp_path)
    monkeypatch.setattr(dm, "build_split", lambda split: (_ for _ in ()).throw(AssertionError("rebuilt")))
    monkeypatch.setattr(dm, "read_source", lambda: (_ for _ in ()).throw(AssertionError("source read")))
    dm.setup()  # served from the cache, without reading the source again (prepare_data runs on every run)
    assert make_dm(tmp_path, max_length=32).cache_path != dm.cache_path


def test_missing_source_one_error_three_ways(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    dm = make_dm(tmp_path)
    with pytest.raises(MissingSourceError) as info:
        dm.prepare_data()
    msg = str(info.value)
    assert str(tmp_path / "data" / "aclImdb") in msg and str(tmp_path / "data" / "imdb") in msg
    assert "1. official archive" in msg and "aclImdb_v1.tar.gz" in msg
    assert "2. Hugging Face" in msg and "load_dataset('imdb')" in msg
    assert "3. our generator: none" in msg
    assert "HF_DATASETS_OFFLINE" in msg or "HF_HUB_OFFLINE" in msg


def test_broken_review_names_the_file(tmp_path: Path) -> None:
    base = write_aclimdb(tmp_path / "data")
    bad = base / "train" / "pos" / "99_9.txt"
    bad.write_bytes(b"caf\xe9 latin-1")
    with pytest.raises(MissingSourceError, match="99_9.txt: not valid UTF-8") as info:
        make_dm(tmp_path).prepare_data()
    assert "Get it one of three ways" in str(info.value)


def test_pack_bytes_matches_reference() -> None:
    rng = np.random.default_rng(0)
    docs = [bytes(rng.integers(0, 256, int(n), dtype=np.uint8)) for n in rng.integers(0, 50, 37)] + [b""]
    ids, lengths = pack_bytes(docs, max_length=30, seq_len=32, chunk=5)
    for i, doc in enumerate(docs):
        cut = list(doc[:30])
        assert lengths[i] == len(cut)
        assert ids[i].tolist() == [b + 1 for b in cut] + [0] * (32 - len(cut))
    with pytest.raises(ValueError, match="max_length"):
        pack_bytes(docs, max_length=40, seq_len=32)


# Whitespace at both ends, as bytes.strip() sees it: ASCII space, \t \n \r \x0b \x0c go; NBSP (U+00A0) stays.
PADDED = {
    "neg": [" \t Bad\r\nfilm.\r\n", "\x0b\x0cdull\n\n"],
    "pos": ["\u00a0Great!\u00a0", "fine"],
}


def test_review_form_tfds_strips_the_bytes_as_tfds_imdb_reviews(tmp_path: Path) -> None:
    write_aclimdb(tmp_path / "data", PADDED)
    tfds = make_dm(tmp_path, review_form="tfds")
    hf = make_dm(tmp_path, review_form="hf")
    tfds.setup(), hf.setup()
    # files in numeric id order: written ids 2, 12 → rows "neg[0], neg[1], pos[0], pos[1]"
    texts = [*PADDED["neg"], *PADDED["pos"]]
    ascii_ws = b" \t\n\r\x0b\x0c"
    for i, text in enumerate(texts):
        raw = text.encode("utf-8")
        assert row_of(tfds, "train", i)[0] == [b + 1 for b in raw.strip(ascii_ws)]  # CRLF inside kept verbatim
        assert row_of(hf, "train", i)[0] == [b + 1 for b in raw.replace(b"\r\n", b"\n")]  # unstripped
    assert row_of(tfds, "train", 2)[0][:2] == [0xC2 + 1, 0xA0 + 1]  # NBSP is not ASCII whitespace: kept
    assert tfds.cache_path != hf.cache_path
    assert tfds.data_info()["review_form"] == "tfds" and hf.data_info()["review_form"] == "hf"


def test_review_form_tfds_on_a_disk_copy(tmp_path: Path) -> None:
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

    features = Features({"text": Value("string"), "label": ClassLabel(names=["neg", "pos"])})
    rows = {"text": ["  spaced out \n", "\tx"], "label": [0, 1]}
    DatasetDict({s: Dataset.from_dict(rows, features=features) for s in ("train", "test")}).save_to_disk(
        str(tmp_path / "data" / "imdb")
    )
    dm = make_dm(tmp_path, review_form="tfds")
    dm.setup()
    assert row_of(dm, "train", 0)[0] == ids_of("spaced out", 64) and row_of(dm, "test", 1)[0] == ids_of("x", 64)


def test_review_form_bad_value_and_the_lra_original_recipe(tmp_path: Path) -> None:
    from lra_bench.config.validate import validate
    from lra_bench.errors import ConfigError
    from tests.conftest import compose

    with pytest.raises(ValueError) as err:
        make_dm(tmp_path, review_form="strip")
    assert str(err.value) == "task.review_form='strip': expected one of hf, tfds"
    assert compose(["protocol=lra_original", "task=text"]).task.review_form == "tfds"
    assert compose(["protocol=nystromformer", "task=text"]).task.review_form == "hf"
    with pytest.raises(ConfigError) as err:
        validate(compose(["task=text", "task.review_form=strip"]))
    assert str(err.value).startswith("task.review_form: Invalid value 'strip', expected one of [hf, tfds]")
    assert "\n" not in str(err.value)
