"""`python -m models.kernels`: build every compiled kernel now (what `make install` runs), so the first run does not
wait for the compiler; prints where each one lives, or the line saying why it could not be built.

Why a process per kernel: each kernel is one source file, so torch's loader compiles it on one core; built one
after another the six there were then took 140 s of an install on a 2-core Zen 5 (idle, fresh cache), built side by
side, one process per usable core, 69 s. Each build is its own folder under its own lock (`models.kernels.load`), so
the processes never share a file.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

from models.kernels import SOURCES, load


def build(name: str) -> str | None:
    """Build (or find built) kernel `name` in this process; where its module lives, or None where it cannot be built
    (`load` has said why)."""
    module = load(name)
    return None if module is None else str(module.__file__)


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the system has one: Linux; else the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


if __name__ == "__main__":
    names = sorted(source.stem for source in SOURCES.glob("*.cpp"))
    with ProcessPoolExecutor(max_workers=max(1, min(len(names), usable_cores()))) as pool:
        for name, where in zip(names, pool.map(build, names)):
            if where is not None:
                print(f"[lra-bench] kernel {name}: {where}")
