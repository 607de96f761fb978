"""The data part of a run's identity (`data.source`, `data.cache_key`; `lra_bench.record.identity.data_identity`)
on ListOps files in the official format, fast: a run on other files, or on the same files after they changed, is
another experiment; the same files named another way are not. (The slow tier checks it on `run.py` processes:
`tests/test_record_e2e.py`.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lra_bench.record.identity import fingerprint, run_identity
from lra_bench.run.build import build_datamodule
from lra_bench.run.rundir import data_identity_of
from tests.conftest import TINY_LISTOPS, compose, write_listops


def _identity(data_dir: str | Path) -> tuple[dict, str]:
    """The run's identity and fingerprint as `start_run` settles them, for the config on `data_dir`."""
    cfg = compose([*TINY_LISTOPS, f"data_dir={data_dir}", "task.generate_if_missing=false"])
    data = data_identity_of(build_datamodule(cfg))
    identity = run_identity({"task": {"name": "listops"}, "seed": 0}, data)
    return data, fingerprint(identity)


def test_the_data_identity_follows_the_files_not_the_folder_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = write_listops(tmp_path / "a", train=24, evaluation=8, max_length=40)
    data, fp = _identity(original)
    assert data["data.source"] == str((original / "listops-1000").resolve())
    assert data["data.cache_key"].startswith("v")

    monkeypatch.chdir(tmp_path)  # the same files by a relative path: the same experiment
    assert _identity("a") == (data, fp)

    copy = tmp_path / "b"
    shutil.copytree(original, copy)  # the same content elsewhere: another source, another experiment
    other, other_fp = _identity(copy)
    assert other["data.source"] != data["data.source"] and other_fp != fp

    train = original / "listops-1000" / "basic_train.tsv"
    train.write_text(train.read_text() + train.read_text().splitlines()[-1] + "\n")  # the files changed in place
    changed, changed_fp = _identity(original)
    assert changed["data.source"] == data["data.source"]
    assert changed["data.cache_key"] != data["data.cache_key"] and changed_fp != fp
