"""Peak-memory probes: the attention benchmark's (`lra_bench.bench.worker`) and the run's efficiency callback's
(`lra_bench.run.metrics`), below both so that neither imports the other for them.

CUDA: `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`, minus `memory_allocated` just
before the measured calls (tensor memory only; the caching allocator's reserve is not counted).

CPU: the process's resident set. Linux lets a process reset its own high-water mark (writing `5` to
`/proc/self/clear_refs` sets VmHWM to the current VmRSS, kernel ≥ 4.0), so the peak of a phase is VmHWM read
after the phase minus VmRSS read just before it. Before that baseline we run the garbage collector and
`malloc_trim(0)`, so memory freed by earlier phases is handed back to the OS rather than silently reused.
Where the reset is not possible we fall back to `getrusage` ru_maxrss (the lifetime peak — only meaningful in a
fresh process) and say so in the `method` field.
"""

from __future__ import annotations

import ctypes
import gc
import resource
import sys
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def status_kib(key: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def rss_bytes() -> int | None:
    """Current resident set size (VmRSS), or None off Linux."""
    kib = status_kib("VmRSS")
    return None if kib is None else kib * 1024


def malloc_trim() -> None:
    """Return freed heap memory to the OS (glibc); a no-op elsewhere."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def settle(device: torch.device) -> None:
    """Free what can be freed before a baseline: Python garbage, the CUDA cache, glibc's heap."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    malloc_trim()


class PeakMemory:
    """`start()` before a phase, `stop()` after it → (peak − baseline bytes, baseline bytes, method name)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.baseline = 0
        self.method = ""

    def start(self) -> None:
        settle(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = torch.cuda.memory_allocated(self.device)
            self.method = "cuda_max_memory_allocated"
            return
        rss = rss_bytes()
        try:
            CLEAR_REFS.write_text("5")
            self.method = "rss_hwm_reset"
        except OSError:
            self.method = "ru_maxrss"
        self.baseline = rss if rss is not None else 0

    def stop(self) -> tuple[int, int, str]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) - self.baseline, self.baseline, self.method
        if self.method == "rss_hwm_reset":
            hwm = status_kib("VmHWM")
            peak = (hwm or 0) * 1024
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            peak = peak if sys.platform == "darwin" else peak * 1024
        return max(0, peak - self.baseline), self.baseline, self.method
