"""Image (LRA): CIFAR-10 in grayscale, one token per pixel (0..255, vocab 256), 32×32 = 1024 tokens, 10 classes.

Grayscale is TensorFlow's `tf.image.rgb_to_grayscale` followed by the cast the official pipeline does, bit for
bit: with `r, g, b = rgb.astype(f32) * (1/255)`, `(((r*0.2989 + g*0.5870) + b*0.1140) * 255.5).astype(uint8)` in
float32 (each product rounded, then the sums left to right; truncation). The sum is written as elementwise ops,
not a matrix product: BLAS sums in an order its CPU kernel picks (OpenBLAS's AVX-512 kernel gave 26 of the
16.7M RGB triples another token), elementwise float32 ops round the same on every machine.
PIL/torchvision grayscale differs (1 higher on about a quarter of the pixels), so it is not used.

Sources (`source: auto` takes the first found; or force `pickle|disk|hf`):
  1. `cifar-10-batches-py/` (the official `cifar-10-python.tar.gz`, unpacked under data_dir at any archive
     nesting): `data_batch_1..5` + `test_batch`, read with a restricted unpickler that only admits numpy
     arrays/dtypes and plain builtins — never `pickle.load` (a pickle can run any code);
  2. `<data_dir>/<disk_dir>` (default `cifar10`): a `datasets` `save_to_disk` DatasetDict (train/test; columns
     `img` (or `image`) and `label`);
  3. `datasets.load_dataset(hf_name)` (default `cifar10`, i.e. `uoft-cs/cifar10`): the hub when online, else the
     local HF cache.

Splits (`split`, stated in `data_info.split`):
  * `lra_original`: LRA's `train[:90%]` / `train[90%:]` / `test`, i.e. TFDS's record order (`tasks.tfds_order`).
    The TFDS `cifar10` builder (3.0.2, `tensorflow_datasets/image_classification/cifar.py` at
    tensorflow/datasets@0560e68) yields the training images of `data_batch_1..5.bin` with the integer key
    `index` = their position over the five batches in that order (its `id` feature is `train_{index:05d}`),
    the test images likewise; the split name (`train`, `test`) is the salt. The python release holds the same
    batches in the same order, so the key of pickle row j of `data_batch_b` is `10000·(b-1) + j`, and train =
    the records before `round(0.9·50000)` = 45,000 in ascending `md5("train" + str(key))`, val = the other 5,000
    (only 516 of them are among the last 5,000 of source order). Each split is served in that record order.
    With all 50,000 images the mapping is checked against published TFDS records (`KNOWN_FIRST_RECORDS`): the
    first 16 training records' labels and the first one's top-left pixels; a mismatch is an error, not a
    silently different split. It needs the pickle source: an HF copy's row order is the order its builder read
    the archive's members in, which nothing here can check against `data_batch_1..5`. `val_fraction` must be a
    whole percent.
  * `source_order` (default): train = the first 90% of the training images in source order (`data_batch_1..5`,
    or the rows of a disk/HF copy), val = the last `val_fraction` (0.1: 5,000), test = the 10,000 test images.
    Not LRA's split.

`pixel0_is_padding` (default false): every LRA encoder builds its padding mask as `inputs > 0`, so black pixels
were masked like padding in the official image runs (`transformer.py`: `src_padding_mask = inputs > 0`); set it
true to reproduce that quirk (the mask becomes `ids > 0`; `recipe/lra_original_image.yaml` does). It changes only
the mask, not the cached tokens.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tasks import tfds_order
from tasks.hub_task import HubOrArchiveTask
from tasks.layout import DataSourceError, candidates, find_release_path
from tasks.sources import (
    MissingSourceError,
    is_disk_dataset,
    load_disk_dataset,
    load_hub_dataset,
    path_stamp,
    plain,
)

PICKLE_DIR = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
SIDE = 32
TF_GRAY_WEIGHTS = np.array([0.2989, 0.5870, 0.1140], dtype=np.float32)
TOKENIZER_VERSION = "pixels-tfgray-v2"  # v1: the gray sum by BLAS (its order varied)


class ImageSource(str, Enum):
    auto = "auto"
    pickle = "pickle"
    disk = "disk"
    hf = "hf"


class ImageSplit(str, Enum):
    lra_original = "lra_original"  # TFDS record order: LRA's train[:90%] / train[90%:]
    source_order = "source_order"  # first 90% / last 10% of data_batch_1..5


# The first 16 records of TFDS `cifar10` train as read (ids and labels: Ganegedara, TensorFlow in Action, ch. 3;
# the first one's label and top-left pixels RGB: ray-project/ray `python/ray/data/read_api.py`, `from_tf`).
KNOWN_FIRST_RECORDS: dict[str, tuple[Any, ...]] = {
    "ids": (16399, 1680, 47917, 17307, 27051, 48736, 26263, 1456, 19135, 31598, 12970, 4223, 27152, 49635, 4093, 17537),
    "labels": (7, 8, 4, 4, 6, 5, 2, 9, 6, 6, 9, 9, 3, 0, 8, 7),
    "first_pixels": ((143, 96, 70), (141, 96, 72), (135, 93, 72)),
}
FULL_TRAIN = 50_000


@dataclass
class ImageConfig:
    name: str = "image"
    max_length: int = SIDE * SIDE
    seq_len: int = SIDE * SIDE
    vocab_size: int = 256
    num_classes: int = 10
    dual: bool = False
    source: ImageSource = ImageSource.auto
    disk_dir: str = "cifar10"
    hf_name: str = "cifar10"
    split: ImageSplit = ImageSplit.source_order  # lra_original: TFDS order (LRA's) | source_order
    val_fraction: float = 0.1  # 10% of train (5,000 images) is val, as `train[90%:]`
    pixel0_is_padding: bool = False  # LRA's `inputs > 0` mask quirk (black pixels masked)


# -- grayscale ------------------------------------------------------------------------------------------
def gray_sum(part: np.ndarray) -> np.ndarray:
    """`[n, 3]` float32 → `[n]` float32 `(r*w0 + g*w1) + b*w2`, every product and sum rounded to float32 in that
    order: TensorFlow's value on every triple, and the same on every CPU (no BLAS kernel picks the order)."""
    w0, w1, w2 = TF_GRAY_WEIGHTS
    return (part[:, 0] * w0 + part[:, 1] * w1) + part[:, 2] * w2


