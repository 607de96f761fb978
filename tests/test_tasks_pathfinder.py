"""Pathfinder / Path-X: metadata as text or binary .npy, the missing trailing newline, zero-byte PNGs, both
archive nestings (the two pathfinder128 copies), the seeded split, generation when missing, the errors."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tasks.layout import DataSourceError
from tasks.pathfinder import PathfinderConfig, PathfinderDataModule, split_indices
from tasks.pathx import PathXConfig, PathXDataModule
from tasks.sources import MissingSourceError


def pixels(res: int, index: int) -> np.ndarray:
    img = np.random.default_rng(index).integers(0, 256, (res, res), dtype=np.uint8)
    img[0, :4] = 0  # some black pixels (the LRA mask quirk treats them as padding)
    return img


def write_pathfinder(
    root: Path,
    res: int = 32,
    difficulty_dir: str = "curv_contour_length_14",
    per_folder: int = 6,
    folders: int = 2,
    metadata: str = "text",
    trailing_newline: bool = True,
    empty: tuple[int, ...] = (),
    crlf: bool = False,
) -> Path:
    """`root/pathfinder{res}/{difficulty_dir}/{metadata/<k>.npy, imgs/<k>/sample_<i>.png}` with 11-field rows.

    Global image g = k·per_folder + i has label g % 2 and pixels `pixels(res, g)`; indices in `empty` are
    written as zero-byte PNGs. `metadata`: "text" (as the release) or "npy" (binary np.save, as the public
    generator); the last folder's text file has no trailing newline unless `trailing_newline`."""
    base = root / f"pathfinder{res}" / difficulty_dir
    for k in range(folders):
        (base / "imgs" / str(k)).mkdir(parents=True, exist_ok=True)
        (base / "metadata").mkdir(parents=True, exist_ok=True)
        rows = []
        for i in range(per_folder):
            g = k * per_folder + i
            path = base / "imgs" / str(k) / f"sample_{i}.png"
            if g in empty:
                path.write_bytes(b"")
            else:
                Image.fromarray(pixels(res, g), mode="L").save(path)
            rows.append([f"imgs/{k}", f"sample_{i}.png", str(i), str(g % 2), "1.0", "14", "4", "2", "0.5", "1", "1"])
        meta = base / "metadata" / f"{k}.npy"
        if metadata == "npy":
            with open(meta, "wb") as fh:
                np.save(fh, np.array(rows, dtype=str))
        else:
            end = "\r\n" if crlf else "\n"
            text = end.join(" ".join(r) for r in rows)
            last = k == folders - 1
            meta.write_text(text + ("" if last and not trailing_newline else end))
    return base


def make_dm(
    data_dir: Path, tmp_path: Path, cls: type = PathfinderDataModule, config: type = PathfinderConfig, **cfg
) -> PathfinderDataModule:
    return cls(config(**cfg), data_dir=str(data_dir), cache_dir=str(tmp_path / "cache"), batch_size=2)


def all_rows(dm: PathfinderDataModule) -> dict[bytes, int]:
    """Every cached example as {pixel bytes: label} over the three splits."""
    out = {}
    for split in ("train", "val", "test"):
        t = dm.splits[split].table
        for ids, label in zip(np.asarray(t["input_ids"]), np.asarray(t["label"])):
            out[ids.astype(np.uint8).tobytes()] = int(label)
    return out


@pytest.mark.parametrize(
    ("metadata", "trailing_newline", "crlf"),
    [("text", True, False), ("text", False, False), ("text", False, True), ("npy", True, False)],
)
def test_metadata_formats_and_empty_pngs(tmp_path: Path, metadata: str, trailing_newline: bool, crlf: bool) -> None:
    write_pathfinder(tmp_path / "data", metadata=metadata, trailing_newline=trailing_newline, crlf=crlf, empty=(3,))
    dm = make_dm(tmp_path / "data", tmp_path)
    dm.setup()
    rows = all_rows(dm)
    # 12 listed, one zero-byte PNG skipped; the last row of a file without a trailing newline is kept (g = 11)
    expected = {pixels(32, g).tobytes(): g % 2 for g in range(12) if g != 3}
    assert rows == expected
    info = dm.data_info()
    assert info["skipped_empty_pngs"] == 1 and info["skipped_empty_examples"][0].endswith("imgs/0/sample_3.png")
    assert info["difficulty"] == "curv_contour_length_14" and "seed 42" in info["split"]
    assert info["tokenizer_version"] == "pixels-raw-v1" and dm.vocab_size == 256


