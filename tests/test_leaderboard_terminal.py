"""Tables in the terminal and honest plots: `python -m lra_bench.leaderboard` prints its main table (rich) and
`leaderboard.md` shows published tables only for the protocols of its runs; `python -m lra_bench.compare` draws its
main table in a real terminal (pty) and stays markdown when piped; the per-task plot and the Pareto chart draw the
same error bars (the 95% intervals, clipped to [0, 100]) and say so, with legends that cover no point."""

from __future__ import annotations

import csv
import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lra_bench.leaderboard import build_leaderboard, pareto, render, uncertainty
from lra_bench.record import results
from tests.conftest import REPO
from tests.test_compare import planted, write_run

#: per attention, three seeds' ListOps test accuracy: `sharp` sits near 100%, so its t-interval reaches past it
ACCURACIES = {"full": (0.36, 0.37, 0.38), "gpa": (0.40, 0.41, 0.39), "nystrom": (0.35, 0.37, 0.33)}
SHARP = (0.99, 1.0, 0.97)
STEP_S = {"full": 0.08, "gpa": 0.03, "nystrom": 0.04, "spectral": 0.05}


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("board")
    for attn, accs in {**ACCURACIES, "spectral": SHARP}.items():
        for seed, acc in enumerate(accs):
            run = write_run(root / f"{attn}_{seed}", attn=attn, seed=seed, correct=None, acc=acc, step_s=STEP_S[attn])
            record = results.read_record(run / results.FILENAME)
            record["data"]["seq_len"] = 2048  # what a run records; the Pareto chart's speed reference needs it
            results.write_atomic(run / results.FILENAME, record)
    out = root / "board"
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    proc = subprocess.run(
        [sys.executable, "-m", "lra_bench.leaderboard", str(root), "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"root": root, "out": out, "stdout": proc.stdout, "md": (out / "leaderboard.md").read_text()}


def test_the_leaderboard_prints_its_main_table_with_the_protocols_published_rows(board: dict[str, Any]) -> None:
    stdout = board["stdout"]
    assert "protocol nystromformer: test accuracy (%)" in stdout and "┃ method" in stdout  # a drawn table
    gpa = next(line for line in stdout.splitlines() if "│ gpa" in line)
    assert "40.00 ± 1.00 (n=3)" in gpa and "│ ours" in gpa
    assert "published: Nyströmformer Table 3" in stdout
    assert "Skyformer" not in stdout and "LRA (JAX)" not in stdout  # protocols none of these runs followed
    assert stdout.rstrip().splitlines()[-1].endswith(".png")  # the files it wrote still follow the table


def test_leaderboard_md_shows_published_tables_only_for_the_protocols_present(board: dict[str, Any]) -> None:
    md = board["md"]
    published = md.split("## Published reference rows (not ours)")[1].split("\n## ")[0]
    assert "### Nyströmformer Table 3" in published
    assert "### Skyformer Table 1" not in published and "### LRA (JAX)" not in published
    assert "Published tables of other protocols, not shown: LRA (JAX) README/paper table, Skyformer Table 1" in md
    with open(board["out"] / "leaderboard_wide.csv", newline="") as fh:  # the data file keeps every published row
        assert {"Skyformer Table 1", "Nyströmformer Table 3"} <= {r["source"] for r in csv.DictReader(fh)}


def test_intervals_are_clipped_to_0_100_and_the_clipping_is_said(board: dict[str, Any]) -> None:
    with open(board["out"] / "leaderboard.csv", newline="") as fh:
        sharp = next(r for r in csv.DictReader(fh) if r["attn"] == "spectral")
    mean = 100 * float(np.mean(SHARP))
    assert float(sharp["test_acc_mean"]) == pytest.approx(mean) and float(sharp["test_acc_ci_high"]) == 100.0
    assert 0.0 < float(sharp["test_acc_ci_low"]) < mean
    assert f"{mean:.2f} [{float(sharp['test_acc_ci_low']):.2f}, 100.00]" in board["md"]
    assert uncertainty.CLIPPED in board["md"]


def _bars(fig: Any) -> list[tuple[float, float, float]]:
    """(x, low, high) of every error bar drawn in `fig`."""
    out = []
    for ax in fig.axes:
        for container in ax.containers:
            for collection in getattr(container, "lines", (None, None, ()))[2]:
                for (x, low), (_, high) in collection.get_segments():
                    out.append((float(x), float(low), float(high)))
    return out


def _legend_hides_nothing(fig: Any) -> None:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    assert legends
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent(renderer)), "a legend lies over a plot"


def test_both_plots_draw_the_same_clipped_intervals_and_say_which(board: dict[str, Any]) -> None:
    result = build_leaderboard([board["root"]], board["root"] / "again")
    rows = [r for r in result["rows"] if r["task"] == "listops"]
    intervals = {(round(r["test_acc_ci_low"], 6), round(r["test_acc_ci_high"], 6)) for r in rows}
    assert any(high == 100.0 for _, high in intervals)  # `spectral`'s, clipped

    task_fig = render.task_figure("listops", rows)
    assert uncertainty.ERROR_BARS in task_fig._suptitle.get_text()
    assert {(round(lo, 6), round(hi, 6)) for _, lo, hi in _bars(task_fig)} == intervals
    _legend_hides_nothing(task_fig)

    (chart,) = [c for c in result["pareto"] if c.target == "listops"]
    chart_fig = pareto.chart_figure(chart)
    assert uncertainty.ERROR_BARS in chart_fig.axes[0].get_title()
    assert {(round(lo, 6), round(hi, 6)) for _, lo, hi in _bars(chart_fig)} == intervals
    _legend_hides_nothing(chart_fig)


def _in_a_terminal(args: list[str], columns: int = 220) -> tuple[int, str]:
    """Run `python ARGS` with its stdout on a real pty of `columns` columns; return (exit status, what it printed,
    terminal escapes removed)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, columns, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm"}
    env.pop("COLUMNS", None)
    proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env, stdout=slave, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    text = b"".join(chunks).decode("utf-8", "replace")
    return proc.wait(timeout=120), re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)  # colours and bold dropped


def test_compare_draws_its_main_table_in_a_terminal_and_stays_markdown_when_piped(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for seed in range(3):
        a, b = planted(rng, 0.45, 0.40, n=500)
        write_run(tmp_path / f"gpa_{seed}", attn="gpa", seed=seed, correct=a)
        write_run(tmp_path / f"nys_{seed}", attn="nystrom", seed=seed, correct=b)
    args = ["-m", "lra_bench.compare", "attn=gpa", "attn=nystrom", "--in", str(tmp_path), "--resamples", "200"]
    code, shown = _in_a_terminal(args)
    assert code == 0, shown[-3000:]
    assert "┃ task" in shown and "│ ListOps" in shown  # drawn by rich
    assert "|---|" not in shown and "| task |" not in shown  # not a markdown pipe table
    assert "## Verdicts" in shown and "# compare: gpa / gpa" in shown  # the rest of the report
    piped = subprocess.run(
        [sys.executable, *args], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert piped.returncode == 0 and "| task | seeds |" in piped.stdout and "┃" not in piped.stdout


def _hashes(root: Path) -> dict[str, str]:
    """Every file below `root` (links too, by their target) with the SHA-256 of its bytes."""
    import hashlib

    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_the_leaderboard_leaves_the_folder_it_reads_as_it_was(board: dict[str, Any], tmp_path: Path) -> None:
    """`python -m lra_bench.leaderboard reproductions/` wrote its md/csv/png into the committed evidence: now its
    files go to `outputs/leaderboard/` of the current directory (or `--out`), the table to the terminal, and the
    folder it reads keeps every byte and gains no file."""
    before = _hashes(board["root"])
    here = tmp_path / "work"  # where the researcher stands
    here.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", "MPLBACKEND": "Agg", "WANDB_MODE": "disabled"}
    proc = subprocess.run(
        [sys.executable, "-m", "lra_bench.leaderboard", str(board["root"])],
        cwd=here, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _hashes(board["root"]) == before  # no file changed, none added, none removed
    out = here / "outputs" / "leaderboard"
    written = {p.name for p in out.iterdir()}
    assert {"leaderboard.md", "leaderboard.csv", "leaderboard_wide.csv", "leaderboard_listops.png"} <= written
    assert "protocol nystromformer: test accuracy (%)" in proc.stdout  # the table in the terminal
    assert f"  {Path('outputs') / 'leaderboard' / 'leaderboard.md'}" in proc.stdout.splitlines()
    helped = subprocess.run(
        [sys.executable, "-m", "lra_bench.leaderboard", "--help"], cwd=here, env=env, capture_output=True, text=True
    )
    assert "outputs/leaderboard" in " ".join(helped.stdout.split())
