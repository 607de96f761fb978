"""Image (CIFAR-10 gray): TF's exact grayscale, the official pickle folder (restricted unpickler), HF save_to_disk."""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from tasks.image import (
    KNOWN_FIRST_RECORDS,
    TEST_BATCH,
    TRAIN_BATCHES,
    ImageConfig,
    ImageDataModule,
    RestrictedUnpickler,
    check_tfds_keys,
    cifar_rows_to_rgb,
    read_cifar_batch,
    tf_grayscale,
)
from tasks.layout import DataSourceError
from tasks.sources import MissingSourceError

PER_BATCH = 4  # images per data_batch_i → 20 train (18 train + 2 val at val_fraction 0.1), 5 test
N_TEST = 5


def cifar_rows(n: int, seed: int) -> np.ndarray:
    """`[n, 3072]` uint8 in the official layout: R plane, G plane, B plane, each 32×32 row-major."""
    rows = np.random.default_rng(seed).integers(0, 256, (n, 3072), dtype=np.uint8)
    rows[0, :1024] = 0  # an image with a black red plane and …
    rows[0, 1024:2048] = 0
    rows[0, 2048:] = 0  # … all black: pixel 0 everywhere
    return rows


def write_cifar_pickles(root: Path, py2_style: bool = True, per_batch: int = PER_BATCH, n_test: int = N_TEST) -> Path:
    """`cifar-10-batches-py/` with data_batch_1..5 + test_batch + batches.meta, as the official archive.

    `py2_style`: bytes keys and pickle protocol 2 (what the Python-2 originals look like to Python 3)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    key = (lambda k: k.encode()) if py2_style else (lambda k: k)
    protocol = 2 if py2_style else pickle.DEFAULT_PROTOCOL
    names = [*TRAIN_BATCHES, TEST_BATCH]
    for i, name in enumerate(names):
        n = n_test if name == TEST_BATCH else per_batch
        batch = {
            key("batch_label"): f"{'testing' if name == TEST_BATCH else 'training'} batch {i + 1} of 5".encode(),
            key("labels"): [(i + j) % 10 for j in range(n)],
            key("data"): cifar_rows(n, seed=i),
            key("filenames"): [f"img_{i}_{j}.png".encode() for j in range(n)],
        }
        with open(folder / name, "wb") as fh:
            pickle.dump(batch, fh, protocol=protocol)
    meta = {
        key("label_names"): [c.encode() for c in "airplane automobile bird cat deer dog frog horse ship truck".split()],
        key("num_cases_per_batch"): 10000,
        key("num_vis"): 3072,
    }
    with open(folder / "batches.meta", "wb") as fh:
        pickle.dump(meta, fh, protocol=protocol)
    return folder


def write_cifar_disk(path: Path) -> Path:
    """An HF `save_to_disk` DatasetDict with the `cifar10` schema (img: Image, label: ClassLabel), same pixels."""
    from datasets import ClassLabel, Dataset, DatasetDict, Features
    from datasets import Image as HFImage
    from PIL import Image

    features = Features({"img": HFImage(), "label": ClassLabel(num_classes=10)})
    splits = {}
    for split, names in (("train", TRAIN_BATCHES), ("test", (TEST_BATCH,))):
        rows, labels = [], []
        for i, name in enumerate(names):
            n = N_TEST if name == TEST_BATCH else PER_BATCH
            idx = 5 if name == TEST_BATCH else i
            rows.append(cifar_rows(n, seed=idx))
            labels += [(idx + j) % 10 for j in range(n)]
        images = [Image.fromarray(im) for im in cifar_rows_to_rgb(np.concatenate(rows))]
        splits[split] = Dataset.from_dict({"img": images, "label": labels}, features=features)
    DatasetDict(splits).save_to_disk(str(path))
    return path


def make_dm(tmp_path: Path, **cfg) -> ImageDataModule:
    return ImageDataModule(
        ImageConfig(**cfg), data_dir=str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"), batch_size=4
    )


def test_tf_grayscale_matches_hand_computation() -> None:
    # gray = trunc((r·0.2989 + g·0.5870 + b·0.1140) / 255 · 255.5), worked out by hand:
    # (255,0,0): 0.2989·255.5 = 76.37 → 76;  (0,255,0): 149.97 → 149;  (0,0,255): 29.13 → 29;
    # (255,255,255): 0.9999·255.5 = 255.47 → 255;  (100,150,200): 140.74·255.5/255 = 141.02 → 141;
    # (0,1,0): 0.587·255.5/255 = 0.588 → 0 (PIL rounds: 1);  (10,20,30): 18.149·255.5/255 = 18.18 → 18.
    pixels = np.array(
        [[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 255], [100, 150, 200], [0, 1, 0], [10, 20, 30]],
        dtype=np.uint8,
    )
    assert tf_grayscale(pixels).tolist() == [76, 149, 29, 255, 141, 0, 18]
    # and it differs from PIL's rounding formula exactly where the reference notes say (never higher)
    rgb = np.random.default_rng(1).integers(0, 256, (4096, 3), dtype=np.uint8).astype(np.int64)
    pil = (rgb[:, 0] * 19595 + rgb[:, 1] * 38470 + rgb[:, 2] * 7471 + 0x8000) >> 16
    diff = pil - tf_grayscale(rgb.astype(np.uint8)).astype(np.int64)
    assert set(np.unique(diff)) <= {0, 1} and 0.15 < diff.mean() < 0.4


def test_cifar_rows_layout() -> None:
    rows = np.zeros((1, 3072), dtype=np.uint8)
    rows[0, 0], rows[0, 1024 + 1], rows[0, 2048 + 32] = 7, 8, 9  # R(0,0), G(0,1), B(1,0)
    rgb = cifar_rows_to_rgb(rows)
    assert rgb.shape == (1, 32, 32, 3) and rgb[0, 0, 0, 0] == 7 and rgb[0, 0, 1, 1] == 8 and rgb[0, 1, 0, 2] == 9


@pytest.mark.parametrize("py2_style", [True, False])
def test_pickle_folder_splits_and_tokens(tmp_path: Path, py2_style: bool) -> None:
    write_cifar_pickles(tmp_path / "data", py2_style=py2_style)
    dm = make_dm(tmp_path)
    dm.setup()
    assert [len(dm.splits[s]) for s in ("train", "val", "test")] == [18, 2, 5]
    train_rows = np.concatenate([cifar_rows(PER_BATCH, seed=i) for i in range(5)])
    expected = tf_grayscale(cifar_rows_to_rgb(train_rows)).reshape(20, 1024)
    got = {s: np.asarray(dm.splits[s].table["input_ids"]) for s in ("train", "val")}
    assert (got["train"] == expected[:18]).all() and (got["val"] == expected[18:]).all()  # first 90% / last 10%
    labels = np.asarray(dm.splits["val"].table["label"]).tolist()
    assert labels == [(4 + 2) % 10, (4 + 3) % 10]
    info = dm.data_info()
    assert "first 90%" in info["split"] and "last 10%" in info["split"] and info["source"].startswith("pickle:")
    assert dm.vocab_size == 256 and dm.seq_len == 1024


def test_save_to_disk_gives_same_tokens(tmp_path: Path) -> None:
    write_cifar_pickles(tmp_path / "a")
    write_cifar_disk(tmp_path / "b" / "cifar10")
    a = ImageDataModule(ImageConfig(), data_dir=str(tmp_path / "a"), cache_dir=str(tmp_path / "ca"))
    b = ImageDataModule(ImageConfig(), data_dir=str(tmp_path / "b"), cache_dir=str(tmp_path / "cb"))
    a.setup(), b.setup()
    assert b.data_info()["source"].startswith("disk:")
    for split in ("train", "val", "test"):
        assert (np.asarray(a.splits[split].table["input_ids"]) == np.asarray(b.splits[split].table["input_ids"])).all()
        assert (np.asarray(a.splits[split].table["label"]) == np.asarray(b.splits[split].table["label"])).all()


def test_pixel0_is_padding_changes_only_the_mask(tmp_path: Path) -> None:
    write_cifar_pickles(tmp_path / "data")
    plain, quirk = make_dm(tmp_path), make_dm(tmp_path, pixel0_is_padding=True)
    assert plain.cache_path == quirk.cache_path
    plain.setup(), quirk.setup()
    b0 = next(iter(plain.val_dataloader()))
    b1 = next(iter(quirk.val_dataloader()))
    assert b0["mask"].all()
    assert torch.equal(b1["mask"], b0["input_ids"] > 0)
    first = next(iter(quirk.train_dataloader()))
    assert first["mask"].shape == (4, 1024) and torch.equal(first["mask"], first["input_ids"] > 0)
    assert quirk.data_info()["pixel0_is_padding"] is True


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_restricted_unpickler_refuses_code(tmp_path: Path) -> None:
    folder = write_cifar_pickles(tmp_path / "data")
    marker = tmp_path / "pwned"
    with open(folder / "data_batch_3", "wb") as fh:
        pickle.dump({b"data": np.zeros((1, 3072), np.uint8), b"labels": [_Evil(marker)]}, fh, protocol=2)
    with pytest.raises(DataSourceError, match=r"data_batch_3: refusing to unpickle the global (posix|os|nt)\.system"):
        read_cifar_batch(folder / "data_batch_3")
    with pytest.raises(MissingSourceError, match="refusing to unpickle"):
        make_dm(tmp_path).prepare_data()
    assert not marker.exists()
    with pytest.raises(pickle.UnpicklingError, match="builtins.eval"):
        RestrictedUnpickler(__import__("io").BytesIO(b"cbuiltins\neval\n(S'1'\ntR.")).load()


def test_malformed_batch_names_the_file(tmp_path: Path) -> None:
    folder = write_cifar_pickles(tmp_path / "data")
    with open(folder / "test_batch", "wb") as fh:
        pickle.dump({"data": np.zeros((2, 100), np.uint8), "labels": [0, 1]}, fh)
    with pytest.raises(DataSourceError, match=r"test_batch: 'data' must be a uint8 array \[n, 3072\]"):
        read_cifar_batch(folder / "test_batch")


def test_missing_source_one_error_three_ways(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    with pytest.raises(MissingSourceError) as info:
        make_dm(tmp_path).prepare_data()
    msg = str(info.value)
    assert str(tmp_path / "data" / "cifar-10-batches-py") in msg and str(tmp_path / "data" / "cifar10") in msg
    assert "cifar-10-python.tar.gz" in msg and "load_dataset('cifar10')" in msg and "3. our generator: none" in msg


def test_seq_len_must_be_1024(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="1024"):
        make_dm(tmp_path, seq_len=64, max_length=64)


def tfds_positions(n: int, salt: str) -> list[int]:
    """TFDS record order written from the rule: positions sorted by int(md5(salt + str(position)), 16)."""
    return sorted(range(n), key=lambda i: int(hashlib.md5(f"{salt}{i}".encode()).hexdigest(), 16))


def test_lra_original_split_is_tfds_record_order(tmp_path: Path) -> None:
    """25 training images: 90% is 22.5, TFDS rounds it to 22 (source_order would keep 23); test in TFDS order."""
    write_cifar_pickles(tmp_path / "data", per_batch=5, n_test=7)
    dm = make_dm(tmp_path, split="lra_original")
    dm.setup()
    train_rows = np.concatenate([cifar_rows(5, seed=i) for i in range(5)])
    gray = tf_grayscale(cifar_rows_to_rgb(train_rows)).reshape(25, 1024)
    labels = np.asarray([(b + j) % 10 for b in range(5) for j in range(5)])
    order = tfds_positions(25, "train")
    for split, rows in (("train", order[:22]), ("val", order[22:])):
        assert (np.asarray(dm.splits[split].table["input_ids"]) == gray[rows]).all(), split
        assert np.asarray(dm.splits[split].table["label"]).tolist() == labels[rows].tolist(), split
    test_gray = tf_grayscale(cifar_rows_to_rgb(cifar_rows(7, seed=5))).reshape(7, 1024)
    assert (np.asarray(dm.splits["test"].table["input_ids"]) == test_gray[tfds_positions(7, "test")]).all()
    info = dm.data_info()
    assert info["split"].startswith("lra_original: LRA's TFDS split, train = cifar10 train[:90%], val = train[90%:]")
    plain = make_dm(tmp_path)
    assert plain.cache_path != dm.cache_path and plain.data_info()["split"].startswith("source_order:")
    plain.setup()
    assert len(plain.splits["val"]) == 2  # source_order: 25 - round(2.5) = 23 train


def test_lra_original_needs_the_pickle_batches(tmp_path: Path) -> None:
    write_cifar_disk(tmp_path / "data" / "cifar10")
    with pytest.raises(ValueError, match=r"^task\.source=disk with task\.split=lra_original: .*task\.source=pickle"):
        make_dm(tmp_path, split="lra_original", source="disk")
    with pytest.raises(MissingSourceError, match="task.split=lra_original reads only cifar-10-batches-py"):
        make_dm(tmp_path, split="lra_original").prepare_data()  # auto: the disk copy is not used


def test_bad_split_value_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as err:
        make_dm(tmp_path, split="random")
    assert str(err.value) == "task.split='random': expected one of lra_original, source_order"
    with pytest.raises(ValueError, match=r"^task\.val_fraction=0\.125: the TFDS split slices whole percents"):
        make_dm(tmp_path, split="lra_original", val_fraction=0.125)


def test_lra_original_recipe_sets_split_and_pixel0_mask() -> None:
    from lra_bench.config.validate import validate
    from lra_bench.errors import ConfigError
    from tests.conftest import compose

    cfg = compose(["protocol=lra_original", "task=image"])
    assert cfg.task.split == "lra_original" and cfg.task.pixel0_is_padding is True
    faithful = compose(["protocol=nystromformer", "task=image"]).task  # the reference's data (docs/fidelity.md)
    assert (faithful.split, faithful.pixel0_is_padding) == ("lra_original", True)
    with pytest.raises(ConfigError) as err:
        validate(compose(["task=image", "task.split=random"]))
    assert str(err.value).startswith("task.split: Invalid value 'random', expected one of [lra_original, source_order]")
    assert "\n" not in str(err.value)


def test_full_size_batches_are_checked_against_published_tfds_records() -> None:
    """With 50,000 images, pickle position k must hold TFDS's train_{k}: labels of the first 16 records, pixels."""
    ids = list(KNOWN_FIRST_RECORDS["ids"])
    images = np.zeros((50_000, 1, 3, 3), dtype=np.uint8)  # only the top-left 3 pixels are looked at
    labels = np.zeros(50_000, dtype=np.int64)
    labels[ids] = KNOWN_FIRST_RECORDS["labels"]
    images[ids[0], 0] = KNOWN_FIRST_RECORDS["first_pixels"]
    check_tfds_keys(images, labels, "fixture")  # in the official order: passes
    with pytest.raises(DataSourceError, match="not data_batch_1..5 in the official order"):
        check_tfds_keys(np.roll(images, 10_000, axis=0), np.roll(labels, 10_000), "fixture")  # batches rotated
    check_tfds_keys(images[:20], labels[:20], "fixture")  # not CIFAR-10-sized: nothing to check
