"""The approximation study (`python -m lra_bench.approx`): a tiny run's output schema, the SVD floor against
numpy, planted low rank recovered by pivoting, k-means against uniform on planted block-coherent inputs."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import CONF, REPO, TINY_LISTOPS, run_cli

TINY = [
    "n=64",
    "seeds=[0,1]",
    "landmarks=[4,8]",
    "selectors=[uniform,kmeans,pivoted_qr]",
    "attns=[pivoted,polynomial]",
    "model.sequences=1",
    "model.max_len=64",
    "model.min_len=16",
    "model.model_overrides=['task=listops','task.seq_len=64','task.max_length=64','model.dim=16','model.head_dim=8']",
    "threads=1",
]


def run_approx(tmp_path: Path, overrides: list[str]) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from lra_bench.approx.app import run

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("approx", overrides=overrides, return_hydra_config=True)
            HydraConfig.instance().set_config(cfg)
            return run(cfg, tmp_path)
    finally:
        GlobalHydra.instance().clear()


def settings(selectors: list[str], attns: list[str], solves=("training",), **operator_params: Any) -> dict[str, Any]:
    return {
        "operator": "nystrom",
        "operator_params": {"conv_kernel": 0, **operator_params},
        "selectors": selectors,
        "attns": attns,
        "solves": list(solves),
    }


def evaluate(q, k, v, methods, ms, seed=0):
    from lra_bench.approx.capture import Instance
    from lra_bench.approx.study import describe_input, evaluate

    inst = Instance("test", "x", q, k, v, seed)
    info, exact = describe_input(inst, ms, 1e-3, False)
    return info, evaluate(inst, methods, ms, [seed], exact)


def test_tiny_study_schema(tmp_path: Path) -> None:
    data = run_approx(tmp_path, [*TINY, "model.enabled=false"])
    check_schema(data, tmp_path)
    assert set(data["sources"]) == {"geometric", "algebraic", "clusters", "clusters_noisy", "planted_rank"}


@pytest.mark.slow
def test_tiny_study_with_random_model(tmp_path: Path) -> None:
    """The model source without a checkpoint: a random-init model composed from conf/config.yaml."""
    data = run_approx(tmp_path, TINY)
    check_schema(data, tmp_path)
    assert data["sources"]["random_model"]["instances"] > 0
    assert "random_model" in {r["source"] for r in data["rows"]}


def check_schema(data: dict[str, Any], tmp_path: Path) -> None:
    for key in ("schema_version", "command", "env", "settings", "sources", "methods", "inputs", "rows", "summary"):
        assert key in data, key
    assert {"geometric", "algebraic", "clusters", "planted_rank"} <= set(data["sources"])
    for row in data["rows"]:
        assert row["status"] in ("ok", "error", "nonfinite"), row
        for key, typ in (("source", str), ("label", str), ("group", str), ("seed", int), ("n", int)):
            assert isinstance(row[key], typ), (key, row)
        if row["status"] == "ok":
            assert isinstance(row["matrix_residual"], float) and row["matrix_residual"] >= 0
            assert isinstance(row["output_residual"], float)
    ok = [r for r in data["rows"] if r["status"] == "ok"]
    assert {r["label"] for r in ok} >= {"uniform", "kmeans", "pivoted_qr", "pivoted/pivoted_qr", "polynomial"}
    for inp in data["inputs"]:
        assert isinstance(inp["rank_a"], int) and set(inp["per_m"]) <= {"4", "8"}
        assert set(inp["kernel_ranks"]) == {"exp", "softmax", "poly2", "poly2_inhom"}
    claims = {v["claim"] for v in data["summary"]["verdicts"]}
    assert claims == {"gpa_kmeans", "floor_ratio", "solves", "poly_rank", "pivoted_output", "spectral_s"}
    assert all(isinstance(v["verdict"], str) and v["verdict"] for v in data["summary"]["verdicts"])
    on_disk = json.loads((tmp_path / "approx.json").read_text())
    assert len(on_disk["rows"]) == len(data["rows"])
    md = (tmp_path / "approx.md").read_text()
    assert "Verdicts" in md and "SVD floor" in md
    assert sorted(data["plots"]) == sorted(f"approx_{s}.png" for s in {r["source"] for r in ok})
    for name in data["plots"]:
        assert (tmp_path / name).stat().st_size > 0


def test_svd_floor_matches_numpy() -> None:
    from lra_bench.approx.capture import Instance
    from lra_bench.approx.study import describe_input
    from lra_bench.approx.synthetic import decay_inputs
    from lra_bench.diagnostics import metrics as dg

    q, k, v = decay_inputs(96, 16, "geometric", 0.7, 2.0, seed=3)
    info, (a, sigma, norm_a) = describe_input(Instance("test", "x", q, k, v, 3), [4, 16], 1e-3, False)
    s_np = np.linalg.svd(a.numpy(), compute_uv=False)
    for r in (4, 16):
        expected = float(np.sqrt(np.sum(s_np[r:] ** 2)))
        assert dg.eckart_young_floor(sigma, r) == pytest.approx(expected, rel=1e-10)
        assert info["per_m"][str(r)]["ey_floor"] * norm_a == pytest.approx(expected, rel=1e-10)
        # the floor is attained: the truncated SVD's error equals it
        u, s, vt = np.linalg.svd(a.numpy())
        best = (u[:, :r] * s[:r]) @ vt[:r]
        assert np.linalg.norm(a.numpy() - best) == pytest.approx(expected, rel=1e-8)


def test_planted_rank_is_recovered_by_pivoting() -> None:
    """keys with r distinct values make rank(A) ≤ r; pivoting on A finds that column space at m ≥ r, and then the
    stable solve reproduces A to float precision — while the training solve (6 Newton–Schulz steps) does not."""
    from lra_bench.approx.study import build_methods
    from lra_bench.approx.synthetic import planted_rank_inputs

    r = 8
    q, k, v = planted_rank_inputs(128, 16, r, 2.0, seed=0)
    assert int(np.linalg.matrix_rank(torch.softmax(q @ k.T / 4.0, -1).numpy(), tol=1e-8)) <= r
    methods = build_methods(
        settings(["pivoted_qr", "uniform"], ["pivoted"], solves=["training", "stable"]), {"seed": 0}
    )
    _, rows = evaluate(q, k, v, methods, [r, 2 * r])
    err = {(row["label"], row["solve"], row["m"]): row["matrix_residual"] for row in rows}
    for m in (r, 2 * r):
        assert err[("pivoted/pivoted_qr", "training", m)] < 1e-2  # the residual-pivoted attention (method c)
        assert err[("pivoted_qr", "stable", m)] < 1e-9, "covered exactly: reproduced to float precision"
        assert err[("pivoted_qr", "training", m)] > 1e-2, "the iterative pinv is not exact even here"
    assert err[("uniform", "stable", r)] > 10 * err[("pivoted_qr", "stable", r)]


def test_every_selector_is_reported_under_both_solves_with_the_same_landmarks() -> None:
    from lra_bench.approx.study import build_methods
    from lra_bench.approx.synthetic import cluster_inputs

    q, k, v, _ = cluster_inputs(96, 16, 4, 1.0, 0.2, 2.0, 0)
    methods = build_methods(settings(["uniform", "kmeans"], [], solves=["training", "stable"]), {"seed": 0})
    _, rows = evaluate(q, k, v, methods, [4, 8])
    assert {(r["label"], r["solve"]) for r in rows} == {
        (s, v) for s in ("uniform", "kmeans") for v in ("training", "stable")
    }
    for r in rows:
        assert r["status"] == "ok" and r["rank_budget"] == r["rank_budget_nominal"] == r["m"]
        assert r["worse_than_zero"] == (r["matrix_residual"] >= 1.0)
    with pytest.raises(ValueError, match=r"approx.solves=\['exact'\]"):
        build_methods(settings(["uniform"], [], solves=["exact"]), {"seed": 0})


def test_the_oracle_middle_matrix_lower_bounds_every_solve() -> None:
    """C⁺AR⁺ minimises ‖A − C U R‖ over U: never above either solve's error, never above ‖A‖ (U = 0)."""
    from lra_bench.approx.study import build_methods
    from lra_bench.approx.synthetic import decay_inputs

    q, k, v = decay_inputs(96, 16, "geometric", 0.8, 2.0, seed=1)
    solves = ["training", "stable", "oracle"]
    methods = build_methods(settings(["uniform", "kmeans", "segment_means"], [], solves=solves), {"seed": 0})
    _, rows = evaluate(q, k, v, methods, [4, 8, 16])
    err = {(r["label"], r["m"], r["solve"]): r["matrix_residual"] for r in rows}
    for (label, m, solve), e in err.items():
        assert err[(label, m, "oracle")] <= e + 1e-9, (label, m, solve)
        assert err[(label, m, "oracle")] <= 1.0


