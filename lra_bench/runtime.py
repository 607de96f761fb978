"""How a process of the harness uses the CPU: threads, idle threads, freed memory — settled before torch starts.

Measured on a 2-vCPU AMD EPYC (Zen 5) with torch 2.13's CPU build (libgomp, MKL/oneDNN), the faithful ListOps
training step (`python -m lra_bench.bench.step`):

* **Idle OpenMP threads spin.** With two threads and the other core busy (any shared machine) a step ran 4× slower
  than at one thread (5.09 s vs 1.26 s), because libgomp's waiting threads spin for their next parallel region.
  `OMP_WAIT_POLICY=PASSIVE` makes them sleep. libgomp reads it once, when torch loads it, so `prepare_process`
  sets it (unless the environment already does) before anything imports torch.
* **Freed memory is re-faulted.** glibc returns the top of the heap to the kernel on every large free (its trim
  threshold) and serves every allocation of 32 MiB or more (its largest mmap threshold on 64-bit: a [32, 2, 2048,
  64] fp32 tensor of Nyström's landmark weights, and every [B, H, n, 256] tensor of Linformer and Performer) with a
  fresh mapping, so each training step faulted its pages in again (0.4 s of kernel time in a 1.65 s step).
  `keep_freed_memory` sets at start-up (`mallopt`, the same as `MALLOC_TRIM_THRESHOLD_` / `MALLOC_TOP_PAD_` /
  `MALLOC_MMAP_MAX_` in the environment): never trim, grow the heap 64 MiB at a time, and no mmap at all, so the
  heap keeps what it freed and the next step reuses it; the numbers are bitwise the same. Without the last one a
  32 MiB `torch.exp` took 40 ms instead of 16 (8,193 page faults per call), and a Performer layer's forward and
  backward 3.4 s instead of 1.5 (AMD EPYC with AVX2, one thread). The price is resident memory: what the heap
  keeps counts in a run's CPU peak (the resident set), 2.67 → 3.93 GiB for Performer's protocol step and
  1.90 → 1.96 GiB for Nyström's; the attention benchmark's memory probes (`lra_bench.memory`) trim the
  heap before they measure and are unaffected.
* **Threads follow the CPUs the process may use**: its affinity mask, capped by `SLURM_CPUS_PER_TASK` under
  SLURM (`usable_cpus`), unless `threads=N` (or `OMP_NUM_THREADS`) says otherwise.

Everything here is logistics: it changes how fast a run goes, never what it computes beyond fp32 reduction order
(which thread count can change); the record's `env.runtime` says what a run used.

`uptime` is the machine's load as a study records it beside its timings (the locality and spt studies).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import sys
from typing import Any

#: glibc mallopt parameters (malloc.h) and the values that keep freed memory in the heap: never trim, grow the heap
#: 64 MiB at a time, serve every allocation from the heap (no mmap: glibc's mmap threshold stops at 32 MiB)
MALLOPT = {"M_TRIM_THRESHOLD": (-1, 2**31 - 1), "M_TOP_PAD": (-2, 64 << 20), "M_MMAP_MAX": (-4, 0)}
MALLOC_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_")

_applied: dict[str, Any] = {}


def keep_freed_memory() -> dict[str, int] | None:
    """Set `MALLOPT` with glibc's `mallopt` (None: not glibc, or the user set the `MALLOC_*_` variables)."""
    if sys.platform != "linux" or any(k in os.environ for k in MALLOC_ENV):
        return None
    path = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(path or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other libcs have no mallopt
        return None
    return {name: value for name, (param, value) in MALLOPT.items() if mallopt(param, value) == 1}


def prepare_process() -> None:
    """Before torch is imported: passive OpenMP waiting and the allocator settings (each only once, and only
    where the environment does not already choose)."""
    if _applied:
        return
    if "torch" in sys.modules:
        _applied["note"] = "torch was imported before the runtime settings; OMP_WAIT_POLICY may not apply"
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    _applied["malloc"] = keep_freed_memory()


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by SLURM's `--cpus-per-task` when set."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    return min(cpus, int(slurm)) if slurm.isdigit() and int(slurm) > 0 else cpus


def set_threads(threads: int | None) -> int:
    """torch's intra-op threads: `threads`, else `OMP_NUM_THREADS`, else `usable_cpus()`; returns the number."""
    import torch  # here, not at the top: this module settles the process before torch loads

    env = os.environ.get("OMP_NUM_THREADS", "")
    chosen = int(threads) if threads else int(env) if env.isdigit() and int(env) > 0 else usable_cpus()
    if torch.get_num_threads() != chosen:
        torch.set_num_threads(chosen)
    return chosen


def describe() -> dict[str, Any]:
    """What the record's `env.runtime` says: the threads torch uses, the CPUs it may, the wait policy, the
    allocator settings this process applied."""
    import torch  # (see `set_threads`)

    return {
        "threads": torch.get_num_threads(),
        "usable_cpus": usable_cpus(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "malloc": _applied.get("malloc") or {k: os.environ[k] for k in MALLOC_ENV if k in os.environ} or None,
        **({"note": _applied["note"]} if "note" in _applied else {}),
    }


def uptime() -> str:
    """The machine's load as `uptime` prints it (else the load average): a study records it before and after its
    runs, so a reader can tell whether the machine was busy while it timed them."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"load average {os.getloadavg()}"
