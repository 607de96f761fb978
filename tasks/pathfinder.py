"""Pathfinder (LRA): are the two dots joined by one dashed contour? 32×32 grayscale PNGs → 1024 pixel tokens.

Data: `pathfinder{resolution}/{difficulty dir}` under data_dir at any archive nesting (`''`, `lra_release/`,
`lra_release/lra_release/`; with `folder: auto` the deepest copy found wins — the inner one, which S4's setup
instructions use — and every copy found is reported, since the release holds two `pathfinder128` copies; or give
`folder:` explicitly, relative to data_dir or absolute).
`difficulty`: `14` (`curv_contour_length_14`, the LRA "hard" set; default), `9`, or `baseline` (contour 6).

Layout: `metadata/<k>.npy` + `imgs/<k>/sample_<i>.png`. Metadata rows have 11 space-separated fields
(`imgs/<k> sample_<i>.png <i> <label> ...`); the image is `<difficulty dir>/<f0>/<f1>`, the label `int(f3)`.
The release files are text despite `.npy`; the public generator writes binary `np.save` arrays: the magic
`\\x93NUMPY` is sniffed and such files are read with `np.load(allow_pickle=False)`. A file without a trailing
newline keeps its last row (in `split: seeded`; `lra_original` drops it, as LRA's builder did). Zero-byte PNGs
(the release has some) are skipped and counted (`data_info` and `python -m tasks.prepare` report them); a
missing PNG or a malformed row is an error naming `file:line`.
PNGs are decoded with Pillow in mode L; tokens are the raw pixel values 0..255 (vocab 256). `pixel0_is_padding`:
LRA's encoders mask `inputs > 0`, so black pixels were padding in its runs; the `lra_original` recipes set it.

Splits (`split`, stated in `data_info.split`):
  * `lra_original`: LRA's `hard[:80%]` / `hard[80%:90%]` / `hard[90%:]` (`easy`, `intermediate` for the other
    difficulties), reproduced from the metadata. LRA's Beam builder (google-research/long-range-arena@cd31e5c
    `lra_benchmarks/data/pathfinder.py`) reads each `metadata/*.npy` as text, `split('\\n')[:-1]`, and yields
    every row — zero-byte PNGs included — under the key `f"{f0}_{f1}_{r}"` (`imgs/0_sample_3.png_4`), r = the
    row's 1-based position in its file. TFDS orders the split by `md5(split name + key)` (`tasks.tfds_order`,
    salt `hard`/`intermediate`/`easy`) and slices whole percents of all n rows with `round(pct·n/100)`; LRA's
    input pipeline then drops the empty images from each slice (`tf.strings.length(image) > 0`). We do the
    same: the slices are cut over every row the builder would read, then zero-byte PNGs leave them, and each
    split is served in record order. The order depends on the keys only, so either archive copy and any file
    glob order give the same split. Rows the builder never reads — the last row of a text metadata file
    without a final newline — are in no split (counted in `data_info.split`). Binary `np.save` metadata (our
    generator's) could not be read by that builder; its rows are keyed as if they were text lines.
    `val_fraction`/`test_fraction` must be whole percents.
  * `seeded` (default): the non-empty images in metadata order (files sorted by their integer stem, rows in
    file order) split 80/10/10 with `torch.randperm(n, generator=torch.Generator().manual_seed(split_seed))`
    (default seed 42): first `n - 2⌊0.1 n⌋` train, next `⌊0.1 n⌋` val, rest test — the procedure of S4's
    `random_split(..., seed 42)`. Not LRA's split.

`generate_if_missing` (default false, also for Path-X: a typo'd `data_dir` must not start a 15-CPU-minute job): when
true and no copy exists, our seeded generator (`tasks.generate.pathfinder`) writes the full LRA-sized set
(`gen_num_images` 200,000, ~15 CPU-minutes at 32 px, spread over `gen_workers` processes) once, in the official
layout, after printing what it makes, where, and roughly how long; `data_info.source` says it was generated. It
writes only into an absent or empty dir, never over or instead of existing files (a set generated with other knobs
is an error, not regenerated), and a killed generation is detected, not used. A smaller `gen_num_images` is for
smoke tests only: numbers from it are not comparable to LRA's.
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from tasks import cache, tfds_order
from tasks.base import SPLITS, LRADataModule
from tasks.generate import pathfinder as generator
from tasks.layout import DataSourceError, candidates
from tasks.sources import MissingSourceError, plain, source_error

NPY_MAGIC = b"\x93NUMPY"
DIFFICULTIES = {
    "baseline": ("curv_baseline", 6),
    "6": ("curv_baseline", 6),
    "easy": ("curv_baseline", 6),
    "9": ("curv_contour_length_9", 9),
    "intermediate": ("curv_contour_length_9", 9),
    "14": ("curv_contour_length_14", 14),
    "hard": ("curv_contour_length_14", 14),
}
ALIASES = {"6": "baseline", "easy": "baseline", "intermediate": "9", "hard": "14"}
TFDS_SPLIT_NAMES = {"baseline": "easy", "9": "intermediate", "14": "hard"}  # LRA builder's split = hash salt
GENERATED_MARKER = "lra_bench_generated.json"
GENERATING_MARKER = ".lra_bench_generating"  # present while a generation runs (left behind if it is killed)
#: our generator's CPU time per image at 32 px (~15 CPU-minutes per 200,000; 128 px: ~1.7 CPU-hours, ≈ (r/32)^1.4)
SECONDS_PER_IMAGE_32PX = 0.0045


def generation_seconds_per_image(resolution: int) -> float:
    """Rough CPU seconds per generated image (our measurements at 32 and 128 px, power-law between them)."""
    return SECONDS_PER_IMAGE_32PX * (resolution / 32) ** 1.4


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{max(1, round(seconds / 60))} min"


TOKENIZER_VERSION = "pixels-raw-v1"
PARALLEL_MIN_IMAGES = 4096  # below this, decoding in-process beats starting workers
DECODE_CHUNK = 2048


class PathfinderSplit(str, Enum):
    lra_original = "lra_original"  # TFDS record order: LRA's hard[:80%] / [80%:90%] / [90%:]
    seeded = "seeded"  # torch.randperm(seed split_seed) 80/10/10 of the non-empty images


@dataclass
class PathfinderConfig:
    name: str = "pathfinder"
    resolution: int = 32
    difficulty: str = "14"  # baseline | 9 | 14 (also easy | intermediate | hard)
    max_length: int = 1024  # = resolution²
    seq_len: int = 1024
    vocab_size: int = 256
    num_classes: int = 2
    dual: bool = False
    folder: str = "auto"  # auto: first copy found at any nesting; or a path (relative to data_dir, or absolute)
    split: PathfinderSplit = PathfinderSplit.seeded  # lra_original: TFDS order (LRA's) | seeded
    split_seed: int = 42  # for split: seeded
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    pixel0_is_padding: bool = False  # LRA's `inputs > 0` mask quirk (black pixels masked)
    build_workers: int = 0  # processes decoding PNGs; 0 = all CPUs (used from 4096 images on)
    generate_if_missing: bool = False  # 200,000 images (~15 CPU-min): only when asked, never on a typo'd data_dir
    gen_num_images: int = 200_000
    gen_seed: int = 0
    gen_workers: int = 0  # 0 = all CPUs


# -- metadata -------------------------------------------------------------------------------------------
def _int_stem(path: Path) -> tuple[int, int, str]:
    return (0, int(path.stem), path.name) if re.fullmatch(r"\d+", path.stem) else (1, 0, path.name)


def read_metadata_rows(path: Path) -> tuple[list[tuple[int, list[str]]], int]:
    """(line number, fields) of one metadata file, text or binary `np.save` (sniffed by its magic), and how many
    leading lines LRA's TFDS builder reads of it (`split('\\n')[:-1]`: a last line without `\\n` is not read)."""
    data = path.read_bytes()
    if data.startswith(NPY_MAGIC):
        try:
            arr = np.load(path, allow_pickle=False)
        except Exception as err:  # object arrays need pickle: refused
            raise DataSourceError(f"{path}: binary metadata not readable without pickle ({err})") from None
        if arr.ndim == 2:
            return [(i + 1, [str(v) for v in row]) for i, row in enumerate(arr)], len(arr)
        if arr.ndim == 1:
            return [(i + 1, str(line).split()) for i, line in enumerate(arr) if str(line).strip()], len(arr)
        raise DataSourceError(f"{path}: binary metadata of shape {arr.shape}; expected rows of fields")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataSourceError(f"{path}: metadata is neither text nor a numpy file ({err})") from None
    rows = [(i + 1, line.split()) for i, line in enumerate(text.splitlines()) if line.strip()]
    return rows, text.count("\n")


