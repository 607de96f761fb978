"""`python -m lra_bench.prepare task=<t> data_dir=...`: builds the cache a run will find, prints split statistics,
and turns a missing source into one error (exit 2) with the three ways to get the data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lra_bench import prepare
from tests.conftest import REPO, compose
from tests.test_tasks_pathfinder import write_pathfinder
from tests.test_tasks_text import write_aclimdb


def test_cli_builds_cache_and_prints_statistics(tmp_path: Path) -> None:
    write_aclimdb(tmp_path / "data")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lra_bench.prepare",
            "task=text",
            f"data_dir={tmp_path / 'data'}",
            "task.max_length=64",
            "task.seq_len=64",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "[text] source: raw:" in out and "val = IMDB test" in out and "cache:" in out
    for split in ("train", "val", "test"):
        assert f"  {split} " in out
    assert "0:4 1:4" in out  # label balance per split
    assert "len min/median/max" in out and "/64" in out
    (cache,) = (tmp_path / "data" / "cache" / "text").iterdir()
    tokens = json.loads((cache / "tokens.json").read_text())["digest"]  # the digest a run's identity will name
    assert f"  tokens: {tokens} (data.tokens" in out


def test_missing_source_is_one_error_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "data").mkdir()
    assert prepare.main(["task=image", f"data_dir={tmp_path / 'data'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert "cifar-10-batches-py" in err and "1. official archive" in err and "2. Hugging Face" in err
    assert "3. our generator" in err


def test_pathfinder_report_counts_empty_pngs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_pathfinder(tmp_path / "data", per_folder=10, empty=(4, 13))
    code = prepare.main(
        [
            "task=pathfinder",
            f"data_dir={tmp_path / 'data'}",
            f"cache_dir={tmp_path / 'c'}",
            "task.generate_if_missing=false",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "skipped_empty_pngs: 2" in out and "seed 42" in out


def test_protocol_task_settings_reach_the_cache(tmp_path: Path) -> None:
    write_aclimdb(tmp_path / "data")
    report = prepare.prepare(compose(["task=text", "protocol=lra_original", f"data_dir={tmp_path / 'data'}"]))
    assert report["data_info"]["text_length"] == 1000 and report["data_info"]["seq_len"] == 1024


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["task=text", "epochs=3"], "epochs"),
        (["task=nope"], "task/nope"),
        (["task=text", "protocol=nope"], "protocol/nope"),
        (["task=text", "task.no_such_field=1"], "no_such_field"),
        (["task=text", "task.val_split=bad"], "holdout"),
    ],
)
def test_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert prepare.main([*argv, f"data_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