def tf_grayscale(rgb: np.ndarray, chunk: int = 8192) -> np.ndarray:
    """`[..., 3]` uint8 RGB → `[...]` uint8 gray, exactly as `tf.image.rgb_to_grayscale` + `convert_image_dtype`."""
    rgb = np.asarray(rgb)
    if rgb.dtype != np.uint8 or rgb.shape[-1] != 3:
        raise ValueError(f"expected uint8 RGB [..., 3], got {rgb.dtype} {rgb.shape}")
    flat = rgb.reshape(-1, 3)
    out = np.empty(flat.shape[0], dtype=np.uint8)
    scale, back = np.float32(1.0 / 255.0), np.float32(255.5)
    for start in range(0, flat.shape[0], chunk * SIDE * SIDE):
        part = flat[start : start + chunk * SIDE * SIDE].astype(np.float32) * scale
        out[start : start + len(part)] = (gray_sum(part) * back).astype(np.uint8)
    return out.reshape(rgb.shape[:-1])


def cifar_rows_to_rgb(data: np.ndarray) -> np.ndarray:
    """Official rows `[n, 3072]` (R plane, G plane, B plane, each 32×32 row-major) → `[n, 32, 32, 3]`."""
    return data.reshape(-1, 3, SIDE, SIDE).transpose(0, 2, 3, 1)


# -- the restricted unpickler ---------------------------------------------------------------------------
_NUMPY_GLOBALS = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("_codecs", "encode"),  # how protocol-2 pickles written by Python 3 spell `bytes`
}
_SAFE_BUILTINS = {
    "list",
    "dict",
    "tuple",
    "set",
    "frozenset",
    "bytes",
    "bytearray",
    "str",
    "int",
    "float",
    "bool",
    "complex",
}


