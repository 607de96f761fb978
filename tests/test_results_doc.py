"""docs/results.md names its inputs as a reader can use them: run dirs below the repository relative to it (no path
of the machine that rendered it), anything else as given."""

from __future__ import annotations

from pathlib import Path

import pytest

from lra_bench.results_doc import shown_path


def test_inputs_below_the_working_dir_are_named_relative_to_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert shown_path(str(tmp_path / "outputs" / "results" / "bench")) == "outputs/results/bench"
    assert shown_path("/elsewhere/results/bench") == "/elsewhere/results/bench"
