"""TFDS's record order and percent slices (`tasks.tfds_order`) against md5 computed here and published TFDS records."""

from __future__ import annotations

import hashlib

import pytest

from tasks.tfds_order import hash_key, percent_boundary, percent_slices, record_order, whole_percent

# The first 16 records of TFDS `cifar10` train, as read (their `id` feature is `train_{key:05d}`): printed in
# Ganegedara, "TensorFlow in Action" (Manning 2022), ch. 3; the first is also the Ray docs' `from_tf` example.
PUBLISHED_CIFAR10_TRAIN_HEAD = [
    16399, 1680, 47917, 17307, 27051, 48736, 26263, 1456, 19135, 31598, 12970, 4223, 27152, 49635, 4093, 17537,
]  # fmt: skip


def md5_int(data: bytes) -> int:
    return int(hashlib.md5(data).hexdigest(), 16)


def test_hash_is_md5_of_salt_then_key() -> None:
    assert hash_key("train", 16399) == md5_int(b"train16399")  # an int key hashes as its decimal string
    assert hash_key("train", "16399") == hash_key("train", 16399)
    assert hash_key("hard", "imgs/0_sample_3.png_4") == md5_int(b"hardimgs/0_sample_3.png_4")
    assert hash_key("hard", "imgs\\0_x") == hash_key("hard", "imgs/0_x")  # TFDS normalises Windows separators
    assert hash_key("test", "é") == md5_int("testé".encode())  # UTF-8
    assert hash_key("train", 7) != hash_key("test", 7)  # the split name salts the order
    with pytest.raises(TypeError):
        hash_key("train", 1.5)  # type: ignore[arg-type]


def test_record_order_is_ascending_salted_md5() -> None:
    keys = [f"imgs/{k}_sample_{i}.png_{i + 1}" for k in range(3) for i in range(7)]
    expected = sorted(range(len(keys)), key=lambda j: md5_int(b"hard" + keys[j].encode()))
    assert record_order(keys, "hard").tolist() == expected
    assert record_order(keys, "easy").tolist() != expected


def test_cifar10_train_head_is_the_published_tfds_order() -> None:
    """Ground truth: the keys are positions 0..49999 and the salt is `train`; TFDS read these records first."""
    assert record_order(range(50_000), "train")[:16].tolist() == PUBLISHED_CIFAR10_TRAIN_HEAD


def test_duplicate_keys_are_refused_as_tfds_does() -> None:
    with pytest.raises(ValueError, match="share the TFDS key hash"):
        record_order(["a", "b", "a"], "train")


@pytest.mark.parametrize(
    ("n", "percent", "boundary"),
    [
        (50_000, 90, 45_000),
        (200_000, 80, 160_000),
        (25, 90, 22),  # 22.5 → 22: Python's round goes half to even
        (35, 90, 32),  # 31.5 → 32
        (15, 90, 14),  # 13.5 → 14
        (15, 80, 12),
        (13, 80, 10),  # 10.4 → 10
        (13, 90, 12),  # 11.7 → 12
        (5, 90, 4),  # 4.5 → 4
    ],
)
def test_percent_boundary_rounds_to_closest_half_even(n: int, percent: int, boundary: int) -> None:
    assert percent_boundary(percent, n) == boundary


def test_percent_slices_partition_the_split() -> None:
    assert percent_slices(15, [80, 90]) == [(0, 12), (12, 14), (14, 15)]
    assert percent_slices(25, [90]) == [(0, 22), (22, 25)]
    for n in range(1, 60):
        slices = percent_slices(n, [80, 90])
        assert slices[0][0] == 0 and slices[-1][1] == n and all(a[1] == b[0] for a, b in zip(slices, slices[1:]))


def test_whole_percent() -> None:
    assert whole_percent(0.1, "task.val_fraction") == 10 and whole_percent(0.25, "k") == 25
    with pytest.raises(ValueError, match=r"^task\.val_fraction=0\.125: the TFDS split slices whole percents"):
        whole_percent(0.125, "task.val_fraction")
    with pytest.raises(ValueError, match="whole percents"):
        whole_percent(1.0, "k")