def test_seeded_split(tmp_path: Path) -> None:
    write_pathfinder(tmp_path / "data", per_folder=10, folders=2)
    dm = make_dm(tmp_path / "data", tmp_path)
    dm.setup()
    assert [len(dm.splits[s]) for s in ("train", "val", "test")] == [16, 2, 2]
    # the split is torch.randperm(n, Generator().manual_seed(42)) cut train/val/test, over metadata order
    perm = torch.randperm(20, generator=torch.Generator().manual_seed(42)).tolist()
    val = np.asarray(dm.splits["val"].table["input_ids"])
    assert [v.astype(np.uint8).tobytes() for v in val] == [pixels(32, g).tobytes() for g in perm[16:18]]
    parts = split_indices(20, 42, 0.1, 0.1)
    assert sorted(np.concatenate(list(parts.values())).tolist()) == list(range(20))
    assert not np.array_equal(split_indices(20, 7, 0.1, 0.1)["train"], parts["train"])
    assert make_dm(tmp_path / "data", tmp_path, split_seed=7).cache_path != dm.cache_path


def test_batches_and_pixel0_mask(tmp_path: Path) -> None:
    write_pathfinder(tmp_path / "data")
    dm = make_dm(tmp_path / "data", tmp_path, pixel0_is_padding=True)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == (2, 1024) and torch.equal(batch["mask"], batch["input_ids"] > 0)
    assert not batch["mask"].all()
    plain = make_dm(tmp_path / "data", tmp_path)
    plain.setup()
    assert plain.cache_path == dm.cache_path and next(iter(plain.val_dataloader()))["mask"].all()


@pytest.mark.parametrize("nesting", ["lra_release", "lra_release/lra_release"])
def test_pathx_either_nesting(tmp_path: Path, nesting: str) -> None:
    write_pathfinder(tmp_path / "data" / nesting, res=128, per_folder=5, folders=2)
    dm = make_dm(tmp_path / "data", tmp_path, PathXDataModule, PathXConfig)
    dm.setup()
    assert dm.name == "pathx" and dm.seq_len == 128 * 128
    assert sum(len(dm.splits[s]) for s in ("train", "val", "test")) == 10
    t = dm.splits["train"].table
    assert np.asarray(t["input_ids"]).shape[1] == 16384
    assert dm.data_info()["source"].endswith(f"{nesting}/pathfinder128/curv_contour_length_14")


def test_pathx_two_copies_reported_and_selectable(tmp_path: Path) -> None:
    write_pathfinder(tmp_path / "data" / "lra_release", res=128, per_folder=3, folders=1)  # the outer copy
    write_pathfinder(tmp_path / "data" / "lra_release" / "lra_release", res=128, per_folder=5, folders=2)
    auto = make_dm(tmp_path / "data", tmp_path, PathXDataModule, PathXConfig)
    info = auto.data_info()
    assert len(info["copies_found"]) == 2 and info["source"] == info["copies_found"][0]
    assert info["source"].endswith("data/lra_release/lra_release/pathfinder128/curv_contour_length_14")  # inner
    auto.setup()
    assert sum(len(auto.splits[s]) for s in ("train", "val", "test")) == 10
    outer = make_dm(tmp_path / "data", tmp_path, PathXDataModule, PathXConfig, folder="lra_release/pathfinder128")
    assert outer.root() == tmp_path / "data" / "lra_release" / "pathfinder128" / "curv_contour_length_14"
    assert outer.cache_path != auto.cache_path
    with pytest.raises(DataSourceError, match="too few"):
        outer.prepare_data()  # the outer copy (3 images) is really the one read


