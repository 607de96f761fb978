"""Finding results: run folder names that never show a cut value, a `latest` link per task/attention, `curves.png`
and the next command at the end of a run, and `python -m lra_bench.runs` — all on a real `run.py` process."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from lra_bench.config.setup import MAX_NAME, override_items
from lra_bench.record import results
from tests.conftest import REPO, TINY_LISTOPS, run_cli

ARGS = [*TINY_LISTOPS, "attn=full", "seed=3", "diagnostics.enabled=false"]


def runs(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`python -m lra_bench.runs ARGS` as a user types it (wide terminal, so rows are not folded)."""
    env = {**os.environ, "COLUMNS": "400", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "lra_bench.runs", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def row_with(stdout: str, needle: str) -> list[str]:
    (line,) = [line for line in stdout.splitlines() if needle in line]
    return line.split()


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("runs")
    proc = run_cli(ARGS, tmp)
    return tmp, proc


def test_a_long_run_name_keeps_whole_values_and_the_seed(finished: tuple[Path, subprocess.CompletedProcess]) -> None:
    tmp, _ = finished
    (run_dir,) = [p for p in (tmp / "outputs" / "listops" / "full").iterdir() if not p.is_symlink()]
    name = run_dir.name
    assert len(name) <= MAX_NAME
    given = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in ARGS}
    by_last_component = {key.rsplit(".", 1)[-1]: value for key, value in given.items()}
    body, _, digest = name.rpartition("-")
    assert len(digest) == 10 and all(c in "0123456789abcdef" for c in digest)
    body, more = re.subn(r"\+\d+_more$", "", body)  # how many whole items were left out
    shown = override_items(body)
    assert more == 1 and "seed-3" in shown and len(shown) >= 4
    for item in shown:  # every value in the name is a whole value of the command (gen_num_test-16, never -1)
        key, _, value = item.partition("-")
        assert by_last_component.get(key, given.get(key)) == value, (item, name)


def test_latest_points_at_the_run_and_the_summary_ends_with_curves_and_next_commands(
    finished: tuple[Path, subprocess.CompletedProcess],
) -> None:
    tmp, proc = finished
    group = tmp / "outputs" / "listops" / "full"
    latest = group / "latest"
    assert latest.is_symlink() and not os.path.isabs(os.readlink(latest))  # relative: the tree can move
    record = json.loads((latest / "results.json").read_text())
    assert Path(record["run"]["output_dir"]).resolve() == latest.resolve()
    curves = latest / "curves.png"
    with Image.open(curves) as image:
        assert image.format == "PNG" and image.size[0] >= 600
    lines = [line.rstrip() for line in proc.stdout.splitlines() if line.strip()]
    assert lines[-3] == f"curves:        {record['run']['output_dir']}/curves.png"
    assert lines[-2].startswith(f"next:          python -m lra_bench.runs {tmp / 'outputs'}")
    assert lines[-1].strip().startswith(f"python -m lra_bench.compare {record['run']['output_dir']} <another run dir>")