@dataclass
class Listing:
    """The usable examples of one difficulty folder, in metadata order, and the TFDS key of every row.

    `keys[i]` is the key LRA's builder gave `paths[i]`, `empty_keys` those of the zero-byte PNGs; `unread` counts
    the rows that builder never reads (their key is None)."""

    paths: list[str]
    labels: np.ndarray
    skipped_empty: list[str]
    keys: list[str | None]
    empty_keys: list[str | None]

    @property
    def unread(self) -> int:
        return sum(k is None for k in (*self.keys, *self.empty_keys))


def list_examples(root: Path) -> Listing:
    meta_dir = root / "metadata"
    files = sorted(meta_dir.glob("*.npy"), key=_int_stem)
    if not files:
        raise DataSourceError(f"{meta_dir}: no metadata/*.npy files")
    paths: list[str] = []
    labels: list[int] = []
    skipped: list[str] = []
    keys: list[str | None] = []
    empty_keys: list[str | None] = []
    for meta in files:
        rows, builder_rows = read_metadata_rows(meta)
        for line, fields in rows:
            if len(fields) < 4:
                raise DataSourceError(
                    f"{meta}:{line}: expected 11 space-separated fields (imgs/<k> sample_<i>.png <i> <label> ...), "
                    f"found {len(fields)}"
                )
            try:
                label = int(float(fields[3]))
            except ValueError:
                raise DataSourceError(f"{meta}:{line}: label field {fields[3]!r} is not a number") from None
            if label not in (0, 1):
                raise DataSourceError(f"{meta}:{line}: label {label} is neither 0 nor 1")
            png = root / fields[0] / fields[1]
            try:
                size = png.stat().st_size
            except FileNotFoundError:
                raise DataSourceError(f"{meta}:{line}: image {png} does not exist") from None
            key = f"{fields[0]}_{fields[1]}_{line}" if line <= builder_rows else None  # LRA builder's example key
            if size == 0:
                skipped.append(str(png))
                empty_keys.append(key)
                continue
            paths.append(str(png))
            labels.append(label)
            keys.append(key)
    if not paths:
        raise DataSourceError(f"{root}: metadata lists no non-empty image")
    return Listing(paths, np.asarray(labels, dtype=np.int64), skipped, keys, empty_keys)