def test_difficulty_option(tmp_path: Path) -> None:
    write_pathfinder(tmp_path / "data", difficulty_dir="curv_contour_length_9", per_folder=10, folders=1)
    write_pathfinder(tmp_path / "data", difficulty_dir="curv_baseline", per_folder=5, folders=1)
    nine = make_dm(tmp_path / "data", tmp_path, difficulty=9, generate_if_missing=False)
    nine.setup()
    assert nine.data_info()["difficulty"] == "curv_contour_length_9"
    assert [len(nine.splits[s]) for s in ("train", "val", "test")] == [8, 1, 1]
    with pytest.raises(DataSourceError, match="too few"):
        split_indices(9, 0, 0.1, 0.1)
    base = make_dm(tmp_path / "data", tmp_path, difficulty="baseline", generate_if_missing=False)
    assert base.root().name == "curv_baseline"
    with pytest.raises(MissingSourceError, match="curv_contour_length_14"):
        make_dm(tmp_path / "data", tmp_path, generate_if_missing=False).prepare_data()
    hard = make_dm(tmp_path / "data", tmp_path, difficulty="hard", generate_if_missing=False)
    assert hard.cache_path == make_dm(tmp_path / "data", tmp_path, difficulty=14).cache_path  # one spelling
    with pytest.raises(ValueError, match="baseline, 9, 14"):
        make_dm(tmp_path / "data", tmp_path, difficulty="12")


def test_malformed_metadata_and_missing_png_name_file_and_line(tmp_path: Path) -> None:
    base = write_pathfinder(tmp_path / "data", folders=1)
    meta = base / "metadata" / "0.npy"
    lines = meta.read_text().splitlines()
    meta.write_text("\n".join([*lines[:2], "imgs/0 sample_1.png", *lines[2:]]) + "\n")
    with pytest.raises(DataSourceError, match=r"metadata/0.npy:3: expected 11 space-separated fields"):
        make_dm(tmp_path / "data", tmp_path).prepare_data()
    meta.write_text("\n".join([*lines, "imgs/0 sample_99.png 99 1 1.0 14 4 2 0.5 1 1"]) + "\n")
    with pytest.raises(DataSourceError, match=r"metadata/0.npy:7: image .*sample_99.png does not exist"):
        make_dm(tmp_path / "data", tmp_path).prepare_data()


