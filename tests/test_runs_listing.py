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
from typing import Any

import pytest
from PIL import Image

from lra_bench.config.setup import MAX_NAME, override_items
from lra_bench.record import results
from lra_bench.run.rundir import RunDirLock
from tests.conftest import REPO, TINY_LISTOPS, run_cli

ARGS = [*TINY_LISTOPS, "attn=full", "seed=3", "diagnostics.enabled=false"]


def runs(*args: str, cwd: Path = REPO, stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess:
    """`python -m lra_bench.runs ARGS` as a user types it (wide terminal, so rows are not folded; in UTC, so a start
    time reads as its record says; no terminal on stdin unless `stdin` is one)."""
    env = {**os.environ, "COLUMNS": "400", "PYTHONPATH": str(REPO), "TZ": "UTC"}
    return subprocess.run(
        [sys.executable, "-m", "lra_bench.runs", *args],
        cwd=cwd,
        env=env,
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def write_run(
    run_dir: Path, status: str, started_at: str | None = None, task: str = "listops", attn: str = "full", **run: Any
) -> Path:
    """A run folder holding only its record, in the official schema (`results.empty_record`)."""
    record = results.empty_record()
    record.update(status=status, task=task, attn=attn, seed=0)
    record["run"].update(name=run_dir.name, output_dir=str(run_dir), started_at=started_at, **run)
    run_dir.mkdir(parents=True, exist_ok=True)
    results.write_atomic(run_dir / results.FILENAME, record)
    return run_dir


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
    from lra_bench.record.curves import read_metrics

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


def test_each_run_shows_when_it_started_and_sorts_by_it(tmp_path: Path) -> None:
    """The start is the run's first: a resumed run's record carries its last attempt's start, its first segment the
    run's; a record without one shows `—`. `--sort started` orders oldest first, the default by task and attention."""
    group = tmp_path.resolve() / "outputs"
    write_run(group / "text" / "full" / "a", "completed", "2025-03-02T09:15:00+00:00", task="text")
    write_run(group / "listops" / "gpa" / "b", "failed", "2025-03-01T23:59:30+00:00", attn="gpa")
    resumed = [{"started_at": "2025-02-27T08:00:00+00:00", "from_step": 0}, {"started_at": "2025-03-03T10:00:00+00:00"}]
    write_run(group / "listops" / "full" / "c", "interrupted", "2025-03-03T10:00:00+00:00", segments=resumed)
    write_run(group / "listops" / "nystrom" / "d", "completed", None, attn="nystrom")

    by_task = runs(str(group))
    assert by_task.returncode == 0, by_task.stderr
    header, *lines = by_task.stdout.splitlines()[:5]
    assert "started" in header.split()
    expected = [f"{group}/{x}" for x in ("listops/full/c", "listops/gpa/b", "listops/nystrom/d", "text/full/a")]
    assert [line.split()[-1] for line in lines] == expected
    assert row_with(by_task.stdout, "full/a")[-3:-1] == ["2025-03-02", "09:15"]
    assert row_with(by_task.stdout, "gpa/b")[-3:-1] == ["2025-03-01", "23:59"]
    assert row_with(by_task.stdout, "full/c")[-3:-1] == ["2025-02-27", "08:00"]  # when the run first started
    assert row_with(by_task.stdout, "nystrom/d")[-2] == "—"

    by_start = runs(str(group), "--sort", "started")
    assert by_start.returncode == 0, by_start.stderr
    order = [line.split()[-1].rsplit("/", 1)[-1] for line in by_start.stdout.splitlines()[1:5]]
    assert order == ["d", "c", "b", "a"]
    only_failed = runs(str(group), "--status", "failed", "interrupted", "--sort", "started")
    assert [line.split()[-1][-1] for line in only_failed.stdout.splitlines()[1:3]] == ["c", "b"]
    assert "2 of 4 runs: 1 failed, 1 interrupted" in only_failed.stdout


@pytest.fixture
def mixed(tmp_path: Path, finished: tuple[Path, subprocess.CompletedProcess]) -> dict[str, Path]:
    """A results dir of every kind of run: a completed real run (a copy of the module's), a failed one the `latest`
    link points at, an interrupted one, a stopped one (killed: says running, no holder), a running one (this test
    process holds its lock, as `run.py` does while it runs), and a failed one whose `eval/` holds a checkpoint's
    evaluated record."""
    source = (finished[0] / "outputs" / "listops" / "full" / "latest").resolve()
    group = tmp_path.resolve() / "outputs" / "listops" / "full"
    group.mkdir(parents=True)
    shutil.copytree(source, group / "done")
    dirs = {
        "completed": group / "done",
        "failed": write_run(group / "broke", "failed", "2025-03-01T10:00:00+00:00"),
        "interrupted": write_run(group / "halted", "interrupted", "2025-03-01T11:00:00+00:00"),
        "stopped": write_run(group / "killed", "running", "2025-03-01T12:00:00+00:00"),
        "running": write_run(group / "live", "running", "2025-03-01T13:00:00+00:00"),
        "holder": write_run(group.parents[1] / "text" / "gpa" / "broke", "failed", "2025-03-01T09:00:00+00:00"),
    }
    write_run(dirs["holder"] / "eval" / "best-4", "evaluated", "2025-03-01T09:30:00+00:00", task="text", attn="gpa")
    (group / "latest").symlink_to("broke", target_is_directory=True)
    return dirs


def tree(root: Path) -> dict[str, bytes]:
    """Every file below `root` with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_remove_deletes_the_failed_interrupted_and_stopped_runs_listed_and_nothing_else(
    mixed: dict[str, Path], tmp_path: Path
) -> None:
    outputs = tmp_path / "outputs"
    live = RunDirLock(mixed["running"]).acquire()
    try:
        before = tree(outputs)
        refused = runs(str(outputs), "--remove")  # no terminal to ask on, no --yes
        lines = [line for line in refused.stderr.splitlines() if line.strip()]
        assert refused.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "--yes" in lines[0]
        assert refused.stdout == "" and tree(outputs) == before

        only_failed = runs(str(outputs), "--remove", "--yes", "--status", "failed", "--task", "listops")
        assert only_failed.returncode == 0, only_failed.stderr
        assert not mixed["failed"].exists() and mixed["interrupted"].is_dir() and mixed["holder"].is_dir()
        assert not os.path.lexists(mixed["failed"].parent / "latest")  # the link to it went with it
        assert "removed 1 of 1 run folders" in only_failed.stdout

        proc = runs(str(outputs), "--remove", "--yes")
        assert proc.returncode == 0, proc.stderr
        assert str(mixed["interrupted"]) in proc.stdout and str(mixed["stopped"]) in proc.stdout
        assert not mixed["interrupted"].exists() and not mixed["stopped"].exists()
        assert mixed["completed"].is_dir() and mixed["running"].is_dir()
        assert (mixed["holder"] / "eval" / "best-4" / "results.json").is_file()  # its folder holds a kept record
        assert "removed 2 of 2 run folders" in proc.stdout
        kept = next(line for line in proc.stdout.splitlines() if line.startswith("kept: "))
        for why in ("completed (--include-completed", "running (a process holds", "evaluated (--include-completed"):
            assert f"1 {why}" in kept, kept
        assert "1 holding a run that stays" in kept, kept

        everything = runs(str(outputs), "--remove", "--yes", "--include-completed")
        assert everything.returncode == 0, everything.stderr
        assert not mixed["completed"].exists() and not mixed["holder"].exists()
        assert (mixed["running"] / "results.json").is_file()  # never a run a process holds
        assert "kept: 1 running (a process holds them)" in everything.stdout
    finally:
        live.release()


def test_remove_asks_on_a_terminal_and_a_no_keeps_everything(mixed: dict[str, Path], tmp_path: Path) -> None:
    """On a terminal `--remove` asks; no lock is held here, so the `running` record is a killed run's (stopped)."""
    import pty

    outputs = tmp_path / "outputs"
    before = tree(outputs)
    for answer, code in (("n", 1), ("y", 0)):
        controller, terminal = pty.openpty()
        try:
            os.write(controller, f"{answer}\n".encode())  # typed ahead: the terminal holds it until it is read
            proc = runs(str(outputs), "--remove", stdin=terminal)
        finally:
            os.close(terminal)
            os.close(controller)
        assert proc.returncode == code, proc.stdout + proc.stderr
        assert "remove these 4 run folders (" in proc.stdout and "? [y/N]" in proc.stdout
        if answer == "n":
            assert "nothing removed" in proc.stdout and tree(outputs) == before
    assert not any(mixed[k].exists() for k in ("failed", "interrupted", "stopped", "running"))
    assert mixed["completed"].is_dir() and mixed["holder"].is_dir()


@pytest.mark.timeout(900)
def test_an_offline_wandb_run_ends_with_the_command_that_uploads_it(
    tmp_path: Path, finished: tuple[Path, subprocess.CompletedProcess]
) -> None:
    """The W&B logger offline (`logger=default`): the summary names `wandb sync <its offline run dir>`, a command
    wandb accepts; once uploaded (wandb's `.synced` marker) the line is gone; a run without W&B never has it."""
    assert "wandb sync" not in finished[1].stdout  # logger=csv
    args = [*(a for a in ARGS if a != "logger=csv"), "logger=default"]
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wandb-dir")}
    proc = run_cli(args, tmp_path, env=env)
    run_dir = (tmp_path / "outputs" / "listops" / "full" / "latest").resolve()
    run_id = (run_dir / "wandb_id.txt").read_text().strip()
    (part,) = sorted((run_dir / "wandb").glob("offline-run-*"))
    lines = [line.rstrip() for line in proc.stdout.splitlines()]
    (line,) = [line for line in lines if "wandb sync" in line]
    assert line.startswith(f"W&B offline:   wandb sync {part}    # ") and part.name.endswith(run_id), line
    assert lines.index(line) < lines.index(next(x for x in lines if x.startswith("next:")))  # before what comes next
    wandb = Path(sys.executable).with_name("wandb")
    dry = subprocess.run(
        [str(wandb), "sync", "--dry-run", str(part)], capture_output=True, text=True, timeout=120, env=os.environ | env
    )
    assert dry.returncode == 0 and "Would sync 1 run(s)" in dry.stdout + dry.stderr, dry.stdout + dry.stderr

    (part / f"run-{run_id}.wandb.synced").touch()  # what `wandb sync` leaves in a part it uploaded
    again = run_cli(args, tmp_path, env=env)  # a completed run: prints its summary again, changes nothing
    assert "already completed" in again.stdout and "wandb sync" not in again.stdout
