"""Never overwrite or delete a user's files: ListOps is generated only into an absent or empty `listops-1000/`; a
partial official layout is an error naming the missing file; data generated with other generator settings is an
error, not regenerated over; Pathfinder's 200,000-image generation never starts by default (a typo'd data_dir)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.generate import listops as generator
from tasks.layout import DataSourceError
from tasks.listops import ListOpsConfig, ListOpsDataModule
from tests.conftest import REPO

SMALL = {
    "max_length": 64,
    "seq_len": 64,
    "gen_num_train": 24,
    "gen_num_val": 8,
    "gen_num_test": 8,
    "gen_min_length": 8,
    "gen_max_length": 64,
    "gen_max_depth": 3,
}


def _dm(data: Path, tmp_path: Path, **cfg) -> ListOpsDataModule:
    return ListOpsDataModule(ListOpsConfig(**{**SMALL, **cfg}), data_dir=str(data), cache_dir=str(tmp_path / "cache"))


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def _user_files(folder: Path, splits: tuple[str, ...]) -> None:
    folder.mkdir(parents=True)
    for split in splits:  # a user's own (official-format) files
        generator.write_tsv(folder / f"basic_{split}.tsv", [("[MAX 1 2 ]", 2)] * 5)


def test_a_partial_official_layout_is_an_error_naming_the_missing_file(tmp_path: Path) -> None:
    folder = tmp_path / "data" / "listops-1000"
    _user_files(folder, ("train", "val"))
    before = _snapshot(folder)
    with pytest.raises(DataSourceError, match=r"basic_test\.tsv missing \(found basic_train\.tsv, basic_val\.tsv\)"):
        _dm(tmp_path / "data", tmp_path).prepare_data()
    assert _snapshot(folder) == before  # not regenerated over the two present files


def test_a_dir_with_other_files_is_never_generated_into(tmp_path: Path) -> None:
    folder = tmp_path / "data" / "listops-1000"
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(DataSourceError, match="generated only into an absent or empty dir"):
        _dm(tmp_path / "data", tmp_path).prepare_data()
    assert _snapshot(folder) == {"notes.txt": (b"mine", (folder / "notes.txt").stat().st_mtime_ns)}


def test_other_generator_settings_are_an_error_not_a_regeneration(tmp_path: Path) -> None:
    _dm(tmp_path / "data", tmp_path).prepare_data()
    folder = tmp_path / "data" / "listops-1000"
    before = _snapshot(folder)
    for allowed in (True, False):
        with pytest.raises(DataSourceError, match=r"generated with other settings \(gen_num_train 24→32\)"):
            _dm(tmp_path / "data", tmp_path, gen_num_train=32, generate_if_missing=allowed).prepare_data()
    assert _snapshot(folder) == before


@pytest.mark.parametrize("empty", [False, True])
def test_generation_into_an_absent_or_empty_dir_leaves_no_temp(tmp_path: Path, empty: bool) -> None:
    folder = tmp_path / "data" / "listops-1000"
    if empty:
        folder.mkdir(parents=True)
    dm = _dm(tmp_path / "data", tmp_path)
    dm.setup()
    assert sum(len(dm.splits[s]) for s in ("train", "val", "test")) == 40
    assert sorted(p.name for p in folder.iterdir()) == [
        "basic_test.tsv",
        "basic_train.tsv",
        "basic_val.tsv",
        "generator.json",
    ]
    assert not [p for p in (tmp_path / "data").iterdir() if p.name.startswith(".")]  # no temp dir left


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pathfinder_never_starts_generating_on_a_typod_data_dir(tmp_path: Path) -> None:
    typo = tmp_path / "dtaa"
    proc = subprocess.run(
        [sys.executable, str(REPO / "run.py"), "task=pathfinder", f"data_dir={typo}", f"output_root={tmp_path}/out"],
        cwd=REPO,
        env={**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,  # a started 200,000-image generation would take 15 CPU-minutes
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "task.generate_if_missing=true" in proc.stderr
    assert not typo.exists() or not any(typo.rglob("*.png"))
