"""Evaluate every method on one attention problem against exact softmax attention (and its SVD optimum).

Every metric comes from `lra_bench.diagnostics.metrics` (one implementation for training-time diagnostics and this
study): relative Frobenius error ‖A − Â‖_F/‖A‖_F, output residual ‖(A − Â)V‖_F/‖AV‖_F, the Eckart–Young
floor at the method's rank budget r and the ratio of the achieved error to it, numerical and stable rank,
block-coherence (its definition is in `lra_bench.diagnostics.metrics`). Â is the method's own `implied_matrix`.

Two groups of methods:
* `selector`: every registered selector under one fixed landmark operator (`operator`, default Nyström as
  Nyströmformer runs it — 6-step iterative pseudo-inverse — minus the conv skip, which is not part of Â);
  the landmark count is m;
* `attention`: every registered attention except `full`, at its paper defaults (conf/attn/<name>.yaml) with
  its own default selector, m swept through its landmark-count field when it has one. An attention that
  approximates another operator than softmax (it defines `target_pair(q, k, mask) → (T, T̂)`, as the
  training-time diagnostics expect — e.g. the spectral mixer's tanh affinity and its Nyström estimate) is
  scored on that pair instead, and says so (`target: own`).
"""

from __future__ import annotations

import math
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import torch

from lra_bench.approx.capture import Instance
from lra_bench.diagnostics import metrics as dg


@dataclass
class Method:
    label: str
    group: str  # "selector" | "attention"
    attn: str
    selector: str | None
    attn_params: dict[str, Any] = field(default_factory=dict)
    selector_params: dict[str, Any] = field(default_factory=dict)
    m_key: str | None = None


def build_methods(settings: dict[str, Any], context: dict[str, Any]) -> list[Method]:
    """Selector group (every registered selector, or the configured list) and attention group."""
    from lra_bench.bench.variants import attn_params, default_selector, selector_params
    from lra_bench.registry import ATTENTIONS, SELECTORS

    keys = list(settings["landmark_keys"])
    out: list[Method] = []
    op = str(settings["operator"])
    op_params = {**attn_params(op, context), **dict(settings.get("operator_params") or {})}
    op_key = next((k for k in keys if k in op_params), None)
    sels = SELECTORS.names() if settings["selectors"] in ("all", None) else list(settings["selectors"])
    for sel in sels:
        out.append(Method(sel, "selector", op, sel, op_params, selector_params(sel, context), op_key))
    names = ATTENTIONS.names() if settings["attns"] in ("all", None) else list(settings["attns"])
    for name in names:
        if name == "full":
            continue
        cls = ATTENTIONS.get(name)
        params = attn_params(name, context)
        sel = default_selector(name) if cls.takes_selector else None
        label = name + (f"/{sel}" if sel else "")
        key = next((k for k in keys if k in params), None)
        out.append(Method(label, "attention", name, sel, params, selector_params(sel, context) if sel else {}, key))
    return out


def _with_seed(params: dict[str, Any], seed: int) -> dict[str, Any]:
    return {**params, "seed": seed} if "seed" in params else dict(params)


def build(method: Method, n: int, d: int, m: int | None, seed: int) -> torch.nn.Module:
    from lra_bench.registry import build_attention, build_selector

    params = _with_seed(method.attn_params, seed)
    if method.m_key is not None and m is not None:
        params[method.m_key] = m
    selector = None
    if method.selector:
        selector = build_selector(method.selector, **_with_seed(method.selector_params, seed))
    module = build_attention(method.attn, head_dim=d, num_heads=1, seq_len=n, selector=selector, **params)
    return module.eval()


def kernel_ranks(q: torch.Tensor, k: torch.Tensor, tol: float) -> dict[str, dict[str, float | int | None]]:
    """Numerical and stable rank of entrywise kernels of the same logits L = q kᵀ/√d (claim d):
    exp(L) (unnormalised softmax kernel), softmax(L), and the degree-2 polynomials L∘L and (1 + L)∘(1 + L)."""
    logits = (q @ k.T) / math.sqrt(q.shape[-1])
    kernels = {
        "exp": torch.exp(logits - logits.max()),
        "softmax": torch.softmax(logits, dim=-1),
        "poly2": logits * logits,
        "poly2_inhom": (1.0 + logits) ** 2,
    }
    out = {}
    for name, mat in kernels.items():
        sigma = dg.singular_values(mat)
        out[name] = {"numerical_rank": dg.numerical_rank(sigma, tol), "stable_rank": dg.stable_rank(sigma)}
    return out


