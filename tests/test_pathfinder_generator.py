"""Tests of the Pathfinder generator (``tasks.generate.pathfinder``).

Why these checks: a separate loader reads these files by path, so the official layout and the 11-field
metadata must be exact; the label must really mean "both markers on one contour", which we check by flood
fill on the target-path masks; and the data must be reproducible regardless of the worker count.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage

from tasks.generate import pathfinder as pf

SEED = 3
N_IMAGES = 300
PER_FOLDER = 128  # 300 images -> folders 0, 1, 2 (128 + 128 + 44)
EIGHT = np.ones((3, 3), dtype=bool)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One shared 32x32, contour-length-14 dataset with masks (the expensive part of this module)."""
    out = tmp_path_factory.mktemp("pathfinder")
    return pf.generate(out, 32, 14, N_IMAGES, seed=SEED, workers=1, images_per_folder=PER_FOLDER, write_masks=True)


def _all_rows(root: Path) -> list[list[str]]:
    rows = []
    for path in sorted((root / "metadata").glob("*.npy"), key=lambda p: int(p.stem)):
        rows += pf.read_metadata(path)
    return rows


def _files(root: Path, sub: str) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / sub).rglob("*.png"))}


def _connected(mask: np.ndarray) -> bool:
    """Whether the two marker centres lie in one 8-connected component of the target paths."""
    ys, xs = np.nonzero(mask & 4)
    assert len(ys) == 2, "expected exactly two marker centres"
    components, _ = ndimage.label(mask > 0, structure=EIGHT)
    return components[ys[0], xs[0]] == components[ys[1], xs[1]]


def test_official_layout(dataset: Path) -> None:
    assert dataset.parts[-2:] == ("pathfinder32", "curv_contour_length_14")
    assert sorted(p.name for p in (dataset / "metadata").iterdir()) == ["0.npy", "1.npy", "2.npy"]
    for k, count in enumerate([128, 128, 44]):
        names = {p.name for p in (dataset / "imgs" / str(k)).iterdir()}
        assert names == {f"sample_{i}.png" for i in range(count)}
        assert {p.name for p in (dataset / "masks" / str(k)).iterdir()} == names


def test_text_metadata(dataset: Path) -> None:
    text = (dataset / "metadata" / "1.npy").read_text()
    assert text.endswith("\n") and not text.startswith("\x93NUMPY")
    rows = _all_rows(dataset)
    assert len(rows) == N_IMAGES
    for g, row in enumerate(rows):
        k, i = divmod(g, PER_FOLDER)
        assert len(row) == 11
        assert row[:3] == [f"imgs/{k}", f"sample_{i}.png", str(i)]
        assert row[3] in ("0", "1")
        assert row[4:] == ["1.0", "14", "4", "2", "0.5", "1", "1"]
        assert (dataset / row[0] / row[1]).is_file()


def test_labels_balanced(dataset: Path) -> None:
    labels = np.array([int(row[3]) for row in _all_rows(dataset)])
    assert abs(labels.mean() - 0.5) <= 0.03
    pairs = labels.reshape(-1, 2)
    assert (pairs.sum(axis=1) == 1).all()  # balanced within each pair ...
    assert 0 < pairs[:, 0].sum() < len(pairs)  # ... but not a fixed alternation


def test_images_are_8bit_grayscale(dataset: Path) -> None:
    for path in (dataset / "imgs").rglob("*.png"):
        with Image.open(path) as img:
            assert img.mode == "L" and img.size == (32, 32)
            arr = np.asarray(img)
        assert arr.dtype == np.uint8 and arr.max() == 255 and arr.min() == 0


def test_markers_connected_iff_label_1(dataset: Path) -> None:
    for row in _all_rows(dataset):
        mask = np.asarray(Image.open(dataset / "masks" / row[0][len("imgs/") :] / row[1]))
        image = np.asarray(Image.open(dataset / row[0] / row[1]))
        assert set(np.unique(mask & 3)) == {0, 1, 2}  # both target snakes are there
        assert _connected(mask) == (row[3] == "1"), row[:2]
        ys, xs = np.nonzero(mask & 4)
        assert (image[ys, xs] >= 128).all()  # the markers are drawn where the mask says


