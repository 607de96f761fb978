"""ListOps generator: grammar, length bounds, labels checked by an independent evaluator, reproducibility."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest

from tasks.generate import listops as gen

OPS = {"[MIN", "[MAX", "[MED", "[SM"}


def evaluate(text: str) -> tuple[int, int]:
    """Independent evaluator: a stack machine over the raw official string. Returns (value, token length)."""
    stack: list[list] = []
    length = 0
    result = None
    for tok in text.split():
        if tok == "(" or tok == ")":
            continue
        length += 1
        if tok in OPS:
            stack.append([tok])
        elif tok == "]":
            op, *args = stack.pop()
            if op == "[MIN":
                value = min(args)
            elif op == "[MAX":
                value = max(args)
            elif op == "[SM":
                value = sum(args) % 10
            else:
                value = int(statistics.median(args))
            if stack:
                stack[-1].append(value)
            else:
                result = value
        else:
            assert tok.isdigit() and len(tok) == 1, tok
            if stack:
                stack[-1].append(int(tok))
            else:
                result = int(tok)
    assert not stack
    return result, length


def test_parenthesisation_matches_official_to_string() -> None:
    # the official example: ( ( ( ( [MED 1 ) ( ( ( [SM 3 ) 2 ) ] ) ) ( ( ( ( [MED 8 ) 7 ) 1 ) ] ) ) ] ) -> 5
    text = "( ( ( ( [MED 1 ) ( ( ( [SM 3 ) 2 ) ] ) ) ( ( ( ( [MED 8 ) 7 ) 1 ) ] ) ) ] )"
    assert evaluate(text) == (5, 12)
    assert text.count("(") == text.count(")")


def test_samples_obey_grammar_bounds_and_labels() -> None:
    rows = gen.generate(200, seed=3, max_depth=6, max_args=6, min_length=20, max_length=200, progress=False)
    assert len({t for t, _ in rows}) == 200, "duplicates must be dropped"
    for text, label in rows:
        value, length = evaluate(text)
        assert value == label
        assert 20 < length < 200
        assert text.count("(") == text.count(")")
        assert 0 <= label <= 9


def test_median_is_floor_of_mean_of_middle_values() -> None:
    assert gen.apply_op("[MED", [1, 2]) == 1
    assert gen.apply_op("[MED", [3, 8, 1, 9]) == 5
    assert gen.apply_op("[MED", [4, 1, 7]) == 4
    assert gen.apply_op("[SM", [9, 9, 5]) == 3


def test_seeded_files_are_reproducible_and_official_format(tmp_path: Path) -> None:
    kw = dict(num_train=30, num_val=5, num_test=5, progress=False, seed=7, min_length=10, max_length=100, max_depth=5)
    a = gen.write_splits(tmp_path / "a", **kw)
    b = gen.write_splits(tmp_path / "b", **kw)
    for split in ("train", "val", "test"):
        data_a = (a / f"basic_{split}.tsv").read_bytes()
        assert data_a == (b / f"basic_{split}.tsv").read_bytes()
        assert data_a.startswith(b"Source\tTarget\r\n")
        with open(a / f"basic_{split}.tsv", newline="") as fh:
            rows = list(csv.reader(fh, delimiter="\t"))[1:]
        assert len(rows) == {"train": 30, "val": 5, "test": 5}[split]
    c = gen.write_splits(tmp_path / "c", **{**kw, "seed": 8})
    assert (c / "basic_train.tsv").read_bytes() != (a / "basic_train.tsv").read_bytes()


def test_cli_and_impossible_bounds(tmp_path: Path) -> None:
    assert (
        gen.main(
            [
                "--out",
                str(tmp_path),
                "--num-train",
                "4",
                "--num-val",
                "2",
                "--num-test",
                "2",
                "--min-length",
                "5",
                "--max-length",
                "60",
                "--no-progress",
            ]
        )
        == 0
    )
    assert (tmp_path / "basic_test.tsv").exists()
    with pytest.raises(ValueError, match="min_length"):
        gen.generate(5, min_length=100, max_length=50, progress=False)
