"""Diagnostics: the pure functions against hand computations and numpy, the callback's bookkeeping and purity,
and (slow) a real run that records them — and trains bit-for-bit the same with them off."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

import lra_bench.run.train as train_module
from lra_bench.diagnostics.callback import DiagnosticsCallback, build_probe
from lra_bench.diagnostics.metrics import block_coherence, eckart_young_floor, head_metrics, singular_values
from lra_bench.record import results
from lra_bench.run.build import build_network as build_classifier
from lra_bench.run.entry import run_stage
from tests.conftest import TINY_LISTOPS, compose, run_cli


def test_hand_computed_8x8_case() -> None:
    """q = k = 0: A is the uniform matrix (1/8 everywhere, rank 1, ‖A‖_F = 1); Â = I; v_i = [i, 1]."""
    n = 8
    q = torch.zeros(n, 4, dtype=torch.float64)
    v = torch.stack([torch.arange(n, dtype=torch.float64), torch.ones(n, dtype=torch.float64)], dim=1)
    got = head_metrics(q, q, v, torch.eye(n, dtype=torch.float64), rank_budget=1, rank_tol=1e-3)
    # ‖A − I‖_F² = 8·(7/8)² + 56·(1/8)² = 7
    assert got["matrix_residual"] == pytest.approx(math.sqrt(7))
    # AV rows = [3.5, 1]: ‖AV‖² = 8·13.25 = 106; (A − I)V rows = [3.5 − i, 0]: Σ(3.5 − i)² = 42
    assert got["output_residual"] == pytest.approx(math.sqrt(42 / 106))
    assert got["rank_a"] == 1 and got["rank_a_hat"] == 8
    assert got["stable_rank_a"] == pytest.approx(1.0)
    assert got["ey_floor"] == pytest.approx(0.0, abs=1e-12) and got["ey_ratio"] is None
    # top singular vector 1/√8: leverage 1/8 everywhere; one cluster (all queries equal) holds max 1/8
    assert got["coherence"] == pytest.approx(1.0)
    assert got["block_coherence"] == pytest.approx(1 / 8)
    assert got["leverage_top_share"] == pytest.approx(1 / 8)


def test_floor_and_ranks_match_numpy_svd() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(8, 4, generator=g, dtype=torch.float64) for _ in range(3))
    a = torch.softmax(q @ k.T / 2.0, dim=-1).numpy()
    u, s, vt = np.linalg.svd(a)
    r = 3
    best = (u[:, :r] * s[:r]) @ vt[:r]  # the Eckart–Young optimum of rank 3
    got = head_metrics(q, k, v, torch.from_numpy(best), rank_budget=r, rank_tol=1e-2)
    norm = np.linalg.norm(a)
    assert got["ey_floor_abs"] == pytest.approx(np.sqrt((s[r:] ** 2).sum()))
    assert got["ey_floor"] == pytest.approx(np.sqrt((s[r:] ** 2).sum()) / norm)
    assert got["ey_ratio"] == pytest.approx(1.0, rel=1e-9), "the truncated SVD is optimal"
    assert got["matrix_residual"] == pytest.approx(np.linalg.norm(a - best) / norm)
    assert got["rank_a"] == int((s > 1e-2 * s[0]).sum())
    assert got["rank_a_hat"] == r
    assert got["stable_rank_a"] == pytest.approx((s**2).sum() / s[0] ** 2)
    np.testing.assert_allclose(singular_values(torch.from_numpy(a)).numpy(), s)
    assert eckart_young_floor(torch.from_numpy(s), 8) == 0.0


def test_summaries_are_medians_and_pooled_ratios_with_tiny_floors_flagged() -> None:
    """Three heads with ratios 6, 15 and 2e4 (the last one's rank equals the budget: floor ≈ 0). An arithmetic
    mean says ~6700; the summary says median 10.5 of the two measurable heads, pooled Σerr/Σfloor, 1 flagged."""
    from lra_bench.diagnostics.metrics import summary_metrics

    def head(err: float, floor: float) -> dict:
        return {"error_abs": err, "ey_floor_abs": floor, "ey_floor": floor, "ey_ratio": err / floor,
                "floor_flagged": floor < 0.01, "matrix_residual": err, "leverage_defined": True}  # fmt: skip

    rows = [head(0.6, 0.1), head(1.5, 0.1), head(0.2, 1e-5)]
    got = summary_metrics(rows)
    assert got["ey_ratio"] == pytest.approx(10.5)
    assert got["ey_ratio_pooled"] == pytest.approx((0.6 + 1.5) / 0.2)
    assert got["floor_flagged"] == 1 and got["count"] == 3
    assert got["matrix_residual"] == pytest.approx(0.6), "median, not mean"


def test_leverage_is_undefined_when_the_budget_exceeds_rank_a() -> None:
    """Keys with 2 distinct values: rank A = 2. With a budget of 4 the top-4 singular vectors include rounding
    noise, so coherence and block-coherence are None, not numbers."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(12, 4, generator=g, dtype=torch.float64)
    k = torch.randn(2, 4, generator=g, dtype=torch.float64)[torch.arange(12) % 2]
    v = torch.randn(12, 4, generator=g, dtype=torch.float64)
    a = torch.softmax(q @ k.T / 2.0, dim=-1)
    got = head_metrics(q, k, v, a, rank_budget=4, rank_tol=1e-6)
    assert got["coherence"] is None and got["block_coherence"] is None and got["leverage_top_share"] is None
    assert got["rank_a"] == 2 and got["leverage_defined"] is False
    fine = head_metrics(q, k, v, a, rank_budget=2, rank_tol=1e-6)
    assert fine["leverage_defined"] is True and fine["coherence"] is not None


def test_the_effective_rank_budget_is_recorded() -> None:
    """k-means on 3 distinct tokens with m = 6 leaves 3 landmarks valid: the floor is taken at rank 3, and the
    nominal 6 is kept beside it."""
    from lra_bench.diagnostics.callback import effective_rank, rank_budget
    from lra_bench.registry import build_attention, build_selector

    attn = build_attention(
        "nystrom", head_dim=4, num_heads=2, seq_len=12, selector=build_selector("kmeans"), num_landmarks=6,
        conv_kernel=0,
    ).eval()  # fmt: skip
    g = torch.Generator().manual_seed(0)
    base = torch.randn(1, 2, 3, 4, generator=g)
    q = base[:, :, torch.arange(12) % 3]
    attn.implied_matrix(q, q, None)
    assert rank_budget(attn, 12) == 6
    assert effective_rank(attn, 6, 0, 0) == 3 and effective_rank(attn, 6, 0, 1) == 3


def test_block_coherence_definition() -> None:
    lev = torch.tensor([0.5, 0.1, 0.1, 0.3], dtype=torch.float64)
    assert block_coherence(lev, torch.tensor([0, 0, 1, 1])) == pytest.approx(0.8)
    assert block_coherence(lev, torch.tensor([0, 1, 2, 3])) == pytest.approx(1.0)


# -- the callback -----------------------------------------------------------------------------------------
class FakeSplit:
    def __init__(self, ids: torch.Tensor, lengths: torch.Tensor) -> None:
        self.ids, self.lengths = ids, lengths

    def __len__(self) -> int:
        return len(self.ids)

    def __getitems__(self, indices):
        return {"input_ids": self.ids[indices], "length": self.lengths[indices]}


class FakeDataModule:
    def __init__(self, n: int = 20) -> None:
        g = torch.Generator().manual_seed(0)
        self.splits = {"val": FakeSplit(torch.randint(1, 15, (4, n), generator=g), torch.tensor([20, 12, 7, 20]))}

    def collate(self, rows):
        ids = rows["input_ids"]
        return {
            "input_ids": ids,
            "mask": torch.arange(ids.shape[1])[None] < rows["length"][:, None],
            "label": torch.zeros(len(ids), dtype=torch.long),
        }


def tiny_model(attn: dict, selector: dict | None) -> torch.nn.Module:
    return build_classifier(
        vocab_size=16,
        seq_len=20,
        num_classes=3,
        dual=False,
        model={"dim": 16, "depth": 2, "num_heads": 2, "head_dim": 8, "ffn_dim": 32, "dropout": 0.1},
        attn=attn,
        selector=selector,
    )


CFG = {"enabled": True, "every_n_validations": 2, "max_len": 16, "probe_size": 3, "heads": None, "layers": None}


def test_probe_is_the_longest_sequences_cut_to_max_len() -> None:
    """lengths [20, 12, 7, 20], counted up to max_len 16: the three longest are #0, #3 and #1 (not the first
    three, which would include the 7-token one), kept in their original order and cut to 16 tokens."""
    dm = FakeDataModule()
    probe = build_probe(dm, 3, 16)
    assert probe["input_ids"].shape == (3, 16)
    assert probe["mask"].sum(-1).tolist() == [16, 12, 16]
    assert torch.equal(probe["input_ids"], dm.splits["val"].ids[[0, 1, 3], :16])
    cb = DiagnosticsCallback({**CFG, "probe_size": 1}, dm)
    first = cb.probe(torch.device("cpu"))
    dm.splits["val"].lengths = torch.tensor([1, 1, 1, 1])  # the probe is fixed once chosen
    assert torch.equal(cb.probe(torch.device("cpu"))["input_ids"], first["input_ids"])


@pytest.mark.parametrize(
    ("attn", "selector"),
    [
        ({"name": "gpa", "num_landmarks": "log2", "conv_kernel": 0}, {"name": "gpa", "refresh_every": 2}),
        ({"name": "spectral", "num_landmarks": 4}, {"name": "uniform"}),
        ({"name": "full"}, None),
    ],
    ids=["gpa", "spectral", "full"],
)
def test_compute_is_pure(attn: dict, selector: dict | None) -> None:
    model = tiny_model(attn, selector).train()
    ids = torch.randint(1, 15, (2, 20), generator=torch.Generator().manual_seed(1))
    model({"input_ids": ids, "mask": torch.ones(2, 20, dtype=torch.bool)})  # one pass: GPA codebook exists
    before = {k: v.clone() for k, v in model.state_dict().items() if torch.is_tensor(v)}
    rng = torch.get_rng_state()
    cb = DiagnosticsCallback(CFG, FakeDataModule())
    diag = cb.compute(model, torch.device("cpu"))
    assert torch.equal(rng, torch.get_rng_state()), "the global RNG stream is untouched"
    assert model.training, "the model's mode is restored"
    for key, value in model.state_dict().items():
        if key in before:
            assert torch.equal(before[key], value), f"{key} changed"
    assert all(p.grad is None for p in model.parameters())
    assert diag["probe"]["sequences"] == 3 and len(diag["layers"]) == 2
    head = diag["layers"][0]["heads"][0]
    assert len(head["sequences"]) == 3, "per-(sequence, head) values are kept"
    assert head["rank_a"] >= 1
    assert head["block_coherence"] is None or 0 <= head["block_coherence"] <= 1
    assert diag["summary"]["matrix_residual"] is not None
    if attn["name"] == "full":
        assert diag["summary"]["matrix_residual"] < 1e-5 and diag["summary"]["ey_ratio"] is None
    if attn["name"] == "spectral":
        assert "rank_kept" in diag["layers"][0]["extra"] and diag["summary"]["target_residual"] is not None


def test_layers_and_heads_selection() -> None:
    model = tiny_model({"name": "nystrom", "num_landmarks": 4, "conv_kernel": 0}, {"name": "segment_means"})
    cb = DiagnosticsCallback({**CFG, "layers": [1], "heads": [0]}, FakeDataModule())
    diag = cb.compute(model, torch.device("cpu"))
    assert [layer["layer"] for layer in diag["layers"]] == [1]
    assert [h["head"] for h in diag["layers"][0]["heads"]] == [0]


class ListLogger:
    def __init__(self) -> None:
        self.calls: list[tuple[dict, int]] = []

    def log_metrics(self, metrics, step) -> None:
        self.calls.append((metrics, step))


def test_latest_and_best_bookkeeping() -> None:
    model = tiny_model({"name": "nystrom", "num_landmarks": 4, "conv_kernel": 0}, {"name": "uniform"})
    writes = []
    cb = DiagnosticsCallback(CFG, FakeDataModule(), on_update=lambda: writes.append(cb.latest["step"]))
    logger = ListLogger()
    module = SimpleNamespace(model=model, device=torch.device("cpu"))
    computed_at = []
    for step, acc in [(10, 0.5), (20, 0.4), (30, 0.45), (40, 0.6)]:
        trainer = SimpleNamespace(
            sanity_checking=False,
            callback_metrics={"val/acc": torch.tensor(acc)},
            global_step=step,
            is_global_zero=True,
            loggers=[logger],
        )
        cb.on_validation_end(trainer, module)
        computed_at.append(cb.latest["step"])
    # every 2nd validation (1st, 3rd) plus any that improves val/acc (1st, 4th)
    assert computed_at == [10, 10, 30, 40]
    assert writes == [10, 30, 40], "the record owner is told after each measurement (it rewrites results.json)"
    assert cb.best["step"] == 40 and cb.best["val_acc"] == pytest.approx(0.6)
    assert [step for _, step in logger.calls] == [10, 30, 40]
    assert "diag/matrix_residual" in logger.calls[0][0] and "diag/L0/H1/ey_ratio" in logger.calls[0][0]
    state = cb.state_dict()
    fresh = DiagnosticsCallback(CFG, FakeDataModule())
    fresh.load_state_dict(state)
    assert fresh.best_val == pytest.approx(0.6) and fresh.best["step"] == 40


# -- end to end -------------------------------------------------------------------------------------------
def only(paths: list[Path]) -> Path:
    assert len(paths) == 1, paths
    return paths[0]


@pytest.mark.slow
def test_gpa_run_records_diagnostics(tmp_path: Path) -> None:
    run_cli(["attn=gpa", *TINY_LISTOPS], tmp_path)
    record = results.read_record(only(list((tmp_path / "outputs").rglob(results.FILENAME))))
    assert record["status"] == "completed"
    diag = record["diagnostics"]
    assert diag["latest"] is not None and diag["best"] is not None
    assert diag["best"]["step"] == record["metrics"]["best_step"], "best diagnostics = the best-val checkpoint's"
    summary = diag["best"]["summary"]
    for key in ("matrix_residual", "output_residual", "ey_floor", "rank_a", "stable_rank_a", "rank_budget"):
        assert summary[key] is not None, key
    assert diag["best"]["layers"][0]["extra"]["codebook_refreshes"] >= 1
    header = only(list((tmp_path / "outputs").rglob("metrics.csv"))).read_text().splitlines()[0]
    assert "diag/matrix_residual" in header and "diag/L1/H1/block_coherence" in header
    json.dumps(record)  # plain JSON all the way down


class FinalWeights(pl.Callback):
    """Keeps a copy of the weights (and buffers, and selector RNG states) when training ends."""

    def __init__(self) -> None:
        self.state: dict = {}

    def on_train_end(self, trainer, pl_module) -> None:
        self.state = copy.deepcopy(pl_module.state_dict())


def train_and_capture(overrides: list[str], out: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, dict]:
    """One in-process run (exactly what run.py does); returns the final state_dict and the record."""
    capture = FinalWeights()
    original = train_module._extra_callbacks
    monkeypatch.setattr(train_module, "_extra_callbacks", lambda *a: [*original(*a), capture])
    cfg = compose([*overrides, f"output_root={out}", f"data_dir={out.parent / 'data'}"])
    record = run_stage(cfg, out / "run")
    return capture.state, record


def same(a, b) -> bool:
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        ["attn=gpa", "selector.refresh_every=2"],
        ["attn=nystrom", "selector=uniform", "attn.num_landmarks=8"],
        ["attn=skyformer", "attn.num_landmarks=8"],  # its target pair draws landmarks again: never its training stream
    ],
    ids=["gpa", "nystrom-uniform", "skyformer"],
)
def test_diagnostics_never_change_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: list[str]
) -> None:
    """Dropout (0.1) draws from the global RNG every step, so any draw by the diagnostics would show here."""
    common = [*overrides, *TINY_LISTOPS, "trainer.deterministic=true", "trainer.max_steps=6", "test=false"]
    on, record = train_and_capture([*common, "diagnostics.enabled=true"], tmp_path / "on", monkeypatch)
    off, _ = train_and_capture([*common, "diagnostics.enabled=false"], tmp_path / "off", monkeypatch)
    assert record["diagnostics"]["latest"] is not None and record["metrics"]["train_steps"] == 6
    assert on.keys() == off.keys() and on
    for key in on:
        assert same(on[key], off[key]), f"{key} differs with diagnostics on"