def test_the_run_listing_shows_status_accuracy_step_overrides_and_filters(
    finished: tuple[Path, subprocess.CompletedProcess],
) -> None:
    tmp, _ = finished
    outputs = tmp / "outputs"
    run_dir = (outputs / "listops" / "full" / "latest").resolve()
    record = json.loads((run_dir / "results.json").read_text())
    # a second run that was killed: its record still says `running`, no process holds its dir, its CSV says step 4
    killed = run_dir.parent / "killed"
    shutil.copytree(run_dir, killed)
    stale = {**record, "status": "running", "metrics": {**record["metrics"], "train_steps": None, "test_acc": None}}
    (killed / "results.json").write_text(json.dumps(stale))

    proc = runs(str(outputs))
    assert proc.returncode == 0, proc.stderr
    done = row_with(proc.stdout, str(run_dir))
    assert done[:3] == ["completed", "listops", "full"]
    assert f"{100 * record['metrics']['val_acc']:.2f}" in done and f"{100 * record['metrics']['test_acc']:.2f}" in done
    assert "4/4" in done and "task.max_length=64" in done  # the overrides column folds: the rest on the next lines
    assert "seed=3" in proc.stdout and "model.dim=16" in proc.stdout
    assert not any(word in proc.stdout for word in ("output_root=", "data_dir=", "print_config=", "logger="))
    stopped = row_with(proc.stdout, str(killed))
    assert stopped[0] == "stopped" and "4/4" in stopped and "—" in stopped
    assert "2 of 2 runs: 1 completed, 1 stopped" in proc.stdout

    only_stopped = runs(str(outputs), "--status", "stopped")
    assert str(killed) in only_stopped.stdout and str(run_dir) + " " not in only_stopped.stdout + " "
    assert "1 of 2 runs: 1 stopped" in only_stopped.stdout
    assert "0 of 2 runs" in runs(str(outputs), "--attn", "gpa").stdout
    assert "2 of 2 runs" in runs(str(outputs), "--where", "seed=3", "model.dim=16").stdout
    assert "0 of 2 runs" in runs(str(outputs), "--where", "seed=4").stdout
    # from the output root's parent: paths are shown relative, so they paste
    relative = runs("outputs", cwd=tmp)
    assert f"outputs/listops/full/{run_dir.name}" in relative.stdout


def test_the_run_listing_refuses_a_dir_without_runs_with_one_line(tmp_path: Path) -> None:
    for args, words in (([str(tmp_path / "nowhere")], "no such directory"), ([str(tmp_path)], "no results.json")):
        proc = runs(*args)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0]


def test_a_resumed_runs_curve_joins_its_attempts_and_counts_steps_done(tmp_path: Path) -> None:
    """Two attempts in Lightning's CSV layout (`csv/version_N/metrics.csv`, the step index of the step just taken):
    the second resumed from step 3, so its rows replace the first's from there; rows after training (test,
    efficiency) are no curve's."""
    from lra_bench.run.curves import read_metrics

    first = tmp_path / "csv" / "version_0"
    second = tmp_path / "csv" / "version_1"
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    header = "epoch,step,train/loss,val/acc,test/acc,efficiency/params\n"
    (first / "metrics.csv").write_text(header + "".join(f"0,{s},{2.0 - s / 10},,,\n" for s in range(6)))
    rows = "".join(f"0,{s},{1.0 - s / 10},,,\n" for s in range(3, 8)) + "0,7,,0.5,,\n0,8,,,0.4,\n0,8,,,,6218\n"
    (second / "metrics.csv").write_text(header + rows)
    metrics = read_metrics(tmp_path)
    losses = metrics.dropna(subset=["train/loss"])
    assert losses["step"].tolist() == [1, 2, 3, 4, 5, 6, 7, 8]  # steps done, each once
    assert losses["train/loss"].tolist() == pytest.approx([2.0, 1.9, 1.8, 0.7, 0.6, 0.5, 0.4, 0.3])
    assert metrics.dropna(subset=["val/acc"])["step"].tolist() == [8] and metrics["test/acc"].isna().all()


def test_into_a_pipe_every_row_stays_on_one_line(tmp_path: Path) -> None:
    """Not a terminal (`python -m lra_bench.runs DIR > file`): rich drew 80 columns and folded a row's overrides one
    per line under it; now the table keeps its natural width."""
    run_dir = tmp_path / "outputs" / "listops" / "full" / "wide"
    given = ["optim.lr=0.0005", "model.dim=128", "model.depth=4", "trainer.max_steps=4000", "task.gen_num_train=96000"]
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {item}\n" for item in ["attn=full", *given]))
    record = results.empty_record()
    record.update(status="completed", task="listops", attn="full", seed=0)
    record["run"].update(name="wide", output_dir=str(run_dir))
    record["metrics"].update(val_acc=0.5, test_acc=0.25, train_steps=4000)
    results.write_atomic(run_dir / results.FILENAME, record)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")} | {"PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "lra_bench.runs", "outputs"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == 3, proc.stdout  # the header, the run, the count
    row = lines[1]
    assert len(row) > 80 and row.split()[:3] == ["completed", "listops", "full"], row
    assert " ".join(given) in row and row.endswith("outputs/listops/full/wide"), row
