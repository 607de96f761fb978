"""Tokenizers with the LRA semantics, each versioned: the version is part of every cache key and result."""

from __future__ import annotations

import numpy as np

PAD_ID = 0


class ListOpsTokenizer:
    """LRA ListOps after the March-2021 fix: `]` → `X`, parentheses dropped, whitespace split.

    The 15 tokens get ids 1..15 in a fixed sorted order (the official ids follow Python set iteration and
    are not reproducible), 16 is the out-of-vocabulary id, 0 is padding: 17 ids in all.
    """

    version = "listops-v1"
    TOKENS = tuple(sorted(["X", *map(str, range(10)), "[MIN", "[MAX", "[MED", "[SM"]))
    OOV_ID = len(TOKENS) + 1
    vocab_size = len(TOKENS) + 2

    def __init__(self) -> None:
        self.ids = {tok: i + 1 for i, tok in enumerate(self.TOKENS)}
        self._table = str.maketrans({"]": "X", "(": None, ")": None})

    def tokens(self, text: str) -> list[str]:
        return text.translate(self._table).split()

    def encode(self, text: str) -> list[int]:
        get = self.ids.get
        return [get(tok, self.OOV_ID) for tok in self.tokens(text)]

    def decode(self, ids: list[int] | np.ndarray) -> list[str]:
        inverse = {i: tok for tok, i in self.ids.items()}
        return [inverse.get(int(i), "<oov>") for i in ids if int(i) != PAD_ID]


class ByteTokenizer:
    """TFDS `ByteTextEncoder` semantics: UTF-8 byte b → id b + 1, pad 0, 257 ids."""

    version = "bytes-v1"
    vocab_size = 257

    def encode(self, text: str) -> list[int]:
        return (np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int16) + 1).tolist()

    def encode_array(self, text: str, max_length: int) -> np.ndarray:
        raw = np.frombuffer(text.encode("utf-8")[:max_length], dtype=np.uint8)
        return raw.astype(np.int16) + 1

    def decode(self, ids: list[int] | np.ndarray) -> str:
        data = bytes(int(i) - 1 for i in ids if int(i) != PAD_ID)
        return data.decode("utf-8", errors="replace")


def pad_truncate(ids: list[int] | np.ndarray, max_length: int, seq_len: int) -> tuple[np.ndarray, int]:
    """Truncate to `max_length` (the protocol length), pad with 0 to `seq_len` (its power-of-two padding)."""
    ids = np.asarray(ids[:max_length], dtype=np.int16)
    out = np.zeros(seq_len, dtype=np.int16)
    out[: len(ids)] = ids
    return out, len(ids)