class RestrictedUnpickler(pickle.Unpickler):
    """Admits numpy arrays/dtypes and plain builtin containers/scalars; refuses every other global."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _NUMPY_GLOBALS:
            if module.startswith("numpy.core") and hasattr(np, "_core"):
                module = "numpy._core" + module[len("numpy.core") :]
            return super().find_class(module, name)
        if module in ("builtins", "__builtin__") and name in _SAFE_BUILTINS:
            return super().find_class("builtins", name)
        raise pickle.UnpicklingError(
            f"refusing to unpickle the global {module}.{name}: only numpy arrays/dtypes and plain builtins are allowed"
        )


def restricted_load(path: Path) -> Any:
    """Unpickle `path` with `RestrictedUnpickler` (`encoding='bytes'`, as the CIFAR Python-2 pickles need)."""
    try:
        with open(path, "rb") as fh:
            return RestrictedUnpickler(fh, encoding="bytes").load()
    except pickle.UnpicklingError as err:
        raise DataSourceError(f"{path}: {err}") from None
    except Exception as err:  # truncated or foreign files
        raise DataSourceError(f"{path}: not a readable CIFAR-10 batch pickle ({type(err).__name__}: {err})") from None


def read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One official batch file → (rows `[n, 3072]` uint8, labels `[n]`)."""
    obj = restricted_load(path)
    if not isinstance(obj, dict):
        raise DataSourceError(f"{path}: expected a dict with 'data' and 'labels', got {type(obj).__name__}")
    batch = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}
    data, labels = batch.get("data"), batch.get("labels")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * SIDE * SIDE:
        shape = getattr(data, "shape", None)
        raise DataSourceError(f"{path}: 'data' must be a uint8 array [n, 3072], got {type(data).__name__} {shape}")
    labels = np.asarray(labels, dtype=np.int64) if labels is not None else None
    if labels is None or labels.shape != (data.shape[0],):
        raise DataSourceError(f"{path}: 'labels' must list one label per row of 'data' ({data.shape[0]})")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DataSourceError(f"{path}: labels outside 0..9")
    return data, labels


def check_tfds_keys(images: np.ndarray, labels: np.ndarray, where: str) -> None:
    """All 50,000 training images: the published TFDS records must sit at their keys (= pickle positions).

    Guards the one assumption `split: lra_original` rests on (the python batches are in the order of the binary
    ones TFDS read); smaller sets (test fixtures) are not CIFAR-10 and are not checked."""
    if len(labels) != FULL_TRAIN:
        return
    ids = np.asarray(KNOWN_FIRST_RECORDS["ids"])
    want_labels = list(KNOWN_FIRST_RECORDS["labels"])
    want_pixels = [list(p) for p in KNOWN_FIRST_RECORDS["first_pixels"]]
    got_labels, got_pixels = labels[ids].tolist(), images[ids[0], 0, :3].tolist()
    if got_labels != want_labels or got_pixels != want_pixels:
        raise DataSourceError(
            f"{where}: the images at positions {ids[:3].tolist()}… (TFDS keys of its first cifar10 train records) "
            f"have labels {got_labels} and top-left pixels {got_pixels}, not the published {want_labels} and "
            f"{want_pixels}: these batches are not data_batch_1..5 in the official order; use task.split=source_order"
        )


