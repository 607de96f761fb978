"""The approximation study (`python -m lra_bench.approx`): a tiny run's output schema, the SVD floor against
numpy, planted low rank recovered by pivoting, k-means against uniform on planted block-coherent inputs."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import CONF, TINY_LISTOPS, run_cli

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

    from lra_bench.approx.__main__ import run

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("approx", overrides=overrides, return_hydra_config=True)
            HydraConfig.instance().set_config(cfg)
            return run(cfg, tmp_path)
    finally:
        GlobalHydra.instance().clear()


def settings(selectors: list[str], attns: list[str], **operator_params: Any) -> dict[str, Any]:
    return {
        "landmark_keys": ["num_landmarks"],
        "operator": "nystrom",
        "operator_params": {"conv_kernel": 0, **operator_params},
        "selectors": selectors,
        "attns": attns,
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
    assert set(data["sources"]) == {"geometric", "algebraic", "clusters", "planted_rank"}


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
    assert claims == {"gpa_kmeans", "floor_ratio", "poly_rank", "pivoted_output", "spectral_s"}
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
    """keys with r distinct values make rank(A) ≤ r; pivoting on A finds that column space at m ≥ r."""
    from lra_bench.approx.study import build_methods
    from lra_bench.approx.synthetic import planted_rank_inputs

    r = 8
    q, k, v = planted_rank_inputs(128, 16, r, 2.0, seed=0)
    assert int(np.linalg.matrix_rank(torch.softmax(q @ k.T / 4.0, -1).numpy(), tol=1e-8)) <= r
    methods = build_methods(settings(["pivoted_qr", "uniform"], ["pivoted"], pinv="exact"), {"seed": 0})
    _, rows = evaluate(q, k, v, methods, [r, 2 * r])
    err = {(row["label"], row["m"]): row["matrix_residual"] for row in rows}
    for m in (r, 2 * r):
        assert err[("pivoted/pivoted_qr", m)] < 1e-2  # the residual-pivoted attention (method c)
        assert err[("pivoted_qr", m)] < 1e-2  # pivoted_qr landmarks under Nyström with an exact pinv
    assert err[("uniform", r)] > 10 * err[("pivoted_qr", r)]


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
        [*TINY, f"ckpt={ckpt}", "~sources", "attns=[]", "selectors=[uniform,kmeans]", "model.scan=8"],
    )
    assert data["sources"]["trained"]["instances"] > 0
    assert data["sources"]["trained"]["global_step"] > 0
    assert {r["source"] for r in data["rows"]} == {"trained", "random_model"}