def decode_pngs(paths: list[str], resolution: int) -> np.ndarray:
    """PNGs → `[n, resolution²]` uint8 raw pixel values (Pillow, mode L)."""
    out = np.empty((len(paths), resolution * resolution), dtype=np.uint8)
    for i, path in enumerate(paths):
        try:
            with Image.open(path) as im:
                arr = np.asarray(im if im.mode == "L" else im.convert("L"))
        except Exception as err:  # any decoder failure names the file
            raise DataSourceError(f"{path}: not a readable PNG ({type(err).__name__}: {err})") from None
        if arr.shape != (resolution, resolution):
            raise DataSourceError(f"{path}: image is {arr.shape[1]}x{arr.shape[0]}, expected {resolution}x{resolution}")
        out[i] = arr.reshape(-1)
    return out


def _decode_job(args: tuple[list[str], int]) -> np.ndarray:
    return decode_pngs(*args)


def split_indices(n: int, seed: int, val_fraction: float, test_fraction: float) -> dict[str, np.ndarray]:
    """Seeded 80/10/10 (default) split of `n` examples, as `random_split(..., Generator().manual_seed(seed))`."""
    n_val, n_test = int(val_fraction * n), int(test_fraction * n)
    n_train = n - n_val - n_test
    if min(n_train, n_val, n_test) < 1:
        raise DataSourceError(
            f"{n} usable images are too few for a train/val/test split with val/test fractions "
            f"{val_fraction}/{test_fraction} (every split needs at least one image)"
        )
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy()
    return {"train": perm[:n_train], "val": perm[n_train : n_train + n_val], "test": perm[n_train + n_val :]}


