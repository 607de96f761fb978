"""A task whose data is missing says so first and at once, from a real `run.py` in an empty data dir.

With no offline variable set, `datasets` used to ask the Hugging Face hub for IMDB, retrying with back-off through
~20 warnings for 30-60 s before the clear message. The hub is now asked only when the user allows it
(`HF_HUB_OFFLINE=0`), and then probed first. `HF_ENDPOINT` points at a closed local port, so no test can reach the
real hub whatever the machine's network (nothing downloads), and an attempt shows up as retry warnings.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli

CLOSED_PORT = "http://127.0.0.1:9"  # the discard port: nothing listens, a connection is refused at once


def _text_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **env: str) -> list[str]:
    for var in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):  # a user who set neither
        monkeypatch.delenv(var)
    proc = run_cli(
        ["task=text", "attn=full", "logger=csv"], tmp_path, check=False, env={"HF_ENDPOINT": CLOSED_PORT, **env}
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Retry" not in proc.stdout + proc.stderr and "Retrying" not in proc.stdout + proc.stderr
    # nothing before the message but the run's opening line (what it is, said before any data step:
    # `console.opening_line`): no config tree, no logging
    shown = proc.stdout.strip().splitlines()
    assert len(shown) <= 1 and all(line.startswith("[lra-bench] on protocol ") for line in shown), proc.stdout[-3000:]
    return proc.stderr.splitlines()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_without_an_offline_setting_local_sources_only_and_the_message_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = _text_run(tmp_path, monkeypatch)
    assert lines[0].startswith("error: text (IMDB): 'imdb' is not readable from the local Hugging Face cache")
    assert "the hub was not asked" in lines[0] and "HF_HUB_OFFLINE=0 lets a run download it" in lines[0]
    assert any(str(tmp_path / "data" / "aclImdb") in line for line in lines)  # where the local copies were looked for


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_allowed_hub_that_does_not_answer_is_one_line_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = _text_run(tmp_path, monkeypatch, HF_HUB_OFFLINE="0")
    assert lines[0].startswith("error: text (IMDB): the Hugging Face hub is allowed"), lines[:3]
    assert f"{CLOSED_PORT} is not reachable" in lines[0]
