"""The machine's own yardstick: the fp32 rate of one large square matmul, measured in the same run.

The achieved rate of an attention is reported as a fraction of this number (an MFU-style ratio against what
this CPU/GPU, with these threads, actually delivers — not a datasheet peak). On CUDA, TF32 is switched off
for the measurement so the yardstick is true fp32, like the attention runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import psutil
import torch

from lra_bench.bench.stats import summarize
from lra_bench.bench.worker import timed


class Yardstick(NamedTuple):
    """One square fp32 matmul as a call (`call(i)`, synchronised on a GPU, TF32 off), its size and its FLOPs."""

    call: Callable[[int], None]
    size: int
    flops: float


def matmul_yardstick(device: torch.device, size: int | str = "auto") -> Yardstick:
    """The yardstick matmul, for a caller that times it itself (`matmul_rate`; the step benchmark, between its
    steps, so that the rate it reports was measured under the load the steps ran under)."""
    if size == "auto":
        size = 8192 if device.type == "cuda" else 2048
    size = int(size)
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(device)
    b = torch.randn(size, size, generator=gen).to(device)

    def call(_: int = 0) -> None:
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            torch.mm(a, b)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32

    return Yardstick(call, size, 2.0 * size**3)


def matmul_rate(device: torch.device, size: int | str = "auto", repeats: int = 10, warmup: int = 3) -> dict[str, Any]:
    """Median FLOP/s of `size`×`size` fp32 matmuls (2·size³ FLOPs each)."""
    call, size, flops = matmul_yardstick(device, size)
    stats = summarize([timed(device, call, i) for i in range(warmup + repeats)][warmup:])
    median, fastest = stats["median"], stats["min"]
    if median is None or fastest is None:
        raise ValueError(f"matmul yardstick: repeats={repeats}, so nothing was timed (need ≥ 1)")
    return {
        "size": size,
        "dtype": "float32",
        "flops": flops,
        "time_median_s": stats["median"],
        "time_iqr_s": stats["iqr"],
        "flops_per_s": flops / median,
        "flops_per_s_best": flops / fastest,
    }


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device=cuda but torch.cuda.is_available() is False; use device=auto or device=cpu")
    return device


def memory_budget(value: Any, device: torch.device) -> tuple[float, str]:
    """Bytes a configuration may need: a number of GiB, or `auto` (CPU: 70% of available RAM now; CUDA: 90%
    of the device's total memory)."""
    if value not in (None, "auto"):
        return float(value) * 2**30, f"{float(value):g} GiB (memory_budget_gib)"
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return 0.9 * total, f"auto: 90% of {total / 2**30:.1f} GiB device memory"
    avail = psutil.virtual_memory().available
    return 0.7 * avail, f"auto: 70% of {avail / 2**30:.1f} GiB available RAM"
