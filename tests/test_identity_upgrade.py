"""Runs whose identity predates `data.tokens` (its data part a path and a cache key that changed whenever the same
files were regenerated), on real `run.py` processes: a stopped one resumes in a fresh checkout's data (`run.py` takes
the folder over when its source files are the same bytes), and `python -m lra_bench.upgrade_identity` gives a
completed one today's identity — the very identity and fingerprint a run makes today — or leaves it, exit 1, when it
cannot show the data is the same.

The old form is made from today's run by replacing `data.tokens` by the two legacy keys (as runs before the change
wrote them), so the oracle is the identity the run itself recorded."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lra_bench.record.identity import fingerprint
from tests.conftest import REPO, TINY_LISTOPS, fault, run_cli

pytestmark = pytest.mark.slow

ARGS = [*TINY_LISTOPS, "attn=gpa", "trainer.max_steps=6", "run_name=old"]  # last.ckpt at the validations at 2, 4


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _write(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


def make_legacy(folder: Path) -> str:
    """Rewrite `folder`'s `identity.json` and `results.json` as a run before `data.tokens` wrote them; returns that
    old fingerprint."""
    record = _read(folder / "results.json")
    old = {k: v for k, v in record["identity"].items() if k != "data.tokens"}
    old |= {"data.source": "/elsewhere/listops-1000", "data.cache_key": "v1-62bba051f22d"}
    old = {k: old[k] for k in sorted(old)}
    _write(folder / "results.json", {**record, "identity": old, "fingerprint": fingerprint(old)})
    stored = _read(folder / "identity.json")
    _write(folder / "identity.json", {**stored, "identity": old, "fingerprint": fingerprint(old)})
    return fingerprint(old)


def upgrade(root: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "lra_bench.upgrade_identity", str(root)]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.mark.timeout(900)
def test_an_old_run_resumes_and_an_old_record_is_upgraded_to_todays_identity(tmp_path: Path) -> None:
    stopped = run_cli([*ARGS, *fault(nan_loss_at_step=5)], tmp_path, check=False)
    assert stopped.returncode != 0
    folder = tmp_path / "outputs" / "listops" / "gpa" / "old"
    today = _read(folder / "identity.json")  # what today's run made of this config and data
    old_fp = make_legacy(folder)
    for path in (tmp_path / "data" / "listops-1000").iterdir():  # regenerated: the same bytes, written later
        path.write_bytes(path.read_bytes())
    shutil.rmtree(tmp_path / "data" / "cache")

    resumed = run_cli(ARGS, tmp_path)  # the same command again, as `make reproduce` resumes a snapshot
    assert f"predates data.tokens (fingerprint {old_fp})" in resumed.stdout, resumed.stdout[-3000:]
    record = _read(folder / "results.json")
    assert record["status"] == "completed" and record["run"]["resumed_from_step"] == 4
    assert (record["identity"], record["fingerprint"]) == (today["identity"], today["fingerprint"])
    renewed = _read(folder / "identity.json")
    assert renewed["fingerprint"] == today["fingerprint"] and renewed["migrated_from"] == old_fp

    unproven = tmp_path / "runs" / "unproven"  # a record that never stated its source files' sha256
    shutil.copytree(folder, tmp_path / "runs" / "completed")
    shutil.copytree(folder, unproven)
    for name in ("completed", "unproven"):
        make_legacy(tmp_path / "runs" / name)
    bare = _read(unproven / "results.json")
    bare["data"]["origin"] = None
    _write(unproven / "results.json", bare)
    created = _read(tmp_path / "runs" / "completed" / "identity.json")["created_at"]

    proc = upgrade(tmp_path / "runs")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # one record could not be shown to be the same data
    assert "unproven: left as it is: its record states no sha256 of its source files" in proc.stdout
    upgraded = _read(tmp_path / "runs" / "completed" / "results.json")
    assert (upgraded["identity"], upgraded["fingerprint"]) == (today["identity"], today["fingerprint"])
    stored = _read(tmp_path / "runs" / "completed" / "identity.json")
    assert stored["identity"] == today["identity"] and stored["created_at"] == created
    assert "data.cache_key" in _read(unproven / "results.json")["identity"]  # left as it was

    changed = tmp_path / "data" / "listops-1000" / "basic_test.tsv"
    lines = changed.read_text().splitlines(keepends=True)
    changed.write_text("".join([lines[0], lines[2], lines[1], *lines[3:]]))  # the data differs now: refused too
    again = tmp_path / "again"
    shutil.copytree(tmp_path / "runs" / "completed", again / "run")
    make_legacy(again / "run")
    proc = upgrade(again)
    assert proc.returncode == 1 and "its source files or tokenizer differ now" in proc.stdout, proc.stdout