def test_missing_without_generation_three_ways(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    dm = make_dm(tmp_path / "data", tmp_path, PathXDataModule, PathXConfig)
    assert dm.cfg["generate_if_missing"] is False  # Path-X never generates unless asked
    with pytest.raises(MissingSourceError) as info:
        dm.prepare_data()
    msg = str(info.value)
    for nest in ("", "lra_release/", "lra_release/lra_release/"):
        assert f"{tmp_path / 'data'}/{nest}pathfinder128/curv_contour_length_14/{{metadata" in msg
    assert "lra_release.gz" in msg and "meerkat-ml/pathfinder" in msg
    assert "python -m tasks.generate.pathfinder --out" in msg and "--resolution 128" in msg


def test_generate_if_missing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(DataSourceError):  # off by default: a typo'd data_dir never starts a 200k-image job
        make_dm(tmp_path / "data", tmp_path).prepare_data()
    assert not (tmp_path / "data").exists()
    dm = make_dm(tmp_path / "data", tmp_path, gen_num_images=20, gen_workers=1, generate_if_missing=True)
    dm.setup()
    said = capsys.readouterr().out  # what, where, and roughly how long
    assert "generating 20 images (32x32, contour length 14, seed 0)" in said and "roughly 1 min" in said
    assert str(tmp_path / "data" / "pathfinder32" / "curv_contour_length_14") in said
    assert (tmp_path / "data" / "pathfinder32" / "curv_contour_length_14" / "metadata").is_dir()
    assert sum(len(dm.splits[s]) for s in ("train", "val", "test")) == 20
    labels = np.concatenate([np.asarray(dm.splits[s].table["label"]) for s in ("train", "val", "test")])
    assert labels.sum() == 10  # the generator balances labels exactly
    assert dm.data_info()["source"].startswith("generated:")


def test_other_generator_knobs_are_an_error_never_a_regeneration(tmp_path: Path) -> None:
    """Changed generator knobs used to delete the set and regenerate it (or silently use it): now neither."""
    make_dm(tmp_path / "data", tmp_path, gen_num_images=30, gen_workers=1, generate_if_missing=True).prepare_data()
    root = tmp_path / "data" / "pathfinder32" / "curv_contour_length_14"
    before = sorted((p.name, p.stat().st_mtime_ns) for p in root.rglob("*"))
    for allowed in (True, False):
        dm = make_dm(tmp_path / "data", tmp_path, gen_num_images=20, gen_workers=1, generate_if_missing=allowed)
        assert dm.stale_generated(dm.root())
        with pytest.raises(DataSourceError, match=r"generated with other settings .*set data_dir= to a new or empty"):
            dm.prepare_data()
    assert sorted((p.name, p.stat().st_mtime_ns) for p in root.rglob("*")) == before  # not a file touched


def test_generation_only_into_an_absent_or_empty_dir(tmp_path: Path) -> None:
    target = tmp_path / "data" / "pathfinder32" / "curv_contour_length_14"
    (target / "imgs" / "0").mkdir(parents=True)
    (target / "imgs" / "0" / "sample_0.png").write_bytes(b"user's file")  # a partial copy: no metadata/
    dm = make_dm(tmp_path / "data", tmp_path, gen_num_images=10, gen_workers=1, generate_if_missing=True)
    with pytest.raises(DataSourceError, match="exists without metadata/"):
        dm.prepare_data()
    assert (target / "imgs" / "0" / "sample_0.png").read_bytes() == b"user's file"
    assert not (target / "metadata").exists()


def test_an_interrupted_generation_is_detected_not_used(tmp_path: Path) -> None:
    dm = make_dm(tmp_path / "data", tmp_path, gen_num_images=10, gen_workers=1, generate_if_missing=True)
    dm.prepare_data()
    (dm.root() / ".lra_bench_generating").write_text("")  # what a killed generation leaves behind
    with pytest.raises(DataSourceError, match="did not finish"):
        make_dm(tmp_path / "data", tmp_path, gen_num_images=10, gen_workers=1, generate_if_missing=True).prepare_data()


def tfds_rows(keys: dict[int, str], salt: str) -> list[int]:
    """Image indices g in TFDS record order, from the rule: ascending int(md5(salt + key), 16)."""
    return sorted(keys, key=lambda g: int(hashlib.md5(f"{salt}{keys[g]}".encode()).hexdigest(), 16))


def split_images(dm: PathfinderDataModule, res: int = 32) -> dict[str, list[int]]:
    """Each cached split as the list of fixture image indices g, in served order."""
    by_pixels = {pixels(res, g).tobytes(): g for g in range(64)}
    return {
        s: [by_pixels[row.astype(np.uint8).tobytes()] for row in np.asarray(dm.splits[s].table["input_ids"])]
        for s in ("train", "val", "test")
    }


@pytest.mark.parametrize(
    ("metadata", "trailing_newline", "bounds", "empty_at"),
    [("text", True, (12, 14), (0, 12)), ("text", False, (11, 13), (0, 1)), ("npy", True, (12, 14), (0, 12))],
)
def test_lra_original_split_is_tfds_order_sliced_before_dropping_empty_pngs(
    tmp_path: Path, metadata: str, trailing_newline: bool, bounds: tuple[int, int], empty_at: tuple[int, int]
) -> None:
    """15 rows (3 files × 5): hard[:80%] ends at 12, [80%:90%] at round(13.5) = 14; without the last file's final
    newline LRA's builder reads 14 rows (11, round(12.6) = 13). Two zero-byte PNGs (at record positions
    `empty_at`) are cut out after slicing; dropping them first would move the boundaries (13 rows: 10, 12; 12
    rows: 10, 11) and change the splits."""
    # the key LRA's builder gives row i (1-based line i + 1) of metadata/<k>.npy: "<f0>_<f1>_<line>"
    keys = {5 * k + i: f"imgs/{k}_sample_{i}.png_{i + 1}" for k in range(3) for i in range(5)}
    if not trailing_newline:
        del keys[14]  # split('\n')[:-1] drops a last line that has no newline
    order = tfds_rows(keys, "hard")
    empty = tuple(order[i] for i in empty_at)
    write_pathfinder(
        tmp_path / "data", per_folder=5, folders=3, metadata=metadata, trailing_newline=trailing_newline, empty=empty
    )
    dm = make_dm(tmp_path / "data", tmp_path, split="lra_original")
    dm.setup()
    a, b = bounds
    want = {"train": order[:a], "val": order[a:b], "test": order[b:]}
    assert split_images(dm) == {s: [g for g in rows if g not in empty] for s, rows in want.items()}
    info = dm.data_info()
    assert info["split"].startswith("lra_original: LRA's TFDS split hard[:80%] / hard[80%:90%] / hard[90%:]")
    assert ("1 rows LRA's builder never reads" in info["split"]) is (not trailing_newline)
    assert info["skipped_empty_pngs"] == 2


def test_lra_original_salt_is_the_difficulty_split_name(tmp_path: Path) -> None:
    write_pathfinder(tmp_path / "data", difficulty_dir="curv_contour_length_9", per_folder=10, folders=2)
    dm = make_dm(tmp_path / "data", tmp_path, difficulty=9, split="lra_original", generate_if_missing=False)
    dm.setup()
    keys = {10 * k + i: f"imgs/{k}_sample_{i}.png_{i + 1}" for k in range(2) for i in range(10)}
    order = tfds_rows(keys, "intermediate")
    assert split_images(dm) == {"train": order[:16], "val": order[16:18], "test": order[18:]}
    assert "intermediate[:80%]" in dm.data_info()["split"]
    seeded = make_dm(tmp_path / "data", tmp_path, difficulty=9, generate_if_missing=False)
    assert seeded.cache_path != dm.cache_path and seeded.data_info()["split"].startswith("seeded:")
    # split_seed plays no part in the TFDS split: same cache
    same = make_dm(tmp_path / "data", tmp_path, difficulty=9, split="lra_original", split_seed=7)
    assert same.cache_path == dm.cache_path


def test_pathx_lra_original(tmp_path: Path) -> None:
    write_pathfinder(tmp_path / "data", res=128, per_folder=5, folders=2)
    dm = make_dm(tmp_path / "data", tmp_path, PathXDataModule, PathXConfig, split="lra_original")
    dm.setup()
    keys = {5 * k + i: f"imgs/{k}_sample_{i}.png_{i + 1}" for k in range(2) for i in range(5)}
    order = tfds_rows(keys, "hard")
    assert split_images(dm, res=128) == {"train": order[:8], "val": order[8:9], "test": order[9:]}


def test_bad_split_values_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as err:
        make_dm(tmp_path, tmp_path, split="random")
    assert str(err.value) == "task.split='random': expected one of lra_original, seeded"
    with pytest.raises(ValueError, match=r"^task\.test_fraction=0\.055: the TFDS split slices whole percents"):
        make_dm(tmp_path, tmp_path, split="lra_original", test_fraction=0.055)


@pytest.mark.parametrize("task", ["pathfinder", "pathx"])
def test_lra_original_recipe_sets_split_and_pixel0_mask(task: str) -> None:
    from lra_bench.config.validate import validate
    from lra_bench.errors import ConfigError
    from tests.conftest import compose

    cfg = compose(["protocol=lra_original", f"task={task}"])
    assert cfg.task.split == "lra_original" and cfg.task.pixel0_is_padding is True
    assert compose(["protocol=skyformer", f"task={task}"]).task.split == "seeded"
    with pytest.raises(ConfigError) as err:
        validate(compose([f"task={task}", "task.split=random"]))
    assert str(err.value).startswith("task.split: Invalid value 'random', expected one of [lra_original, seeded]")
    assert "\n" not in str(err.value)