def test_the_floor_is_taken_at_the_effective_rank_budget() -> None:
    """Keys with 4 distinct values (plus 1e-3 noise): pivoting stops after 4 pivots at m = 8, so the rank spent is
    4, not 8 — the floor (and the ratio to it) must be the rank-4 one, checked against numpy's SVD."""
    from lra_bench.approx.study import build_methods
    from lra_bench.approx.synthetic import planted_rank_inputs

    q, k, v = planted_rank_inputs(64, 16, 4, 2.0, seed=0)
    k = k + 1e-3 * torch.randn(k.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    methods = build_methods(settings(["pivoted_qr"], [], solves=["stable"]), {"seed": 0})
    info, rows = evaluate(q, k, v, methods, [8])
    (row,) = rows
    assert row["rank_budget"] == 4 and row["rank_budget_nominal"] == 8
    a = torch.softmax(q @ k.T / 4.0, -1).numpy()
    s = np.linalg.svd(a, compute_uv=False)
    assert row["ey_floor"] == pytest.approx(np.sqrt((s[4:] ** 2).sum()) / np.linalg.norm(a), rel=1e-9)
    assert row["ey_floor"] > 1.2 * info["per_m"]["8"]["ey_floor"]


def _row(inst: str, label: str, err: float, solve: str = "stable", m: int = 8) -> dict[str, Any]:
    return {
        "source": "s", "instance": inst, "seed": 0, "m": m, "label": label, "group": "selector", "solve": solve,
        "status": "ok", "matrix_residual": err, "target": "softmax", "worse_than_zero": err >= 1,
        "ey_floor": 0.1, "ey_floor_abs": 0.1, "error_abs": err,
    }  # fmt: skip


def test_a_baseline_worse_than_zero_is_never_used_for_a_reduction() -> None:
    """uniform at error ≥ 1 is worse than predicting Â = 0: a 'reduction' against it is excluded and counted;
    the verdict is computed on the stable solve and names the training solve beside it."""
    from lra_bench.approx.summary import paired_reduction, verdict_kmeans

    rows = [
        _row("a", "uniform", 2.0), _row("a", "kmeans", 0.5),   # baseline worse than Â = 0: excluded
        _row("b", "uniform", 0.8), _row("b", "kmeans", 0.4),   # a real 50% reduction
        _row("a", "uniform", 0.6, "training"), _row("a", "kmeans", 0.3, "training"),
    ]  # fmt: skip
    (red,) = paired_reduction(rows, "kmeans", "uniform", "stable")
    assert red["pairs"] == 1 and red["excluded"] == 1 and red["reduction"] == pytest.approx(0.5)
    verdict = verdict_kmeans(rows, {"kmeans": "kmeans", "uniform": "uniform", "band": [0.25, 0.35]}, [])
    assert verdict["solve"] == "stable"
    assert "1 pairs excluded (uniform worse than Â = 0)" in verdict["verdict"]
    assert "**stable solve**" in verdict["verdict"] and "**training solve**" in verdict["verdict"]
    only_bad = [_row("a", "uniform", 3.0), _row("a", "kmeans", 0.2)]
    text = verdict_kmeans(only_bad, {"kmeans": "kmeans", "uniform": "uniform", "band": [0.25, 0.35]}, [])["verdict"]
    assert "s not measurable" in text


def test_floor_ratio_is_pooled_and_tiny_floors_are_flagged() -> None:
    """Σerr/Σfloor, not the mean of ratios; a floor below 1% of ‖A‖_F is left out and counted."""
    from lra_bench.approx.summary import aggregate

    rows = [_row("a", "uniform", 0.3), _row("b", "uniform", 0.6)]
    rows[1]["ey_floor_abs"], rows[1]["ey_floor"] = 0.2, 0.2
    tiny = {**_row("c", "uniform", 0.5), "ey_floor": 1e-9, "ey_floor_abs": 1e-9}
    (agg,) = aggregate([*rows, tiny])
    assert agg["ey_ratio"] == pytest.approx((0.3 + 0.6) / (0.1 + 0.2))
    assert agg["floor_flagged"] == 1 and agg["count"] == 3


def test_kmeans_beats_uniform_on_planted_clusters() -> None:
    from lra_bench.approx.study import build_methods
    from lra_bench.approx.synthetic import cluster_inputs

    methods = build_methods(settings(["uniform", "kmeans"], []), {"seed": 0})
    errs: dict[str, list[float]] = {"uniform": [], "kmeans": []}
    for seed in range(5):
        q, k, v, _ = cluster_inputs(128, 32, 8, 1.5, 0.3, 2.0, seed)
        _, rows = evaluate(q, k, v, methods, [8], seed)
        for row in rows:
            errs[row["label"]].append(row["matrix_residual"])
    assert statistics.mean(errs["kmeans"]) < statistics.mean(errs["uniform"])


def test_synthetic_generators_have_the_planted_structure() -> None:
    from lra_bench.approx.synthetic import cluster_inputs, cluster_sizes, decay_inputs

    q, k, _ = decay_inputs(200, 16, "geometric", 0.5, 2.0, seed=0)
    s = np.linalg.svd((q @ k.T / 4.0).numpy(), compute_uv=False)[:16]
    assert s[1:] / s[:-1] == pytest.approx(np.full(15, 0.5), rel=1e-6)  # controlled decay of QKᵀ
    assert float(torch.linalg.norm(q @ k.T / 4.0)) / 200 == pytest.approx(2.0)  # RMS logit = logit_std
    sizes = cluster_sizes(100, 4, 1.0)
    assert sum(sizes) == 100 and sizes == sorted(sizes, reverse=True) and sizes[-1] < sizes[0] / 2
    _, _, _, labels = cluster_inputs(100, 8, 4, 1.0, 0.1, 2.0, seed=0)
    assert torch.bincount(labels).tolist() == sizes


@pytest.mark.slow
def test_trained_checkpoint_source(tmp_path: Path) -> None:
    """`ckpt=` rebuilds the model from the run's .hydra/config.yaml and captures attention on its val set."""
    run_cli(["attn=nystrom", "attn.num_landmarks=8", "run_name=approx-src", *TINY_LISTOPS], tmp_path)
    ckpt = next((tmp_path / "outputs").rglob("checkpoints/last.ckpt"))
    data = run_approx(
        tmp_path / "study",
        [*TINY, f"ckpt={ckpt}", "~sources", "attns=[]", "selectors=[uniform,kmeans]"],
    )
    assert data["sources"]["trained"]["instances"] > 0
    assert data["sources"]["trained"]["global_step"] > 0
    assert {r["source"] for r in data["rows"]} == {"trained", "random_model"}


def test_a_source_that_yields_nothing_is_an_error_naming_the_setting(tmp_path: Path) -> None:
    """min_len above every sequence: no instance, so no verdict could be measured — exit 2, one line."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "lra_bench.approx", *TINY, "~sources", "model.min_len=100000"]
    cmd.append(f"hydra.run.dir={tmp_path / 'out'}")
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: approx.model.min_len=100000") and "captured no instance" in last
    assert not (tmp_path / "out" / "approx.json").exists()


def test_plots_clip_a_vanishing_floor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A floor of 1e-15 (A of rank ≤ m) must not stretch the log axis over 16 decades: clipped, and said so."""
    import matplotlib.figure

    from lra_bench.approx import report

    plot, floor = report.plot, getattr(report, "PLOT_FLOOR", 1e-4)

    figures = []
    original = matplotlib.figure.Figure.savefig

    def keep(self, *args, **kwargs):
        figures.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    base = {"source": "p", "group": "selector", "label": "uniform", "target": "softmax", "solve": "stable"}
    agg = [
        {**base, "m": 8, "matrix_residual": 0.5, "matrix_residual_std": 0.0, "ey_floor": 0.3},
        {**base, "m": 16, "matrix_residual": 0.2, "matrix_residual_std": 0.0, "ey_floor": 1e-15},
    ]
    plot({"summary": {"aggregate": agg}}, tmp_path)
    (fig,) = figures
    for ax in fig.axes:
        assert ax.get_ylim()[0] >= floor / 2, "the axis is not stretched down to the vanishing floor"
    notes = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("drawn at" in t for t in notes), notes


def test_the_spectral_verdict_reads_spectral_rows_only() -> None:
    """Spectral and Skyformer are both scored against their own targets (`target: own`); the outlier-spectral verdict
    (does a larger s lower spectral's residual?) reads spectral's rows, never Skyformer's (a rising residual here)."""
    from lra_bench.approx.summary import verdict_spectral

    def row(attn: str, label: str, m: int, residual: float) -> dict[str, Any]:
        return {"group": "attention", "attn": attn, "label": label, "target": "own", "m": m, "source": "clusters",
                "output_residual": residual}  # fmt: skip

    agg = [row("spectral", "spectral/uniform", 4, 0.5), row("spectral", "spectral/uniform", 8, 0.3)]
    agg += [row("skyformer", "skyformer", 4, 0.1), row("skyformer", "skyformer", 8, 0.2)]
    verdict = verdict_spectral(agg)
    assert [r["label"] for r in verdict["rows"]] == ["spectral/uniform"] and verdict["rows"][0]["monotone"]
    assert "`spectral/uniform`" in verdict["verdict"] and "Decreasing on 1/1 inputs" in verdict["verdict"]
