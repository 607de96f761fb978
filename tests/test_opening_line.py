"""A run's first line says what it is, before it prepares its data (issue 30, items 2 and 8).

Plain `python run.py` is the faithful protocol (5,000 steps of ListOps at length 2,048): its line names the schedule,
how long it takes on this CPU when committed reproductions measured it here (never a guessed duration), and the
preset for a quick look. A preset says it is one and is never ranked beside published rows, instead of listing the
protocol keys it changes (they stay in the record). Read from real `run.py` processes; the data is refused at once
(a `listops-1000/` holding other files), so nothing is generated or trained where only the first line matters.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lra_bench.config.spec import settle_kernels
from lra_bench.record.identity import identity_of
from lra_bench.record.provenance import hardware
from lra_bench.reproduction_runs import EVIDENCE_ROOT
from lra_bench.run.console import QUICK_LOOK, measured_here
from tests.conftest import REPO, STOPPED, TINY_LISTOPS, compose, run_cli


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """`python run.py ARGS` with its data refused at once: stdout and stderr as one stream, in order."""
    data = tmp_path / "data"
    (data / "listops-1000").mkdir(parents=True)
    (data / "listops-1000" / "notes.txt").write_text("not ListOps")
    cmd = [sys.executable, str(REPO / "run.py"), *args, f"output_root={tmp_path / 'out'}", f"data_dir={data}"]
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_plain_run_py_says_it_is_the_faithful_protocol_before_its_data(tmp_path: Path) -> None:
    proc = _run(tmp_path)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 2, proc.stdout
    first, refusal = lines
    assert refusal.startswith("error: ") and "listops-1000" in refusal  # the data step came after the line
    assert first.startswith(
        "[lra-bench] on protocol nystromformer (faithful): 5,000 steps of batch 32 at length 2,048, 62 val batches "
        "every 50 steps — "
    ), first
    assert first.endswith(f". Quick look on a small generated ListOps: python run.py experiment={QUICK_LOOK} attn=gpa")
    # The committed gpa runs this CPU completed on the encoder path plain run.py takes: a run on another kernel path
    # (the reproductions run `model.kernels=eager`, plain run.py its default) is another experiment, whose time is not
    # this one's, and so is never said (the selection's other rules: the test below).
    plain = compose(["task=listops", "attn=gpa"])
    settle_kernels(plain)  # `auto` becomes the path plain run.py computes on here, as its record names it
    here, path = EVIDENCE_ROOT / "nystromformer" / "listops" / "gpa", plain.model.kernels
    records = [json.loads(p.read_text()) for p in here.glob("seed-*/results.json")]
    measured = [
        r
        for r in records
        if r["env"]["hardware"].get("cpu_id") == hardware()["cpu_id"]
        and identity_of(r)["model.kernels"] == path  # (a record from before the choice: its baseline path)
    ]
    if measured:  # this CPU ran the protocol: the line says how long it took here, and where that is from
        assert " — about " in first and f"on this CPU ({len(measured)} completed run" in first, first
        assert "reproductions/nystromformer/listops/gpa)" in first
    else:
        assert " — no run of it recorded on this CPU; it projects its time after a validation." in first


def _record(root: Path, seed: int, cpu_id: str, hours: float) -> dict:
    """The committed gpa record of a completed reproduction, copied to `root/<protocol>/<task>/<attn>/seed-<seed>`
    as if timed on this machine's CPU name and vector unit with `cpu_id`, in one attempt of `hours`."""
    source = next(EVIDENCE_ROOT.glob("nystromformer/listops/gpa/seed-*/results.json"))
    record = json.loads(source.read_text())
    record["env"]["hardware"] = {**hardware(), "cpu_id": cpu_id}
    record["env"]["runtime"]["threads"] = 1
    start = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    record["run"]["segments"] = [{"started_at": start.isoformat(), "from_step": 0}]
    record["run"]["finished_at"] = (start + dt.timedelta(hours=hours)).isoformat()
    folder = root / "nystromformer" / "listops" / "gpa" / f"seed-{seed}"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps(record))
    return record


def test_the_duration_is_measured_on_this_cpu_or_not_given(tmp_path: Path, monkeypatch) -> None:
    """Only completed on-protocol runs of the same experiment on this CPU count; their median wall time is said."""
    import lra_bench.reproduction_runs as runs

    completed, root = runs.completed_runs, tmp_path / "evidence"
    monkeypatch.setattr(runs, "completed_runs", lambda p, t, a: completed(p, t, a, root=root))
    record = _record(root, 0, "another cpu", 9.0)  # another CPU's run never counts
    assert measured_here(record) is None
    for seed, hours in ((1, 1.5), (2, 2.5), (3, 1.0)):
        _record(root, seed, str(hardware()["cpu_id"]), hours)
    line = measured_here(record)
    assert line == f"about 1.5 h on this CPU (3 completed runs of it here, 1 thread: {root}/nystromformer/listops/gpa)"
    other = {**record, "config": {**record["config"], "optim": {**record["config"]["optim"], "lr": 1.0}}}
    assert measured_here(other) is None  # another experiment: its time is not this one's


@pytest.mark.slow
def test_a_preset_says_it_is_one_and_its_record_keeps_the_deviations(tmp_path: Path) -> None:
    proc = run_cli(["experiment=smoke", *TINY_LISTOPS, "attn=full", "run_name=preset"], tmp_path)
    out = tmp_path / "outputs" / "listops" / "full" / "preset"
    record = json.loads((out / "results.json").read_text())
    assert record["status"] == "completed" and record["off_protocol"] is True
    deviations = record["deviations"]
    assert "optim.lr" in deviations and "task.gen_num_train" in deviations  # the preset's own changes, recorded
    first = next(line for line in proc.stdout.splitlines() if line.startswith("[lra-bench]"))
    assert first == (
        "[lra-bench] preset smoke: not the nystromformer protocol, so never ranked beside published rows; "
        f"results.json lists the {len(deviations)} settings it changes"
    )
    assert "OFF protocol" not in proc.stdout and "changes optim.lr" not in proc.stdout
    assert proc.stdout.index(first) < proc.stdout.index("[listops] ")  # before the data step


def test_readme_shows_what_plain_run_py_and_a_preset_print(tmp_path: Path) -> None:
    """The README's first screen quotes the two opening lines as a run prints them (the duration is this CPU's)."""
    readme = (REPO / "README.md").read_text()
    faithful = _run(tmp_path / "a").stdout.splitlines()[0]
    preset = _run(tmp_path / "b", "experiment=smoke", "attn=nystrom").stdout.splitlines()[0]
    head, _, tail = faithful.partition(" — ")
    quick = tail[tail.index("Quick look") :]
    assert head in readme and quick in readme, faithful
    assert preset in readme, preset


def test_readme_shows_the_last_line_of_a_stopped_run_as_runs_print_it() -> None:
    """Robustness, "Signals": the example has the form the Ctrl-C tests read from real runs (`STOPPED`)."""
    shown = [li.strip() for li in (REPO / "README.md").read_text().splitlines() if "[lra-bench] stopped by" in li]
    assert shown and all(STOPPED.fullmatch(line) for line in shown), shown
