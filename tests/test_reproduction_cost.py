"""Accuracy against cost on docs/reproductions.md (`lra_bench.reproduction_cost`): the cost columns come only from
runs on one machine and kernel path (the one most runs share), accuracy from every completed seed, and the figure
is drawn from the same rows."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from lra_bench import reproduce, reproduction_cost, reproductions
from tests.test_reproduction_claims import _record

ZEN5 = {"cpu": "AMD EPYC", "cpu_id": "family 26 model 2 stepping 1", "cpu_capability": "AVX512", "cpu_count": 2}
XEON = {"cpu": "Intel Xeon", "cpu_id": "family 6 model 143", "cpu_capability": "AVX512", "cpu_count": 2}


def _write(
    root: Path, attn: str, seed: int, acc: float, step_s: float, memory: float, hardware: dict, fused: bool = False
) -> None:
    folder = reproduce.evidence_dir("nystromformer", "listops", attn, seed, root)
    folder.mkdir(parents=True)
    record = _record(attn, seed, acc, step_s, memory) | {"env": {"hardware": hardware}}
    if fused:  # the identity names a kernel path only off its eager baseline (lra_bench.record.identity)
        record["identity"] = {**record.get("identity", {}), "model.kernels": "fused"}
    (folder / "results.json").write_text(json.dumps(record))


def test_cost_columns_come_from_one_machine_and_accuracy_from_every_seed(tmp_path: Path) -> None:
    root = tmp_path / "evidence"
    _write(root, "gpa", 0, 0.36, 0.78, 2600, ZEN5)
    _write(root, "gpa", 1, 0.37, 0.82, 2700, ZEN5)
    _write(root, "gpa", 2, 0.38, 0.40, 2650, XEON)  # faster machine: not in gpa's cost columns
    _write(root, "gpa", 3, 0.37, 0.60, 2500, ZEN5, fused=True)  # same machine, other kernel path: not either
    _write(root, "nystrom", 0, 0.30, 0.97, 2900, ZEN5)
    _write(root, "linformer", 0, 0.35, 0.50, 2000, XEON)  # only on the other machine: no cost
    runs = reproductions.collect(root)
    rows, where = reproduction_cost.cost_rows(runs)
    assert where == "AMD EPYC family 26 model 2 stepping 1 AVX512, model.kernels=eager"
    by = {r.attn: r for r in rows}
    assert by["gpa"].seeds == 4 and abs(by["gpa"].accuracy - 37.0) < 1e-9
    assert by["gpa"].step_s == statistics.median([0.78, 0.82]) and by["gpa"].memory_mib == 2650
    assert by["gpa"].timed_runs == 2
    assert by["linformer"].step_s is None and by["linformer"].timed_runs == 0
    text = "\n".join(reproduction_cost.cost_section(runs, "cost.png"))
    assert "| linformer | 35.00 | 1 | — (not run on this machine and path) |" in text
    assert "![accuracy against step time and peak memory](cost.png)" in text
    figure = reproduction_cost.plot_cost(runs, tmp_path / "cost.png")
    assert figure is not None and figure.stat().st_size > 0


def test_no_completed_run_draws_no_figure(tmp_path: Path) -> None:
    stale = tmp_path / "cost.png"
    stale.write_bytes(b"stale")
    assert reproduction_cost.plot_cost([], stale) is None and not stale.exists()
    assert "No completed seed yet." in reproduction_cost.cost_section([], "cost.png")