# -- the data module ------------------------------------------------------------------------------------
class ImageDataModule(HubOrArchiveTask):
    name = "image"
    config = ImageConfig
    source_title = "image (CIFAR-10)"
    original_archive = ("CIFAR-10", "cifar-10-python.tar.gz", "https://www.cs.toronto.edu/~kriz/cifar.html")

    tokenizer_version = TOKENIZER_VERSION

    def __init__(self, cfg: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(cfg, *args, **kwargs)
        self.cfg = {k: plain(v) for k, v in self.cfg.items()}
        if self.seq_len != SIDE * SIDE or self.max_length != SIDE * SIDE:
            raise ValueError(
                f"task.seq_len={self.seq_len}, task.max_length={self.max_length}: CIFAR-10 images are "
                f"{SIDE}x{SIDE} = {SIDE * SIDE} tokens; both must be {SIDE * SIDE}"
            )
        if not 0.0 < float(self.cfg["val_fraction"]) < 1.0:
            raise ValueError(f"task.val_fraction={self.cfg['val_fraction']}: expected a fraction in (0, 1)")
        valid = ", ".join(v.value for v in ImageSplit)
        if self.cfg["split"] not in {v.value for v in ImageSplit}:
            raise ValueError(f"task.split={self.cfg['split']!r}: expected one of {valid}")
        if self.tfds_split:
            tfds_order.whole_percent(self.cfg["val_fraction"], "task.val_fraction")
            if self.cfg["source"] in ("disk", "hf"):
                raise ValueError(
                    f"task.source={self.cfg['source']} with task.split=lra_original: TFDS keys CIFAR-10 images by "
                    "their position in data_batch_1..5, which only the python batches (cifar-10-batches-py) fix; "
                    "use task.source=pickle (or auto), or task.split=source_order"
                )
        self._gray: dict[str, tuple[np.ndarray, np.ndarray]] | None = None

    @property
    def tfds_split(self) -> bool:
        return self.cfg["split"] == ImageSplit.lra_original.value

    def pickle_path(self) -> Path | None:
        folder = find_release_path(self.data_dir, PICKLE_DIR)
        if folder is None or not all((folder / name).is_file() for name in (*TRAIN_BATCHES, TEST_BATCH)):
            return None
        return folder

    def resolve_source(self) -> tuple[str, str]:
        choice = self.cfg["source"]
        if choice in ("auto", "pickle") and (folder := self.pickle_path()) is not None:
            return "pickle", str(folder)
        if self.tfds_split:  # only the pickle batches give TFDS's keys
            return "pickle", ""
        if choice in ("auto", "disk") and is_disk_dataset(self.disk_path):
            return "disk", str(self.disk_path)
        if choice in ("auto", "hf"):
            return "hf", self.cfg["hf_name"]
        return choice, ""

    def local_layouts(self) -> list[str]:
        names = ",".join((*TRAIN_BATCHES, TEST_BATCH))
        return [
            f"{candidates(self.data_dir, PICKLE_DIR)[0]}/{{{names}}} (unpacked cifar-10-python.tar.gz)",
            f"{self.disk_path} (datasets save_to_disk folder with train/test)",
        ]

    def read_source(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Both official splits as gray tokens `[n, 1024]` uint8 + labels, in source order."""
        if self._gray is not None:
            return self._gray
        kind, where = self.resolve_source()
        try:
            if kind == "pickle" and not where:
                why = "task.split=lra_original reads only cifar-10-batches-py/ (TFDS's keys are its batch positions)"
                raise self.missing_error(why if self.tfds_split else f"task.source=pickle but no {PICKLE_DIR}/ found")
            if kind == "pickle":
                rgb = {}
                for split, names in (("train", TRAIN_BATCHES), ("test", (TEST_BATCH,))):
                    parts = [read_cifar_batch(Path(where) / name) for name in names]
                    rows = np.concatenate([p[0] for p in parts])
                    rgb[split] = (cifar_rows_to_rgb(rows), np.concatenate([p[1] for p in parts]))
                if self.tfds_split:
                    check_tfds_keys(*rgb["train"], where)
            elif kind == "disk":
                splits = load_disk_dataset(Path(where), ("train", "test"))
                rgb = {s: self._from_hf(ds, f"{where}[{s}]") for s, ds in splits.items()}
            elif kind == "hf":
                hub, why = load_hub_dataset(where, ("train", "test"))
                if hub is None:
                    raise self.missing_error(why)
                rgb = {s: self._from_hf(ds, f"hf:{where}[{s}]") for s, ds in hub.items()}
            else:
                raise self.missing_error(f"task.source={kind} but that source is not under {self.data_dir}")
        except MissingSourceError:
            raise
        except DataSourceError as err:
            raise self.missing_error(str(err)) from None
        self._gray = {s: (tf_grayscale(img).reshape(len(img), -1), lab) for s, (img, lab) in rgb.items()}
        return self._gray

    @staticmethod
    def _from_hf(ds: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
        image_col = next((c for c in ("img", "image") if c in ds.column_names), None)
        label_col = next((c for c in ("label", "labels") if c in ds.column_names), None)
        if image_col is None or label_col is None:
            raise DataSourceError(f"{where}: expected columns img (or image) and label; has {ds.column_names}")
        images = []
        for batch in ds.iter(batch_size=1000):
            for im in batch[image_col]:
                arr = np.asarray(im.convert("RGB") if hasattr(im, "convert") else im, dtype=np.uint8)
                if arr.shape != (SIDE, SIDE, 3):
                    raise DataSourceError(f"{where}: an image has shape {arr.shape}, expected ({SIDE}, {SIDE}, 3)")
                images.append(arr)
        labels = np.asarray(ds[label_col], dtype=np.int64)
        if not images:
            raise DataSourceError(f"{where}: no images")
        return np.stack(images), labels

    # -- caching + building ----------------------------------------------------------------------------
    def cache_params(self) -> dict[str, Any]:
        kind, where = self.resolve_source()
        if kind == "pickle" and where:
            stamp: Any = [path_stamp(Path(where) / name) for name in (*TRAIN_BATCHES, TEST_BATCH)]
        elif kind == "disk":
            stamp = path_stamp(Path(where), "**/*.arrow")
        else:
            stamp = where
        skip = ("pixel0_is_padding", "source", "disk_dir", "hf_name")  # the mask is made per batch, not cached
        keep = {k: v for k, v in self.cfg.items() if k not in skip}
        return {"task": "image", "tokenizer": self.tokenizer_version, "source": [kind, stamp], **keep}

    def train_boundary(self, n: int) -> int:
        return n - int(round(n * float(self.cfg["val_fraction"])))

    def split_rows(self, split: str, n_train: int, n_test: int) -> np.ndarray:
        """Source positions of one split's images, in the order they are served."""
        if not self.tfds_split:
            cut = self.train_boundary(n_train)
            return {"train": np.arange(cut), "val": np.arange(cut, n_train), "test": np.arange(n_test)}[split]
        if split == "test":
            return tfds_order.record_order(range(n_test), "test")
        order = tfds_order.record_order(range(n_train), "train")  # key = position over data_batch_1..5
        train_pct = 100 - tfds_order.whole_percent(self.cfg["val_fraction"], "task.val_fraction")
        (a, b), (c, d) = tfds_order.percent_slices(n_train, [train_pct])
        return order[a:b] if split == "train" else order[c:d]

    def build_split(self, split: str) -> dict[str, np.ndarray]:
        data = self.read_source()
        ids, labels = data["test" if split == "test" else "train"]
        rows = self.split_rows(split, len(data["train"][1]), len(data["test"][1]))
        ids, labels = ids[rows], labels[rows]
        lengths = np.full(len(labels), SIDE * SIDE, dtype=np.int32)
        return {"input_ids": np.ascontiguousarray(ids), "length": lengths, "label": labels}

    def prepare_data(self) -> None:
        super().prepare_data()
        self._gray = None

    def make_mask(self, ids: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        mask = super().make_mask(ids, length)
        return mask & (ids > 0) if self.cfg["pixel0_is_padding"] else mask

    def data_info(self) -> dict[str, Any]:
        info = super().data_info()
        kind, where = self.resolve_source()
        frac = float(self.cfg["val_fraction"])
        if self.tfds_split:
            pct = 100 - tfds_order.whole_percent(frac, "task.val_fraction")
            info["split"] = (
                f"lra_original: LRA's TFDS split, train = cifar10 train[:{pct}%], val = train[{pct}%:] in TFDS record "
                "order (ascending md5('train' + key), key = position over data_batch_1..5); test = CIFAR-10 test"
            )
        else:
            info["split"] = (
                f"source_order: train = the first {1 - frac:.0%} of CIFAR-10 train in source order, val = the last "
                f"{frac:.0%} (not LRA's TFDS-order train[{100 - round(frac * 100)}%:]); test = CIFAR-10 test"
            )
        info["source"] = f"{kind}:{where}"
        info["pixel0_is_padding"] = bool(self.cfg["pixel0_is_padding"])
        return info
