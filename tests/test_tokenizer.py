"""Tokenizers: LRA semantics and round trips."""

from __future__ import annotations

import numpy as np

from tasks.tokenizers import ByteTokenizer, ListOpsTokenizer, pad_truncate


def test_listops_vocabulary_is_fixed_and_sorted() -> None:
    tok = ListOpsTokenizer()
    assert tok.vocab_size == 17 and tok.OOV_ID == 16
    assert list(tok.TOKENS) == sorted(tok.TOKENS) and len(tok.TOKENS) == 15
    assert set(tok.ids.values()) == set(range(1, 16))


def test_listops_brackets_and_parentheses() -> None:
    tok = ListOpsTokenizer()
    text = "( ( ( [MAX 2 ) 9 ) ] )"
    assert tok.tokens(text) == ["[MAX", "2", "9", "X"]
    ids = tok.encode(text)
    assert tok.decode(ids) == ["[MAX", "2", "9", "X"]
    assert tok.encode("[FOO 3") == [tok.OOV_ID, tok.ids["3"]]


def test_byte_tokenizer_round_trip_multibyte() -> None:
    tok = ByteTokenizer()
    text = "naïve café — ünïcödé ✓"
    ids = tok.encode(text)
    assert len(ids) == len(text.encode("utf-8")) and min(ids) >= 1 and max(ids) <= 256
    assert tok.decode(ids) == text
    assert np.array_equal(tok.encode_array(text, 5), np.asarray(ids[:5]))


def test_pad_truncate() -> None:
    ids, n = pad_truncate(list(range(1, 11)), max_length=6, seq_len=8)
    assert n == 6 and ids.tolist() == [1, 2, 3, 4, 5, 6, 0, 0]
    ids, n = pad_truncate([5, 6], max_length=6, seq_len=8)
    assert n == 2 and ids.tolist() == [5, 6, 0, 0, 0, 0, 0, 0]