def tfds_split_indices(listing: Listing, salt: str, val_pct: int, test_pct: int) -> dict[str, np.ndarray]:
    """LRA's `{salt}[:a%]` / `[a%:b%]` / `[b%:]` over every row its builder read, as indices into `listing.paths`.

    The slices are cut in TFDS record order over all rows (zero-byte PNGs too), then the empty ones leave each
    slice, as LRA's input pipeline filters them after slicing; each split stays in record order."""
    rows = [(k, i) for i, k in enumerate(listing.keys) if k is not None]
    rows += [(k, -1) for k in listing.empty_keys if k is not None]  # -1: a zero-byte PNG (dropped after slicing)
    order = tfds_order.record_order([k for k, _ in rows], salt)
    usable = np.asarray([rows[j][1] for j in order], dtype=np.int64)
    train_pct = 100 - val_pct - test_pct
    slices = tfds_order.percent_slices(len(rows), [train_pct, train_pct + val_pct])
    parts = {name: usable[a:b] for name, (a, b) in zip(SPLITS, slices)}
    out = {name: part[part >= 0] for name, part in parts.items()}
    if min(len(part) for part in out.values()) < 1:
        raise DataSourceError(
            f"{len(rows)} metadata rows are too few for {salt}[:{train_pct}%] / [{train_pct}%:{train_pct + val_pct}%]"
            f" / [{train_pct + val_pct}%:] (every split needs at least one non-empty image)"
        )
    return out


