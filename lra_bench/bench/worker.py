"""Measure one configuration (one attention variant at one n) in both modes; runs inside a fresh child process
when the sweep isolates configurations, in the sweep's own process otherwise.

Order of events, which defines what "peak memory" means (`lra_bench.memory`):
1. build the module and the inputs q, k, v `[B, H, n, d]` (and the upstream gradient), seeded;
2. one untimed call at a small size (n ≤ 256) so library code, thread pools and JIT kernels are resident,
   and one training-mode forward at full size (`prime`: initialises stateful selectors such as GPA's codebook);
3. optionally one untimed call under `torch.utils.flop_counter.FlopCounterMode` (the counted FLOPs);
4. per mode: garbage-collect + `malloc_trim`, read the baseline, then `warmup` untimed and `repeats` timed
   calls; the peak over those calls minus the baseline is the mode's memory.
"""

from __future__ import annotations

import gc
import signal
import time
import traceback
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from lra_bench.bench.references import SDPAReference, reference_dtype
from lra_bench.bench.stats import summarize
from lra_bench.memory import PeakMemory, settle
from lra_bench.registry import build_attention, build_selector

MODES = ("forward", "forward_backward")


def build_module(spec: dict[str, Any], n: int) -> torch.nn.Module:
    """The operator named by `spec` for sequence length `n` (references or a registry attention)."""
    if spec["kind"] == "reference":
        return SDPAReference(spec["attn"])
    selector = build_selector(spec["selector"], **(spec.get("selector_params") or {})) if spec.get("selector") else None
    params = spec.get("attn_params") or {}
    return build_attention(
        spec["attn"], head_dim=spec["d"], num_heads=spec["H"], seq_len=n, selector=selector, **params
    )


def make_inputs(spec: dict[str, Any], n: int, device: torch.device, dtype: torch.dtype, seed: int):
    """q, k, v (leaf tensors that require grad), an optional mask and an upstream gradient."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    shape = (spec["B"], spec["H"], n, spec["d"])
    q, k, v, grad = (torch.randn(shape, generator=gen).to(device=device, dtype=dtype) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    mask = None
    if spec.get("mask"):
        real = max(1, n - int(round(n * float(spec.get("pad_fraction", 0.0)))))
        mask = torch.zeros(spec["B"], n, dtype=torch.bool, device=device)
        mask[:, :real] = True
    return q, k, v, mask, grad


def placement(spec: dict[str, Any]) -> tuple[torch.device, torch.dtype]:
    """The device and dtype `spec` is measured in (a reference may need its own, `reference_dtype`), once torch's
    threads are set as the sweep asks."""
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    device, dtype = torch.device(spec["device"]), getattr(torch, spec["dtype"])
    return device, reference_dtype(spec["attn"], device, dtype) if spec["kind"] == "reference" else dtype


def _place(module: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """Move to the device/dtype only when that changes anything (modules are built as fp32 on the CPU)."""
    if device.type == "cpu" and dtype == torch.float32:
        return module
    return module.to(device=device, dtype=dtype)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, call: Any, *args: Any) -> float:
    """Wall-clock seconds of `call(*args)`, bracketed by device syncs (a GPU's queued work counts in the call that
    queued it)."""
    sync(device)
    start = time.perf_counter()
    call(*args)
    sync(device)
    return time.perf_counter() - start


def _call(module: torch.nn.Module, mode: str, q, k, v, mask, grad) -> None:
    if mode == "forward":
        with torch.no_grad():
            module(q, k, v, mask)
        return
    for t in (q, k, v):
        t.grad = None
    module.zero_grad(set_to_none=True)
    out = module(q, k, v, mask)
    out.backward(grad)


def _set_mode(module: torch.nn.Module, mode: str) -> None:
    module.train(mode != "forward")


def prime(module: torch.nn.Module, tensors) -> None:
    """One training-mode forward (no grad) at the full size before anything is measured, so that stateful
    modules (those with buffers) start as they would in a trained model (GPA's progressive codebook exists and
    is only refreshed every `refresh_every` passes; the timed calls then see the steady state, not the first
    refresh)."""
    if next(module.buffers(), None) is None:
        return  # stateless: nothing to initialise
    q, k, v, mask, _ = tensors
    module.train(True)
    with torch.no_grad():
        module(q, k, v, mask)


def count_flops(module: torch.nn.Module, mode: str, q, k, v, mask, grad) -> int | None:
    """Matmul-type FLOPs PyTorch's FlopCounterMode sees in one call (fused CPU SDPA kernels are invisible to it)."""
    _set_mode(module, mode)
    with FlopCounterMode(display=False) as counter:
        _call(module, mode, q, k, v, mask, grad)
    return int(counter.get_total_flops()) or None