def test_npy_metadata_and_same_seed_same_bytes(dataset: Path, tmp_path: Path) -> None:
    root = pf.generate(tmp_path, 32, 14, 24, seed=SEED, images_per_folder=PER_FOLDER, metadata_format="npy")
    raw = (root / "metadata" / "0.npy").read_bytes()
    assert raw.startswith(b"\x93NUMPY")
    arr = np.load(root / "metadata" / "0.npy", allow_pickle=False)
    assert arr.shape == (24, 11)
    assert arr.tolist() == _all_rows(dataset)[:24] == pf.read_metadata(root / "metadata" / "0.npy")
    ours = _files(root, "imgs")
    assert ours == {name: data for name, data in _files(dataset, "imgs").items() if name in ours}
    assert len(ours) == 24


def test_output_independent_of_workers_and_folders(dataset: Path, tmp_path: Path) -> None:
    one = pf.generate(tmp_path / "one", 32, 14, 32, seed=SEED, workers=1, images_per_folder=16)
    two = pf.generate(tmp_path / "two", 32, 14, 32, seed=SEED, workers=2, images_per_folder=16)
    assert _files(one, "imgs") == _files(two, "imgs")
    assert (one / "metadata" / "1.npy").read_bytes() == (two / "metadata" / "1.npy").read_bytes()
    for g in range(32):  # image g depends only on (seed, g), not on the folder size
        ref = dataset / "imgs" / str(g // PER_FOLDER) / f"sample_{g % PER_FOLDER}.png"
        assert (one / "imgs" / str(g // 16) / f"sample_{g % 16}.png").read_bytes() == ref.read_bytes()
    other = _files(pf.generate(tmp_path / "other", 32, 14, 4, seed=SEED + 1, images_per_folder=16), "imgs")
    assert all(other[name] != data for name, data in _files(one, "imgs").items() if name in other)


def test_cli(tmp_path: Path) -> None:
    argv = [
        "--out",
        str(tmp_path),
        "--resolution",
        "32",
        "--contour-length",
        "6",
        "--num-images",
        "6",
        "--seed",
        "1",
        "--workers",
        "1",
        "--images-per-folder",
        "4",
        "--write-masks",
        "--metadata-format",
        "npy",
    ]
    assert pf.main(argv) == 0
    root = tmp_path / "pathfinder32" / "curv_baseline"
    assert (root / "imgs" / "1" / "sample_1.png").is_file()
    assert (root / "masks" / "0" / "sample_3.png").is_file()
    rows = pf.read_metadata(root / "metadata" / "1.npy")
    assert [r[:3] for r in rows] == [["imgs/1", "sample_0.png", "0"], ["imgs/1", "sample_1.png", "1"]]
    assert rows[0][4:] == ["1.0", "6", "2", "2", "0.5", "1", "1"]  # the released 32 px baseline row


@pytest.mark.parametrize("resolution", [64, 128, 256])
def test_make_sample_other_resolutions(resolution: int) -> None:
    params = pf.PathfinderParams.for_resolution(resolution, 6)
    rng = np.random.default_rng(resolution)
    for label in (0, 1):
        image, got, mask = pf.make_sample(rng, params, label)
        assert got == label and image.dtype == np.uint8 and image.shape == (resolution, resolution)
        assert mask.shape == image.shape and _connected(mask) == bool(label)


def test_params_table() -> None:
    p32 = pf.PathfinderParams.for_resolution(32, 14)
    assert (p32.distractor_length, p32.num_distractor_snakes, p32.seed_distance) == (4, 5, 7)
    p128 = pf.PathfinderParams.for_resolution(128, 6)
    assert p128.paddle_margin_list == (2, 3) and p128.num_distractor_snakes == 35 // 2
    assert p128.metadata_tail(2) == ["1.8", "6", "2.0", "5", "1.5", "2", "1"]  # the released 128 px row
    assert pf.PathfinderParams.for_resolution(256, 9).padding == 22
    assert pf.difficulty_dir(6) == "curv_baseline" and pf.difficulty_dir(9) == "curv_contour_length_9"
    with pytest.raises(ValueError):
        pf.PathfinderParams.for_resolution(48, 14)
