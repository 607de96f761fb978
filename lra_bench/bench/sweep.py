"""Run the sweep: for each n (ascending), every variant; skip what would not fit, record what fails, go on.

n is the outer loop so that all methods at one n are measured close together in time — on a shared machine
the ratios between them (speed-ups) are then less exposed to load drifting over the sweep.

Ctrl-C stops the sweep, not the report: `SweepStopped` carries every configuration measured before it (the one in
flight is dropped, its process killed), and the app renders those (`lra_bench.bench.__main__`).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import torch

from lra_bench.bench import costs, worker
from lra_bench.bench.variants import Variant
from models.landmarks.base import resolve_num_landmarks

_PRELOAD = [
    "torch",
    "torch._dynamo",
    "models.attention",
    "models.landmarks",
    "lra_bench.bench.worker",
]  # _dynamo: FlopCounterMode
_CTX: Any = None


def _context() -> Any:
    """A forkserver that has imported torch and the registries once; each configuration is a fresh fork of it
    (its own address space, so its own peak memory) without paying the imports again."""
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(_PRELOAD)
    return _CTX


class SweepStopped(KeyboardInterrupt):
    """Ctrl-C during the sweep: `rows` are the configurations measured before it, `at` the one it stopped."""

    def __init__(self, rows: list[dict[str, Any]], at: str) -> None:
        super().__init__(f"stopped at {at}")
        self.rows, self.at = rows, at


def run_isolated(spec: dict[str, Any], timeout_s: float) -> dict[str, dict[str, Any]]:
    ctx = _context()
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=worker.child, args=(spec, send), daemon=True)
    proc.start()
    send.close()
    result: dict[str, dict[str, Any]] | None = None
    why = ""
    try:
        if recv.poll(timeout_s):
            result = recv.recv()
        else:
            why = f"timed out after {timeout_s:.0f} s"
    except EOFError:
        pass
    except BaseException:  # Ctrl-C: the measurement in flight is abandoned, its process never outlives us
        proc.kill()
        proc.join()
        raise
    proc.join(10)
    if proc.is_alive():
        proc.kill()
        proc.join()
    if result is None:
        if not why:
            code = proc.exitcode
            why = f"child exited with code {code}" + (" (killed: out of memory?)" if code == -9 else "")
        status = "timeout" if why.startswith("timed out") else "error"
        result = {mode: {"status": status, "error": why} for mode in spec["modes"]}
    return result


def spec_for(variant: Variant, n: int, cfg: Any, device: torch.device, threads: int) -> dict[str, Any]:
    m_value = resolve_num_landmarks(variant.m, n) if variant.m is not None else None
    params = dict(variant.attn_params)
    if variant.m_key is not None:
        params[variant.m_key] = m_value  # resolved: "log2" means ⌈log₂ n⌉ of this n, for every attention
    return {
        "label": variant.label,
        "attn": variant.attn,
        "kind": variant.kind,
        "selector": variant.selector,
        "m": variant.m,
        "m_value": m_value,
        "attn_params": params,
        "selector_params": variant.selector_params,
        "B": int(cfg.batch_size),
        "H": int(cfg.num_heads),
        "d": int(cfg.head_dim),
        "n": int(n),
        "device": str(device),
        "dtype": str(cfg.dtype),
        "mask": bool(cfg.mask),
        "pad_fraction": float(cfg.pad_fraction),
        "modes": list(cfg.modes),
        "warmup": int(cfg.warmup),
        "max_warmup_s": float(cfg.max_warmup_s),
        "repeats": int(cfg.repeats),
        "min_repeats": int(cfg.min_repeats),
        "max_time_s": float(cfg.max_time_s),
        "threads": threads,
        "seed": int(cfg.seed),
        "count_flops": bool(cfg.count_flops),
        "count_flops_max_n": cfg.get("count_flops_max_n"),
    }


def estimate_bytes(spec: dict[str, Any], mode: str, history: list[tuple[int, float]]) -> tuple[float | None, str]:
    """Peak bytes a call is expected to need (inputs included) and where the number comes from."""
    itemsize = torch.empty((), dtype=getattr(torch, spec["dtype"])).element_size()
    b, h, n, d = spec["B"], spec["H"], spec["n"], spec["d"]
    inputs = (4 + (3 if mode != "forward" else 0)) * b * h * n * d * itemsize
    est = costs.memory_estimate(costs.Point.of(spec), mode, itemsize)
    if est is not None:
        return est + inputs, "formula"
    est = costs.extrapolate_memory(history, n)
    if est is not None:
        return est + inputs, "extrapolated"
    return None, "unknown"


def attach_costs(row: dict[str, Any], spec: dict[str, Any], mode: str, matmul_rate: float | None) -> None:
    flops = costs.attention_flops(costs.Point.of(spec))
    row["flops"] = None if flops is None else flops.for_mode(mode)
    t = row.get("time_median_s")
    row["achieved_flops_per_s"] = row["flops"] / t if row["flops"] and t else None
    row["rate_fraction"] = (
        row["achieved_flops_per_s"] / matmul_rate if row["achieved_flops_per_s"] and matmul_rate else None
    )


def run_sweep(
    variants: list[Variant],
    cfg: Any,
    device: torch.device,
    threads: int,
    budget_bytes: float,
    matmul_rate: float | None,
    log: Any = print,
) -> list[dict[str, Any]]:
    """Every (n, variant, mode) row; Ctrl-C raises `SweepStopped` with the rows measured before it."""
    rows: list[dict[str, Any]] = []
    at = "the first configuration"

    def sweep() -> None:
        """Append each configuration's rows to `rows` once it is measured; `at` names the current one."""
        nonlocal at
        history: dict[tuple[str, str], list[tuple[int, float]]] = {}
        dead: dict[str, str] = {}  # label → why larger n are skipped
        isolate = bool(cfg.isolate)
        for n in sorted(int(x) for x in cfg.seq_lens):
            for variant in variants:
                at = f"n={n}, {variant.label}"
                spec = spec_for(variant, n, cfg, device, threads)
                base = {k: spec[k] for k in ("label", "attn", "kind", "selector", "m", "m_value", "B", "H", "d", "n")}
                base.update(device=spec["device"], isolated=isolate, default_selector=variant.default_selector)
                plan: dict[str, dict[str, Any]] = {}
                for mode in spec["modes"]:
                    est, source = estimate_bytes(spec, mode, history.get((variant.label, mode), []))
                    row = {**base, "mode": mode, "mem_estimate_bytes": est, "mem_estimate_source": source}
                    if variant.label in dead:
                        row.update(status="skipped", note=dead[variant.label])
                    elif est is not None and est > budget_bytes:
                        row.update(
                            status="skipped",
                            note=f"estimated {est / 2**30:.1f} GiB ({source}) > budget {budget_bytes / 2**30:.1f} GiB",
                        )
                    plan[mode] = row
                todo = [mode for mode, row in plan.items() if "status" not in row]
                elapsed = 0.0
                if todo:
                    spec["modes"] = todo
                    started = time.perf_counter()
                    result = run_isolated(spec, float(cfg.timeout_s)) if isolate else worker.measure(spec)
                    elapsed = time.perf_counter() - started
                    for mode in todo:
                        plan[mode].update(result.get(mode, {"status": "error", "error": "no result"}))
                        if plan[mode]["status"] == "timeout":
                            dead[variant.label] = f"skipped: timed out at n={n}"
                for mode, row in plan.items():
                    attach_costs(row, spec, mode, matmul_rate)
                    if row.get("status") == "ok":
                        history.setdefault((variant.label, mode), []).append((n, float(row["peak_mem_bytes"])))
                    rows.append(row)  # kept before it is reported: a Ctrl-C after the line below never loses it
                if todo:
                    log(f"[bench] n={n:>6} {variant.label:<40} {_brief(plan, todo)}  ({elapsed:.1f} s)")

    try:
        sweep()
    except KeyboardInterrupt as stop:
        raise SweepStopped(rows, at) from stop
    return rows


def _brief(plan: dict[str, dict[str, Any]], todo: list[str]) -> str:
    parts = []
    for mode in todo:
        row = plan[mode]
        if row.get("status") == "ok":
            parts.append(f"{mode}: {row['time_median_s'] * 1e3:9.2f} ms {row['peak_mem_bytes'] / 2**20:8.1f} MiB")
        else:
            parts.append(f"{mode}: {row.get('status')} {str(row.get('error', ''))[:80]}")
    return " | ".join(parts)