def time_mode(spec: dict[str, Any], module, mode: str, device: torch.device, tensors) -> dict[str, Any]:
    """Warm-up, then timed repeats; stops early (after `min_repeats`) once `max_time_s` of timed calls is spent."""
    _set_mode(module, mode)
    meter = PeakMemory(device)
    meter.start()
    t0 = time.perf_counter()
    first = None
    for _ in range(max(1, int(spec["warmup"]))):
        elapsed = timed(device, _call, module, mode, *tensors)
        first = first if first is not None else elapsed
        if time.perf_counter() - t0 > float(spec["max_warmup_s"]):
            break
    times: list[float] = []
    for _ in range(int(spec["repeats"])):
        times.append(timed(device, _call, module, mode, *tensors))
        if len(times) >= int(spec["min_repeats"]) and sum(times) > float(spec["max_time_s"]):
            break
    peak, baseline, method = meter.stop()
    stats = summarize(times)
    return {
        **{f"time_{key}_s": stats[key] for key in ("median", "q1", "q3", "iqr")},
        "times_s": times,
        "repeats": len(times),
        "first_call_s": first,
        "peak_mem_bytes": int(peak),
        "mem_baseline_bytes": int(baseline),
        "mem_method": method,
    }


def measure(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Run `spec` in each of `spec['modes']`; returns mode → measurements (status `ok` or `error`)."""
    gc.freeze()  # the imported world is permanent: later gc.collect() calls (before baselines) stay cheap
    device, dtype = placement(spec)
    n, seed = int(spec["n"]), int(spec.get("seed", 0))
    out: dict[str, dict[str, Any]] = {}
    try:
        torch.manual_seed(seed)
        module = _place(build_module(spec, n), device, dtype)
        small = min(n, 256)
        if small < n:
            tiny = _place(build_module(spec, small), device, dtype)
            for mode in spec["modes"]:
                _set_mode(tiny, mode)
                _call(tiny, mode, *make_inputs(spec, small, device, dtype, seed))
            del tiny
        tensors = make_inputs(spec, n, device, dtype, seed)
        prime(module, tensors)
    except Exception as err:
        return {mode: {"status": "error", "error": describe_error(err)} for mode in spec["modes"]}
    for mode in spec["modes"]:
        record: dict[str, Any] = {"dtype": str(dtype).replace("torch.", "")}
        try:
            if spec.get("count_flops") and n <= int(spec.get("count_flops_max_n") or n):
                record["flops_counted"] = count_flops(module, mode, *tensors)
                settle(device)
            record.update(time_mode(spec, module, mode, device, tensors))
            record["status"] = "ok"
        except Exception as err:
            record.update(status="error", error=describe_error(err))
            if device.type == "cuda":
                torch.cuda.empty_cache()
        out[mode] = record
    return out


def describe_error(err: BaseException) -> str:
    """A failed measurement in one line: the exception, cut at 400 characters, and the file and line it came from."""
    tb = traceback.extract_tb(err.__traceback__)
    where = f" at {tb[-1].filename.split('/')[-1]}:{tb[-1].lineno}" if tb else ""
    text = f"{type(err).__name__}: {err}"
    return (text if len(text) < 400 else text[:400] + "…") + where


def child(spec: dict[str, Any], conn: Any) -> None:
    """Entry point of an isolated configuration: measure, send the result back, exit.

    Ctrl-C belongs to the parent: the terminal sends SIGINT to the whole foreground group, and a child that
    turned it into an error result would race the parent's kill to a closed pipe (a BrokenPipe traceback on
    the user's terminal). The child ignores it; the parent kills it when the sweep stops.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        result = measure(spec)
    except BaseException as err:
        result = {mode: {"status": "error", "error": describe_error(err)} for mode in spec["modes"]}
    try:
        conn.send(result)
    except (BrokenPipeError, EOFError):  # the parent stopped waiting (Ctrl-C, timeout): nobody to tell
        return
    conn.close()
