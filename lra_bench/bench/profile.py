"""torch.profiler on the configurations that miss a target: where their time goes, by operator.

Run in the sweep's process after the timings (profiling perturbs timing, so it never overlaps them): one
warm-up call, then `steps` profiled calls; the table is the top operators by self CPU (or CUDA) time, with
their share of the total — what limits the method at that size.
"""

from __future__ import annotations

from typing import Any

from torch.profiler import ProfilerActivity, profile

from lra_bench.bench import worker


def profile_spec(spec: dict[str, Any], mode: str, steps: int = 2, top: int = 12) -> dict[str, Any]:
    device, dtype = worker.placement(spec)
    n = int(spec["n"])
    module = worker._place(worker.build_module(spec, n), device, dtype)
    tensors = worker.make_inputs(spec, n, device, dtype, int(spec.get("seed", 0)))
    worker.prime(module, tensors)
    worker._set_mode(module, mode)
    worker._call(module, mode, *tensors)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            worker._call(module, mode, *tensors)
            worker.sync(device)
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, key, 0) > 0]
    total = sum(getattr(e, key) for e in events) or 1.0
    events.sort(key=lambda e: -getattr(e, key))
    rows = [
        {
            "op": e.key,
            "self_ms_per_call": getattr(e, key) / 1e3 / steps,
            "share": getattr(e, key) / total,
            "calls_per_step": e.count / steps,
        }
        for e in events[:top]
    ]
    return {
        "label": spec["label"],
        "n": n,
        "mode": mode,
        "steps": steps,
        "total_ms_per_call": total / 1e3 / steps,
        "top": rows,
    }


def auto_labels(summary: dict[str, Any], rows: list[dict[str, Any]], first_m: Any) -> list[str]:
    """In-scope variants at the first landmark count that miss at least one target."""
    failing = {name.split(" n=")[0] for t in summary["targets"] for name in t.get("failing", [])}
    return list(dict.fromkeys(r["label"] for r in rows if r["label"] in failing and str(r.get("m")) == str(first_m)))
