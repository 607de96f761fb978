"""The data part of a run's identity (`data.tokens`: the digest of the tokenized splits; `tasks.cache.tokens_digest`)
on ListOps files in the official format, fast: the same bytes are the same experiment wherever they lie and whenever
they were written (a new checkout regenerates them: its runs must resume and pool), changed bytes are another; and a
run dir from before `data.tokens` is taken over only when its record's source files are this run's. (The slow tier
checks it on `run.py` processes: `tests/test_record_e2e.py`.)"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from lra_bench.errors import ConfigError
from lra_bench.record.identity import fingerprint, run_identity
from lra_bench.record.schema import SCHEMA_VERSION
from lra_bench.run import rundir
from lra_bench.run.build import build_datamodule
from tasks import cache
from tasks.base import SPLITS
from tests.conftest import TINY_LISTOPS, compose, write_listops

CONFIG = {"task": {"name": "listops"}, "seed": 0}


def _prepared(data_dir: str | Path, cache_dir: Path) -> object:
    cfg = compose([*TINY_LISTOPS, f"data_dir={data_dir}", f"cache_dir={cache_dir}", "task.generate_if_missing=false"])
    dm = build_datamodule(cfg)
    dm.prepare_data()
    return dm


def _identity(data_dir: str | Path, cache_dir: Path) -> tuple[dict, str]:
    """The run's data identity and fingerprint as `identify` settles them, for the config on `data_dir`."""
    data = rundir.data_identity_of(_prepared(data_dir, cache_dir))
    return data, fingerprint(run_identity(CONFIG, data))


def test_the_data_identity_is_the_tokens_not_the_files_place_or_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = write_listops(tmp_path / "a", train=24, evaluation=8, max_length=40)
    data, fp = _identity(original, tmp_path / "cache")
    assert set(data) == {"data.tokens"} and len(data["data.tokens"]) == 16

    monkeypatch.chdir(tmp_path)  # the same files by a relative path
    assert _identity("a", tmp_path / "cache") == (data, fp)

    copy = tmp_path / "b"
    shutil.copytree(original, copy)  # the same bytes elsewhere, written now (new mtimes): another cache, one experiment
    for path in (copy / "listops-1000").iterdir():
        os.utime(path, ns=(10**18, 10**18))
    other_cache = tmp_path / "other-cache"
    assert _identity(copy, other_cache) == (data, fp)
    caches = [{p.name for p in (root / "listops").iterdir()} for root in (other_cache, tmp_path / "cache")]
    assert caches[0] != caches[1]  # the cache key still follows the files' place and time

    train = original / "listops-1000" / "basic_train.tsv"
    lines = train.read_text().splitlines()
    train.write_text("\n".join([*lines, lines[-1]]) + "\n")  # the files changed in place: one example more
    changed, changed_fp = _identity(original, tmp_path / "cache")
    assert changed["data.tokens"] != data["data.tokens"] and changed_fp != fp


def test_the_digest_covers_every_token_and_is_stored_once_per_cache(tmp_path: Path) -> None:
    dm = _prepared(write_listops(tmp_path, train=24, evaluation=8, max_length=40), tmp_path / "cache")
    stored = dm.cache_path / cache.TOKENS_FILE
    assert json.loads(stored.read_text())["digest"] == dm.tokens == cache.digest_splits(dm.cache_path, SPLITS)

    dm.setup()  # the digest hashes what the model reads: one token of one test example changed changes it
    columns = {s: {c: np.asarray(dm.splits[s].table[c]) for c in dm.splits[s].table.column_names} for s in SPLITS}
    columns["test"]["input_ids"][3, 1] += 1
    edited = tmp_path / "edited"
    cache.save_splits(edited, {s: cache.arrays_to_dataset(c) for s, c in columns.items()}, {})
    assert cache.tokens_digest(edited, SPLITS) != dm.tokens
    assert (edited / cache.TOKENS_FILE).exists()  # a cache without the file gets it written on first ask


def _legacy_run_dir(out: Path, identity: dict, source_sha: str | None) -> None:
    """A run dir as a run before `data.tokens` left it: its identity's data part a path and a cache key."""
    old = {k: v for k, v in identity.items() if k != "data.tokens"}
    old.update({"data.source": "/elsewhere/listops-1000", "data.cache_key": "v1-62bba051f22d"})
    rundir.write_identity(out, old, fingerprint(old), {})
    origin = {"kind": "generated", "fingerprint": source_sha} if source_sha else None
    data = {"tokenizer_version": "listops-v1", "origin": origin}
    (out / "results.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION, "status": "running", "data": data}))


def test_a_run_dir_from_before_data_tokens_is_taken_over_only_on_the_same_source_files(tmp_path: Path) -> None:
    identity = run_identity(CONFIG, {"data.tokens": "0123456789abcdef"})
    now = {"tokenizer_version": "listops-v1", "origin": {"kind": "generated", "fingerprint": "0e57e699ae0d808b"}}
    same = tmp_path / "same"
    same.mkdir()
    _legacy_run_dir(same, identity, "0e57e699ae0d808b")
    renewed = rundir.check_same_experiment(same, identity, fingerprint(identity), now)
    assert renewed is not None and renewed["fingerprint"] == fingerprint(identity)
    assert renewed["migrated_from"] == rundir.read_identity(same)["fingerprint"] != fingerprint(identity)

    for name, sha, data in (
        ("other-files", "ffffffffffffffff", now),  # other source bytes
        ("unrecorded", None, now),  # a record that never said which bytes
        ("other-tokenizer", "0e57e699ae0d808b", {**now, "tokenizer_version": "listops-v2"}),
    ):
        out = tmp_path / name
        out.mkdir()
        _legacy_run_dir(out, identity, sha)
        with pytest.raises(ConfigError, match="holds another experiment"):
            rundir.check_same_experiment(out, identity, fingerprint(identity), data)

    seeded = run_identity({**CONFIG, "seed": 1}, {"data.tokens": "0123456789abcdef"})  # another config: refused
    with pytest.raises(ConfigError, match="seed"):
        rundir.check_same_experiment(same, seeded, fingerprint(seeded), now)