def describe_input(inst: Instance, ms: list[int], tol: float, with_ranks: bool) -> tuple[dict[str, Any], Any]:
    """Quantities of the input alone: A's spectrum, floors and block-coherence at each m, kernel ranks."""
    a = dg.exact_softmax(inst.q, inst.k)
    u, sigma, _ = torch.linalg.svd(a, full_matrices=False)
    n = a.shape[0]
    norm_a = float(sigma.pow(2).sum().sqrt())
    per_m = {}
    for m in ms:
        if m > n:
            continue
        lev = dg.leverage_scores(u, m)
        per_m[str(m)] = {
            "ey_floor": dg.ratio(dg.eckart_young_floor(sigma, m), norm_a),
            "block_coherence": dg.block_coherence(lev, dg.query_clusters(inst.q, m)),
            "coherence": dg.coherence(lev, m),
            "leverage_top_share": dg.leverage_top_share(lev, m),
        }
    info = {
        "source": inst.source,
        "instance": inst.name,
        "n": n,
        "d": int(inst.q.shape[-1]),
        "rank_a": dg.numerical_rank(sigma, tol),
        "stable_rank_a": dg.stable_rank(sigma),
        "per_m": per_m,
        "kernel_ranks": kernel_ranks(inst.q, inst.k, tol) if with_ranks else None,
    }
    return info, (a, sigma, norm_a)


def evaluate(
    inst: Instance, methods: list[Method], ms: list[int], seeds: list[int], exact: Any
) -> list[dict[str, Any]]:
    """One row per (seed, method, m): residuals against softmax (or the method's own target), floor, ratio."""
    from lra_bench.diagnostics.callback import rank_budget

    a, sigma, norm_a = exact
    n, d = inst.q.shape
    q32, k32 = inst.q.float()[None, None], inst.k.float()[None, None]
    rows = []
    for seed in seeds:
        for method in methods:
            for m in ms if method.m_key else [None]:
                if m is not None and m > n:
                    continue
                row: dict[str, Any] = {
                    "source": inst.source,
                    "instance": inst.name,
                    "seed": seed,
                    "group": method.group,
                    "label": method.label,
                    "attn": method.attn,
                    "selector": method.selector,
                    "m": m,
                    "n": n,
                }
                start = time.perf_counter()
                try:
                    module = build(method, n, d, m, seed)
                    with torch.no_grad():
                        r = rank_budget(module, n)
                        pair_fn = getattr(module, "target_pair", None)
                        if callable(pair_fn):
                            target, estimate = (t[0, 0].double() for t in pair_fn(q32, k32, None))
                            row.update(
                                target="own",
                                rank_budget=r,
                                matrix_residual=dg.matrix_residual(target, estimate),
                                output_residual=dg.output_residual(target, estimate, inst.v),
                                ey_floor=None,
                                ey_ratio=None,
                            )
                        else:
                            a_hat = module.implied_matrix(q32, k32, None)[0, 0].double()
                            err = dg.fro(a - a_hat)
                            floor = dg.eckart_young_floor(sigma, r) if r is not None else 0.0
                            row.update(
                                target="softmax",
                                rank_budget=r,
                                matrix_residual=dg.ratio(err, norm_a),
                                output_residual=dg.output_residual(a, a_hat, inst.v),
                                ey_floor=dg.ratio(floor, norm_a),
                                ey_ratio=err / floor if floor > 1e-12 * norm_a else None,
                            )
                    finite = row["matrix_residual"] is not None and math.isfinite(row["matrix_residual"])
                    row["status"] = "ok" if finite else "nonfinite"
                except Exception as err:
                    tb = traceback.extract_tb(err.__traceback__)
                    where = f" at {tb[-1].filename.split('/')[-1]}:{tb[-1].lineno}" if tb else ""
                    row.update(status="error", error=f"{type(err).__name__}: {str(err)[:300]}{where}")
                row["seconds"] = time.perf_counter() - start
                rows.append(row)
    return rows
