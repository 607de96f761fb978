"""ListOps generator: grammar, length bounds, labels checked by an independent evaluator, reproducibility,
files independent of the worker count, and the distribution of one sequential stream."""

from __future__ import annotations

import csv
import json
import random
import signal
import statistics
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

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


# Small trees: a chunk (256 trees) takes milliseconds, so several chunks cost nothing.
SMALL = dict(max_depth=5, max_args=5, min_length=10, max_length=100)


def test_files_are_byte_identical_for_any_worker_count(tmp_path: Path) -> None:
    kw = dict(num_train=800, num_val=60, num_test=60, progress=False, seed=11, **SMALL)  # 4 chunks
    assert kw["num_train"] + kw["num_val"] + kw["num_test"] > 3 * gen.CHUNK_TREES
    one = gen.write_splits(tmp_path / "one", workers=1, **kw)
    three = gen.write_splits(tmp_path / "three", workers=3, **kw)
    for split in ("train", "val", "test"):
        assert (one / f"basic_{split}.tsv").read_bytes() == (three / f"basic_{split}.tsv").read_bytes(), split


def test_chunks_draw_from_distinct_streams() -> None:
    knobs = gen.Knobs(**SMALL)
    seeds = {gen.chunk_seed(seed, index) for seed in (0, 1) for index in range(200)}
    assert len(seeds) == 400
    first, _ = gen.generate_chunk(0, 0, knobs, size=20)
    second, _ = gen.generate_chunk(0, 1, knobs, size=20)
    assert first != second and first == gen.generate_chunk(0, 0, knobs, size=20)[0]


def _sequential_stream(num_samples: int, seed: int, knobs: dict) -> list[tuple[str, int]]:
    """Version 1 of the generator (one stream, first occurrence kept): the distribution to preserve."""
    rng, seen, out = random.Random(seed), set(), []
    while len(out) < num_samples:
        item = gen.sample(rng, knobs["max_depth"], knobs["max_args"], knobs["max_length"])
        if item is None or item[2] <= knobs["min_length"] or item[0] in seen:
            continue
        seen.add(item[0])
        out.append((item[0], item[1]))
    return out


def test_distribution_is_that_of_one_sequential_stream() -> None:
    knobs = dict(max_depth=6, max_args=6, min_length=20, max_length=200)
    ours = gen.generate(3000, seed=5, progress=False, workers=1, **knobs)
    reference = _sequential_stream(3000, seed=6, knobs=knobs)
    length = lambda rows: [evaluate(t)[1] for t, _ in rows]  # noqa: E731
    assert stats.ks_2samp(length(ours), length(reference)).pvalue > 1e-3
    table = np.array([np.bincount([y for _, y in rows], minlength=10) for rows in (ours, reference)])
    assert stats.chi2_contingency(table).pvalue > 1e-3
    depth = lambda rows: [t.count("[") for t, _ in rows]  # operators per tree  # noqa: E731
    assert stats.ks_2samp(depth(ours), depth(reference)).pvalue > 1e-3


def test_bad_worker_count_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gen.main(["--out", str(tmp_path), "--num-train", "4", "--workers", "0", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: workers=0: need at least 1 process"


def test_datamodule_records_the_version_and_ignores_the_worker_count(tmp_path: Path) -> None:
    from tasks.listops import GENERATOR_MARKER, ListOpsConfig, ListOpsDataModule

    tiny = dict(gen_num_train=40, gen_num_val=8, gen_num_test=8, gen_min_length=8, gen_max_length=64)
    made = ListOpsDataModule(ListOpsConfig(**tiny, gen_workers=2), str(tmp_path), str(tmp_path / "cache"))
    made.ensure_source()
    marker_path = tmp_path / "listops-1000" / GENERATOR_MARKER
    marker = json.loads(marker_path.read_text())
    assert marker["generator_version"] == gen.GENERATOR_VERSION and "gen_workers" not in marker
    same_data = ListOpsDataModule(ListOpsConfig(**tiny, gen_workers=1), str(tmp_path), str(tmp_path / "cache"))
    assert not same_data.stale_generated()
    marker_path.write_text(json.dumps({**marker, "generator_version": 1}))  # data of the sequential generator
    assert same_data.stale_generated()


def test_a_stop_signal_never_lands_inside_the_pools_bookkeeping(monkeypatch: pytest.MonkeyPatch) -> None:
    """run.py's handler raises where a signal lands outside training. Inside `ProcessPoolExecutor.submit` that can
    lose a half-started worker which then holds the run's stdout open forever (tests/test_signals.py saw it under
    load). Here the signal arrives in the middle of every submit: the handler must run only after it returns."""
    landed: list[bool] = []
    inside = False
    real_submit = gen.ProcessPoolExecutor.submit

    def submit(self, *args, **kwargs):  # the signal arrives mid-submit, every time
        nonlocal inside
        inside = True
        try:
            signal.raise_signal(signal.SIGTERM)
            return real_submit(self, *args, **kwargs)
        finally:
            inside = False

    def handler(signum: int, frame: object) -> None:
        landed.append(inside)
        raise KeyboardInterrupt

    monkeypatch.setattr(gen.ProcessPoolExecutor, "submit", submit)
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            gen.generate(2000, workers=2, min_length=8, max_length=64, progress=False)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert landed and not any(landed), landed