# -- the data module ------------------------------------------------------------------------------------
class PathfinderDataModule(LRADataModule):
    name = "pathfinder"
    config = PathfinderConfig

    tokenizer_version = TOKENIZER_VERSION

    def __init__(self, cfg: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(cfg, *args, **kwargs)
        difficulty = str(self.cfg["difficulty"]).strip().lower()
        if difficulty not in DIFFICULTIES:
            raise ValueError(
                f"task.difficulty={difficulty!r}: expected one of baseline, 9, 14 (or easy, intermediate, hard)"
            )
        self.cfg["difficulty"] = ALIASES.get(difficulty, difficulty)  # one spelling → one cache key
        self.cfg["split"] = plain(self.cfg["split"])
        if self.cfg["split"] not in {v.value for v in PathfinderSplit}:
            valid = ", ".join(v.value for v in PathfinderSplit)
            raise ValueError(f"task.split={self.cfg['split']!r}: expected one of {valid}")
        if self.tfds_split:
            self.tfds_percents()  # whole percents, or a one-line error now
        res = int(self.cfg["resolution"])
        if self.seq_len != res * res or self.max_length != res * res:
            raise ValueError(
                f"task.seq_len={self.seq_len}, task.max_length={self.max_length}: resolution {res} gives "
                f"{res}x{res} = {res * res} tokens; set both to {res * res}"
            )
        self._listing: Listing | None = None
        self._split_rows: dict[str, np.ndarray] | None = None

    # -- where the data is ---------------------------------------------------------------------------
    @property
    def tfds_split(self) -> bool:
        return self.cfg["split"] == PathfinderSplit.lra_original.value

    def tfds_percents(self) -> tuple[int, int]:
        """(val, test) as the whole percents of LRA's slices: 0.1, 0.1 → `[80%:90%]`, `[90%:]`."""
        val = tfds_order.whole_percent(self.cfg["val_fraction"], "task.val_fraction")
        test = tfds_order.whole_percent(self.cfg["test_fraction"], "task.test_fraction")
        if val + test >= 100:
            raise ValueError(f"task.val_fraction + task.test_fraction = {val + test}%: leaves no training split")
        return val, test

    @property
    def tfds_split_name(self) -> str:
        """The LRA builder's split for this difficulty (`hard` for contour 14), TFDS's hash salt."""
        return TFDS_SPLIT_NAMES[self.cfg["difficulty"]]

    @property
    def resolution(self) -> int:
        return int(self.cfg["resolution"])

    @property
    def difficulty_dir(self) -> str:
        return DIFFICULTIES[self.cfg["difficulty"]][0]

    @property
    def contour_length(self) -> int:
        return DIFFICULTIES[self.cfg["difficulty"]][1]

    @property
    def relative(self) -> str:
        return f"pathfinder{self.resolution}/{self.difficulty_dir}"

    def copies(self) -> list[Path]:
        """Every folder that holds this set: the explicit `folder`, or each archive nesting that has one."""
        if self.cfg["folder"] != "auto":
            path = Path(self.cfg["folder"]).expanduser()
            path = path if path.is_absolute() else Path(self.data_dir).expanduser() / path
            if path.name != self.difficulty_dir and (path / self.difficulty_dir).is_dir():
                path = path / self.difficulty_dir
            return [path] if (path / "metadata").is_dir() else []
        # deepest first: the inner lra_release/lra_release copy is the one S4's setup instructions use
        return [p for p in reversed(candidates(self.data_dir, self.relative)) if (p / "metadata").is_dir()]

    def root(self) -> Path | None:
        found = self.copies()
        return found[0] if found else None

    def generate_command(self) -> str:
        return (
            f"python -m tasks.generate.pathfinder --out {Path(self.data_dir).expanduser()} --resolution "
            f"{self.resolution} --contour-length {self.contour_length} --num-images {self.cfg['gen_num_images']} "
            f"--workers {os.cpu_count() or 1}"
        )

    def missing_error(self, problem: str | None = None) -> MissingSourceError:
        d = Path(self.data_dir).expanduser()
        expected = (
            [str(Path(self.cfg["folder"]))]
            if self.cfg["folder"] != "auto"
            else [str(p) for p in candidates(self.data_dir, self.relative)]
        )
        return source_error(
            f"{self.name} ({self.relative})",
            [f"{p}/{{metadata/<k>.npy, imgs/<k>/sample_<i>.png}}" for p in expected],
            archive=(
                "https://storage.googleapis.com/long-range-arena/lra_release.gz (a gzipped tar, ~8 GB): "
                f"`tar xzf lra_release.gz -C {d}` gives lra_release/lra_release/pathfinder{self.resolution}/"
            ),
            hf="no Hugging Face mirror holds the images (meerkat-ml/pathfinder has only paths and labels)",
            generator=f"`{self.generate_command()}`, or set task.generate_if_missing=true",
            problem=problem,
        )

    def generator_knobs(self) -> dict[str, Any]:
        return {
            "generator": "tasks.generate.pathfinder",
            "num_images": int(self.cfg["gen_num_images"]),
            "seed": int(self.cfg["gen_seed"]),
            "resolution": self.resolution,
            "contour_length": self.contour_length,
        }

    def stale_generated(self, root: Path) -> bool:
        """A set we generated earlier with other generator knobs (official data carries no marker)."""
        marker = root / GENERATED_MARKER
        return marker.exists() and json.loads(marker.read_text()) != self.generator_knobs()

    def ensure_source(self) -> None:
        """Generate when missing (and allowed); list and check the images only when the cache must be built."""
        root = self.root()
        if root is not None and (root / GENERATING_MARKER).exists():
            raise DataSourceError(
                f"{root}: a generation into it did not finish (interrupted?); delete {root} and run again"
            )
        if root is not None and self.stale_generated(root):  # never deleted or regenerated over
            raise DataSourceError(
                f"{root} holds images generated with other settings ({GENERATED_MARKER}); it is not regenerated "
                "over: set data_dir= to a new or empty dir to generate these, or set the task.gen_* knobs back to "
                "use it"
            )
        if self.root() is None:
            if self.cfg["folder"] != "auto":
                raise self.missing_error(f"task.folder={self.cfg['folder']} has no metadata/ folder")
            if not self.cfg["generate_if_missing"]:
                raise self.missing_error()
            self.generate()
        if cache.exists(self.cache_path, SPLITS):
            return
        try:
            self.listing()
        except MissingSourceError:
            raise
        except DataSourceError as err:
            raise self.missing_error(str(err)) from None

    def generate(self) -> Path:
        c = self.cfg
        workers = int(c["gen_workers"]) or (os.cpu_count() or 1)
        target = Path(self.data_dir).expanduser() / self.relative
        if target.exists() and any(target.iterdir()):
            raise DataSourceError(
                f"{target} exists without metadata/ (a partial copy?); images are generated only into an absent or "
                "empty dir: complete the copy, or set data_dir= to another dir"
            )
        n = int(c["gen_num_images"])
        seconds = n * generation_seconds_per_image(self.resolution) / workers
        print(
            f"[{self.name}] generating {n} images ({self.resolution}x{self.resolution}, contour length "
            f"{self.contour_length}, seed {c['gen_seed']}) into {target} with {workers} processes: roughly "
            f"{_duration(seconds)} — once; later runs reuse them",
            flush=True,
        )
        target.mkdir(parents=True, exist_ok=True)
        (target / GENERATING_MARKER).write_text("generation in progress\n")  # removed only when complete
        root = generator.generate(
            Path(self.data_dir).expanduser(),
            resolution=self.resolution,
            contour_length=self.contour_length,
            num_images=n,
            seed=int(c["gen_seed"]),
            workers=workers,
        )
        (Path(root) / GENERATED_MARKER).write_text(json.dumps(self.generator_knobs(), indent=2) + "\n")
        (Path(root) / GENERATING_MARKER).unlink()
        return Path(root)

    def listing(self) -> Listing:
        if self._listing is None:
            root = self.root()
            if root is None:
                raise self.missing_error()
            self._listing = list_examples(root)
        return self._listing

    # -- caching + building ----------------------------------------------------------------------------
    def cache_params(self) -> dict[str, Any]:
        root = self.root()
        stamp: Any = None
        if root is not None:
            metas = sorted((root / "metadata").glob("*.npy"))
            stamp = [
                str(root.resolve()),
                len(metas),
                sum(m.stat().st_size for m in metas),
                max((m.stat().st_mtime_ns for m in metas), default=0),
            ]
        skip = {"pixel0_is_padding", "build_workers", "folder", "generate_if_missing"}
        if self.tfds_split:
            skip.add("split_seed")
        keep = {k: v for k, v in self.cfg.items() if k not in skip and not k.startswith("gen_")}
        return {"task": self.name, "tokenizer": self.tokenizer_version, "source": stamp, **keep}

    def decode(self, paths: list[str]) -> np.ndarray:
        workers = int(self.cfg["build_workers"]) or (os.cpu_count() or 1)
        if workers <= 1 or len(paths) < PARALLEL_MIN_IMAGES:
            return decode_pngs(paths, self.resolution)
        jobs = [(paths[i : i + DECODE_CHUNK], self.resolution) for i in range(0, len(paths), DECODE_CHUNK)]
        with mp.get_context().Pool(min(workers, math.ceil(len(paths) / DECODE_CHUNK))) as pool:
            return np.concatenate(pool.map(_decode_job, jobs, chunksize=1))

    def split_rows(self) -> dict[str, np.ndarray]:
        """Indices into the listing of each split (computed once: the TFDS order hashes every row)."""
        if self._split_rows is None:
            listing, c = self.listing(), self.cfg
            if self.tfds_split:
                self._split_rows = tfds_split_indices(listing, self.tfds_split_name, *self.tfds_percents())
            else:
                self._split_rows = split_indices(
                    len(listing.labels), int(c["split_seed"]), float(c["val_fraction"]), float(c["test_fraction"])
                )
        return self._split_rows

    def build_split(self, split: str) -> dict[str, np.ndarray]:
        listing = self.listing()
        rows = self.split_rows()[split]
        ids = self.decode([listing.paths[i] for i in rows])
        lengths = np.full(len(rows), self.seq_len, dtype=np.int32)
        return {"input_ids": ids, "length": lengths, "label": listing.labels[rows]}

    def make_mask(self, ids: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        mask = super().make_mask(ids, length)
        return mask & (ids > 0) if self.cfg["pixel0_is_padding"] else mask

    def split_text(self, root: Path | None) -> str:
        c = self.cfg
        if not self.tfds_split:
            return (
                f"seeded: {1 - c['val_fraction'] - c['test_fraction']:.0%}/{c['val_fraction']:.0%}/"
                f"{c['test_fraction']:.0%} random split of the non-empty images in metadata order (torch.randperm, "
                f"seed {c['split_seed']}; not LRA's TFDS split)"
            )
        val, test = self.tfds_percents()
        a, b, name = 100 - val - test, 100 - test, self.tfds_split_name
        unread = ""
        if root is not None:
            try:
                n = self.listing().unread
                unread = f"; {n} rows LRA's builder never reads (no final newline) are left out" if n else ""
            except DataSourceError:
                pass
        return (
            f"lra_original: LRA's TFDS split {name}[:{a}%] / {name}[{a}%:{b}%] / {name}[{b}%:] in TFDS record order "
            f"(ascending md5('{name}' + '<f0>_<f1>_<row>')), zero-byte PNGs then dropped from each slice{unread}"
        )

    def data_info(self) -> dict[str, Any]:
        info = super().data_info()
        copies = self.copies()
        root = copies[0] if copies else None
        generated = root is not None and (root / GENERATED_MARKER).exists()
        c = self.cfg
        info["split"] = self.split_text(root)
        info["source"] = (f"generated:{root}" if generated else str(root)) if root else None
        info["difficulty"] = self.difficulty_dir
        info["resolution"] = self.resolution
        info["copies_found"] = [str(p) for p in copies]
        info["pixel0_is_padding"] = bool(c["pixel0_is_padding"])
        skipped = None
        if root is not None:
            try:
                skipped = self.listing().skipped_empty
            except DataSourceError:
                skipped = None
        info["skipped_empty_pngs"] = len(skipped) if skipped is not None else None
        info["skipped_empty_examples"] = skipped[:10] if skipped else []
        return info
