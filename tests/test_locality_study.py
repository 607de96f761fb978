"""The locality study (`python -m lra_bench.locality`): its settings and bad input, its numbers (intervals, the window
chosen on validation), its section in docs/results.md, and (slow) a real study of `run.py` processes in which a
window that holds the sequence trains exactly as `full` does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scipy import stats

from lra_bench.locality import report
from lra_bench.locality.settings import DEFAULT_WINDOWS, RUN_DEFAULTS, SettingsError, parse
from lra_bench.reports.results_doc import main as results_doc
from tests.conftest import REPO, TINY_LISTOPS


def test_study_keys_are_parsed_and_everything_else_goes_to_every_run() -> None:
    settings = parse(["task=listops", "windows=[16,4]", "methods=[full,gpa]", "seeds=[1,0]", "trainer.max_steps=300"])
    assert settings.windows == (4, 16) and settings.methods == ("full", "gpa") and settings.seeds == (0, 1)
    assert settings.run_overrides == (*RUN_DEFAULTS, "task=listops", "trainer.max_steps=300")
    assert parse(["logger=none"]).run_overrides == ("callbacks.progress_bar=false", "print_config=false", "logger=none")
    assert parse([]).windows == DEFAULT_WINDOWS


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["windows=[0,4]"], "windows=[0, 4]: expected a non-empty list of integers >= 1"),
        (["windows=[]"], "windows=[]: expected a non-empty list of integers >= 1"),
        (["windows=[4,4]"], "windows=[4, 4]: a value is listed twice"),
        (["seeds=[-1]"], "seeds=[-1]: expected a non-empty list of integers >= 0"),
        (["methods=[local]"], "methods=['local']: expected a list of distinct attentions other than local"),
        (["methods=[fulll]"], "from: full, gpa"),
        (["attn=full"], "attn=full: the study sets attn for each run itself"),
        (["windows"], "'windows': expected key=value"),
    ],
)
def test_bad_settings_name_the_key_the_value_and_what_is_valid(argv: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=None) as err:
        parse(argv)
    assert message in str(err.value)


def _study(args: list[str], cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "lra_bench.locality", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    proc = _study(["windows=[0]", f"out={tmp_path / 'study'}"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: windows=[0]: expected a non-empty list of integers >= 1, "
                                                "e.g. windows=[1,4,16]"]  # fmt: skip
    assert not (tmp_path / "study").exists()


def test_a_run_override_run_py_refuses_is_the_studys_bad_input(tmp_path: Path) -> None:
    proc = _study(["windows=[2]", "methods=[full]", "optim.lr=abc", f"out={tmp_path / 'study'}"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["error: optim.lr='abc': expected a number > 0"]
    assert not (tmp_path / "study" / "locality.json").exists()


def _row(label: str, window: int | None, seed: int, test: float, val: float, distance: float = 1.0) -> dict:
    return {"label": label, "attn": "local" if window else label, "window": window, "seed": seed, "status": "completed",
            "test_acc": test, "val_acc": val, "test_examples": 500, "train_steps": 400, "attn_distance": distance,
            "attn_distance_exact": 30.0, "mass_within_16": 1.0, "seq_len": 128, "task": "listops",
            "protocol": "nystromformer"}  # fmt: skip


def test_intervals_and_the_window_chosen_on_validation() -> None:
    rows = [
        _row("local w=4", 4, 0, 0.30, 0.31),
        _row("local w=4", 4, 1, 0.34, 0.33),
        _row("local w=64", 64, 0, 0.60, 0.20),  # best on test, worst on validation: never chosen
        _row("local w=16", 16, 0, 0.35, 0.40),
        _row("full", None, 0, 0.37, 0.38),
    ]
    summary = {e["label"]: e for e in report.summarize(rows)}
    assert [e["label"] for e in report.summarize(rows)] == ["local w=4", "local w=16", "local w=64", "full"]
    low, high = summary["local w=4"]["test_ci"]
    half = stats.t.ppf(0.975, 1) * stats.tstd([0.30, 0.34]) / 2**0.5
    assert (low, high) == pytest.approx((0.32 - half, 0.32 + half)) and summary["local w=4"]["ci_basis"] == "seeds"
    wilson = stats.binomtest(175, 500).proportion_ci(method="wilson")
    assert summary["local w=16"]["test_ci"] == pytest.approx((wilson.low, wilson.high))
    assert summary["local w=16"]["ci_basis"] == "test examples"
    assert report.best_window(list(summary.values()))["window"] == 16


def test_the_section_goes_into_docs_results_and_keeps_the_others(tmp_path: Path) -> None:
    rows = [_row("local w=4", 4, 0, 0.30, 0.31, 2.0), _row("local w=16", 16, 0, 0.35, 0.40, 7.0),
            _row("full", None, 0, 0.37, 0.38, 25.0)]  # fmt: skip
    study = {"settings": {"windows": [4, 16], "methods": ["full"], "seeds": [0], "run_overrides": ["experiment=demo"]},
             "rows": rows, "summary": report.summarize(rows), "unequal_keys": [], "wall_s": 100.0,
             "uptime_before": "up", "uptime_after": "up", "command": "python -m lra_bench.locality windows=[4,16]",
             "env": {"hardware": {"cpu": "test cpu", "cpu_count": 2}, "git_commit": "abc"}}  # fmt: skip
    folder = tmp_path / "study"
    folder.mkdir()
    study["plot"] = report.plot(study, folder)
    (folder / "locality.json").write_text(json.dumps(study))
    doc = tmp_path / "docs" / "results.md"
    doc.parent.mkdir()
    doc.write_text("# Results\n\nbody\n\n<!-- spt_study: begin -->\nkept\n<!-- spt_study: end -->\n")
    for _ in range(2):  # a second render replaces the section, never appends another
        results_doc(["--locality", str(folder), "--out", str(doc)])
    text = doc.read_text()
    assert text.count("<!-- locality: begin -->") == 1 and "<!-- spt_study: begin -->\nkept\n" in text
    assert "| `local w=16` | 35.0 [" in text and "Best window on validation: w = 16" in text
    assert "`full`: test 37.0 [" in text and "+2.0 points against the best window" in text
    assert (doc.parent / "img" / "locality-study.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.slow
def test_a_real_study_trains_each_arm_at_equal_budget(tmp_path: Path) -> None:
    """Windows 2 and 64 beside `full` on tiny ListOps (64 tokens): w = 64 holds every sequence, so its run trains
    exactly as full's does (same seed, same arithmetic); w = 2 reaches at most 2 tokens in every head."""
    out = tmp_path / "study"
    tiny = [a for a in TINY_LISTOPS if not a.startswith(("logger=", "callbacks.progress_bar=", "print_config="))]
    proc = _study(["windows=[2,64]", "methods=[full]", *tiny, "threads=1", f"out={out}", f"data_dir={tmp_path}/data"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = json.loads((out / "locality.json").read_text())
    rows = {r["label"]: r for r in study["rows"]}
    assert all(r["status"] == "completed" for r in rows.values())
    assert rows["local w=64"]["test_acc"] == rows["full"]["test_acc"]
    assert rows["local w=64"]["val_acc"] == rows["full"]["val_acc"]
    assert rows["local w=2"]["attn_distance"] <= 2 < rows["full"]["attn_distance"]
    assert study["unequal_keys"] == []
    assert "data_dir" not in study["command"] and str(tmp_path) not in (out / "locality.md").read_text()
    assert (out / "locality.png").read_bytes().startswith(b"\x89PNG")


def test_equal_budget_names_every_key_but_the_attention_selector_and_seed() -> None:
    from lra_bench.locality.runs import equal_budget

    base = {"attn.name": "local", "attn.window": 4, "seed": 0, "optim.lr": 1e-3, "trainer.max_steps": 400}
    rows = [
        {"status": "completed", "identity": base},
        {"status": "completed", "identity": base | {"attn.name": "gpa", "selector.name": "gpa", "seed": 1}},
        {"status": "failed", "identity": base | {"trainer.max_steps": 5}},  # never trained to the end: not compared
    ]
    assert equal_budget(rows) == []
    rows.append({"status": "completed", "identity": base | {"optim.lr": 2e-3}})
    assert equal_budget(rows) == ["optim.lr"]
