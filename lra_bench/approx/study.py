"""Evaluate every method on one attention problem against exact softmax attention (and its SVD optimum), with the
metrics of `lra_bench.diagnostics.metrics` (one implementation for training-time diagnostics and this study); Â is
the method's own `implied_matrix`.

Two groups of methods:
* `selector`: every registered selector under one fixed landmark operator at each m, under each core solve of
  `SOLVES`; the same seed gives the same landmarks under each, so the solves are paired;
* `attention`: every registered attention except `full`, at its paper defaults with its own selector. One that
  approximates another operator than softmax (`target_pair(q, k, mask) → (T, T̂)`: the spectral mixer's tanh
  affinity, Skyformer's Gaussian kernel) is scored on that pair instead, and says so (`target: own`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from lra_bench.approx.capture import Instance
from lra_bench.bench.variants import attn_params, default_selector, selector_params
from lra_bench.bench.worker import describe_error
from lra_bench.diagnostics import metrics as dg
from lra_bench.diagnostics.callback import effective_rank, rank_budget
from lra_bench.registry import ATTENTIONS, SELECTORS, build_attention, build_selector
from models.attention.base import Attention


@dataclass
class Method:
    label: str
    group: str  # "selector" | "attention"
    attn: str
    selector: str | None
    attn_params: dict[str, Any] = field(default_factory=dict)
    selector_params: dict[str, Any] = field(default_factory=dict)
    m_key: str | None = None
    solve: str = "training"  # the core solve: "training" (the method's own, fp32) | "stable" (stable_pinv, fp64)


#: what each solve name means for the operator's `pinv` field (None = keep the operator's own); `oracle` is no
#: solve: the best middle matrix for the method's own factors, C⁺AR⁺ (it needs A, see `oracle_matrix`)
SOLVES = {"training": None, "stable": "stable", "oracle": None}


def build_methods(settings: dict[str, Any], context: dict[str, Any]) -> list[Method]:
    """Selector group (every registered selector, or the configured list) and attention group."""
    out: list[Method] = []
    op = str(settings["operator"])
    op_params = {**attn_params(op, context), **dict(settings.get("operator_params") or {})}
    op_key = ATTENTIONS.get(op).rank_knob  # the knob m sets (num_landmarks, …): the attention says which
    sels = SELECTORS.names() if settings["selectors"] in ("all", None) else list(settings["selectors"])
    solves = list(settings.get("solves") or ["training"])
    if any(s not in SOLVES for s in solves):
        raise ValueError(f"approx.solves={solves}: expected a non-empty list of {', '.join(SOLVES)}")
    if any(SOLVES[s] for s in solves) and "pinv" not in op_params:
        raise ValueError(f"approx.operator={op!r} has no `pinv` field, so approx.solves={solves} cannot apply")
    for solve in solves:
        params = op_params if SOLVES[solve] is None else {**op_params, "pinv": SOLVES[solve]}
        for sel in sels:
            out.append(Method(sel, "selector", op, sel, params, selector_params(sel, context), op_key, solve))
    names = ATTENTIONS.names() if settings["attns"] in ("all", None) else list(settings["attns"])
    for name in names:
        if name == "full":
            continue
        cls = ATTENTIONS.get(name)
        params = attn_params(name, context)
        sel = default_selector(name) if cls.takes_selector else None
        label = name + (f"/{sel}" if sel else "")
        sel_params = selector_params(sel, context) if sel else {}
        out.append(Method(label, "attention", name, sel, params, sel_params, cls.rank_knob))
    return out


def _with_seed(params: dict[str, Any], seed: int) -> dict[str, Any]:
    return {**params, "seed": seed} if "seed" in params else dict(params)


def build(method: Method, n: int, d: int, m: int | None, seed: int) -> Attention:
    params = _with_seed(method.attn_params, seed)
    if method.m_key is not None and m is not None:
        params[method.m_key] = m
    selector = build_selector(method.selector, **_with_seed(method.selector_params, seed)) if method.selector else None
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
    rank_a = dg.numerical_rank(sigma, tol)
    per_m = {}
    for m in ms:
        if m > n:
            continue
        defined = m <= rank_a  # beyond rank A, U_m holds directions of rounding noise: leverage is undefined
        lev = dg.leverage_scores(u, m)
        per_m[str(m)] = {
            "ey_floor": dg.ratio(dg.eckart_young_floor(sigma, m), norm_a),
            "leverage_defined": defined,
            "block_coherence": dg.block_coherence(lev, dg.query_clusters(inst.q, m)) if defined else None,
            "coherence": dg.coherence(lev, m) if defined else None,
            "leverage_top_share": dg.leverage_top_share(lev, m) if defined else None,
        }
    info = {
        "source": inst.source,
        "instance": inst.name,
        "n": n,
        "d": int(inst.q.shape[-1]),
        "rank_a": rank_a,
        "stable_rank_a": dg.stable_rank(sigma),
        "per_m": per_m,
        "kernel_ranks": kernel_ranks(inst.q, inst.k, tol) if with_ranks else None,
    }
    return info, (a, sigma, norm_a)


def oracle_matrix(module: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """C (C⁺ A R⁺) R: the smallest ‖A − C U R‖_F over every middle matrix U, for the Nyström factors C (n×m) and
    R (m×n) the selector's landmarks give (fp64). What the landmarks allow, whatever the core solve; it uses A,
    so it is an instrument, not an operator."""
    kernels = getattr(module, "kernels", None)
    if not callable(kernels):
        raise ValueError(f"approx.solves=[oracle] needs a Nyström-type operator (with kernels()); got {module.name}")
    kern = kernels(q, k, None)
    left, right = kern.left[0, 0].double(), kern.right[0, 0].double()
    middle = torch.linalg.pinv(left) @ a @ torch.linalg.pinv(right)
    return left @ middle @ right


def evaluate(
    inst: Instance, methods: list[Method], ms: list[int], seeds: list[int], exact: Any
) -> list[dict[str, Any]]:
    """One row per (seed, method, m): residuals against softmax (or the method's own target), floor, ratio.

    The floor is taken at the *effective* rank budget — the landmarks the method really used (valid cluster
    means, pivots before the stopping rule) — with the nominal m beside it. `worse_than_zero` marks an error
    ≥ 1: predicting Â = 0 would have done as well."""
    a, sigma, norm_a = exact
    n, d = inst.q.shape
    rows = []
    for seed in seeds:
        for method in methods:
            # the training solve in fp32, as training runs it; the stable reference and the oracle in fp64
            dtype = torch.float32 if method.solve == "training" else torch.float64
            q_in, k_in = inst.q.to(dtype)[None, None], inst.k.to(dtype)[None, None]
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
                    "solve": method.solve,
                    "m": m,
                    "n": n,
                }
                start = time.perf_counter()
                try:
                    module = build(method, n, d, m, seed)
                    with torch.no_grad():
                        nominal = rank_budget(module, n)
                        pair_fn = getattr(module, "target_pair", None)
                        if callable(pair_fn):  # a method that approximates its own target, not softmax
                            target, estimate = (t[0, 0].double() for t in pair_fn(q_in, k_in, None))
                            r = effective_rank(module, nominal, 0, 0)  # after the call: some keep a rank per call
                            kind = "own"
                            fit = {
                                "matrix_residual": dg.matrix_residual(target, estimate),
                                "output_residual": dg.output_residual(target, estimate, inst.v),
                                "ey_floor": None,
                                "ey_ratio": None,
                            }
                        else:
                            if method.solve == "oracle":
                                a_hat = oracle_matrix(module, q_in, k_in, a)
                            else:
                                a_hat = module.implied_matrix(q_in, k_in, None)[0, 0].double()
                            r = effective_rank(module, nominal, 0, 0)
                            err = dg.fro(a - a_hat)
                            floor = dg.eckart_young_floor(sigma, r) if r is not None else 0.0
                            kind = "softmax"
                            fit = {
                                "matrix_residual": dg.ratio(err, norm_a),
                                "output_residual": dg.output_residual(a, a_hat, inst.v),
                                "ey_floor": dg.ratio(floor, norm_a),
                                "ey_floor_abs": floor,
                                "error_abs": err,
                                "ey_ratio": err / floor if floor > dg.RATIO_UNDEFINED * norm_a else None,
                            }
                        row.update(target=kind, rank_budget=r, rank_budget_nominal=nominal, **fit)
                    finite = row["matrix_residual"] is not None and math.isfinite(row["matrix_residual"])
                    row["status"] = "ok" if finite else "nonfinite"
                    row["worse_than_zero"] = bool(finite and row["matrix_residual"] >= 1.0)
                except Exception as err:
                    row.update(status="error", error=describe_error(err))
                row["seconds"] = time.perf_counter() - start
                rows.append(row)
    return rows
