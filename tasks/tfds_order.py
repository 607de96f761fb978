"""TFDS's record order and percent slicing, recomputed without TensorFlow — how LRA's Image and Pathfinder
splits were made.

LRA reads CIFAR-10 as `tfds.load('cifar10', split='train[:90%]' | 'train[90%:]' | 'test')` and Pathfinder as
`builder.as_dataset(split='hard[:80%]' | 'hard[80%:90%]' | 'hard[90%:]')`
(google-research/long-range-arena@cd31e5c `lra_benchmarks/image/input_pipeline.py`). A slice is a range of
positions in the split's record order, and TFDS fixes that order when it builds the dataset, from the key the
builder yields with each example. The rule, as in the TFDS that LRA used (`tensorflow-datasets>=4.0.1` in
LRA's `requirements.txt`; read at tensorflow/datasets@v4.0.1):

1. Hash. `hashing.Hasher(salt).hash_key(key)` is `int(md5(salt_bytes + key_bytes).hexdigest(), 16)`, a 128-bit
   integer. The salt is the split's name (`dataset_builder.py`: `Writer(..., hash_salt=split_generator.name)`
   and `BeamWriter(..., hash_salt=split_name)`). A `str` key is UTF-8 after `\\` → `/`; an `int` key is
   `str(key)` first (`_to_bytes`). The same md5 rule is in tensorflow/datasets@b1a7bdf
   `tensorflow_datasets/core/hashing.py` (its docstring says changing it would reorder every dataset).
2. Sort. Records are written in ascending hash order. `shuffle.Shuffler` sorts `(hkey, record)` in memory, or
   spreads them over 1,000 hash-range buckets (`floor(hkey · buckets / 2^128)`) that are each sorted and read
   in bucket order; Beam's `BeamWriter` does the same with 100,000 buckets. Either way the global order is the
   sorted hashes, and shards are consecutive runs of it (`tfrecords_writer._get_shard_boundaries`), so split
   position i holds the example with the i-th smallest hash. Two equal hashes abort the build. (The
   `disable_shuffling` flag of later TFDS versions did not exist in 4.0.1 and neither builder sets it.)
3. Slice. `'train[:90%]'` parses to a `ReadInstruction` with the default rounding `'closest'`
   (`tfrecords_reader._str_to_relative_instruction`), and a percent boundary becomes the absolute index
   `int(round(pct * n / 100.))` — Python's round, half to even (`_pct_to_abs_closest`; the same code is at
   tensorflow/datasets@0560e68). An open start is 0, an open end is n, so `[:b%]` and `[b%:]` are complements
   (`_rel_to_abs_instr`).

Ground truth: on the TFDS-built `cifar10` (3.0.2) the first `train` records read are `train_16399`,
`train_01680`, `train_47917`, … (the Ray docs' `from_tf` example, ray-project/ray
`python/ray/data/read_api.py`; the first 16 ids are printed in Ganegedara, *TensorFlow in Action*, Manning
2022, ch. 3); this rule gives exactly those (tested).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np


def key_bytes(value: str | int | bytes) -> bytes:
    """A key or salt as TFDS hashes it: bytes as is, str UTF-8 with `\\` → `/`, int as its decimal str."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(f"TFDS keys are str, int or bytes, got {type(value).__name__} {value!r}")
    text = value.replace("\\", "/") if isinstance(value, str) else str(value)
    return text.encode("utf-8")


def hash_key(salt: str, key: str | int | bytes) -> int:
    """TFDS's 128-bit record hash: `int(md5(salt + key).hexdigest(), 16)`."""
    digest = hashlib.md5(key_bytes(salt))
    digest.update(key_bytes(key))
    return int(digest.hexdigest(), 16)


def record_order(keys: Sequence[str | int | bytes], salt: str) -> np.ndarray:
    """Indices into `keys` in TFDS record order (ascending salted hash): `keys[order[i]]` is record i."""
    hashes = [hash_key(salt, k) for k in keys]
    order = sorted(range(len(hashes)), key=hashes.__getitem__)
    for a, b in zip(order, order[1:]):
        if hashes[a] == hashes[b]:  # TFDS refuses to build such a split (DuplicatedKeysError)
            raise ValueError(f"two examples share the TFDS key hash of {keys[a]!r} and {keys[b]!r} (salt {salt!r})")
    return np.asarray(order, dtype=np.int64)


def percent_boundary(percent: int, n: int) -> int:
    """Absolute index of the percent boundary `[..percent%..]` of an n-record split (rounding 'closest')."""
    return int(round(percent * n / 100.0))


def percent_slices(n: int, cuts: Sequence[int]) -> list[tuple[int, int]]:
    """`[:c1%]`, `[c1%:c2%]`, …, `[ck%:]` of n records as (start, stop) pairs: cuts (80, 90) → three slices."""
    bounds = [0, *(percent_boundary(c, n) for c in cuts), n]
    return list(zip(bounds, bounds[1:]))


def whole_percent(fraction: float, key: str) -> int:
    """`fraction` as the integer percent a TFDS slice string can carry (0.1 → 10); else a one-line error."""
    percent = round(float(fraction) * 100)
    if not 0 < percent < 100 or abs(float(fraction) * 100 - percent) > 1e-9:
        raise ValueError(
            f"{key}={fraction}: the TFDS split slices whole percents; use a multiple of 0.01 in (0, 1) (LRA: 0.1)"
        )
    return percent
