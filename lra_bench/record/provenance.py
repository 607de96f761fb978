"""Where a result came from: git commit, package versions, hardware. Never reads secrets.

Light at import (torch only inside `hardware`): the record builder, the sweep callback and the study commands
import it before, or without, a run.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from lra_bench import runtime

PACKAGES = ("torch", "pytorch-lightning", "hydra-core", "omegaconf", "datasets", "wandb", "torchmetrics", "numpy")
REPO_ROOT = Path(__file__).resolve().parents[2]


def code_version() -> dict[str, Any]:
    """`{"commit": sha, "dirty": bool}` of the checkout this code runs from (tracked files only; both null outside
    a git checkout). Recorded with every run and checkpoint; a resume warns when it changed."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return {"commit": None, "dirty": None}
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return {"commit": sha.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def code_label(code: dict[str, Any] | None) -> str:
    """`<sha>` or `<sha>-dirty` (what `env.git_commit` has always said); `unknown` outside a checkout."""
    if not code or not code.get("commit"):
        return "unknown"
    return code["commit"] + ("-dirty" if code.get("dirty") else "")


def git_commit() -> str | None:
    code = code_version()
    return code_label(code) if code["commit"] else None


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_fields() -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        if ":" in line:
            key, value = line.split(":", 1)
            fields[key.strip()] = value.strip()
    return fields


def cpu_name(fields: dict[str, str] | None = None) -> str:
    fields = cpu_fields() if fields is None else fields
    return fields.get("model name") or platform.processor() or platform.machine()


def cpu_identity(fields: dict[str, str] | None = None) -> str | None:
    """`family F model M stepping S` from /proc/cpuinfo (None elsewhere): virtual machines often name every AMD
    EPYC generation alike ("AMD EPYC"), so the name alone cannot tell a Zen 3 from a Zen 5."""
    fields = cpu_fields() if fields is None else fields
    if "cpu family" not in fields:
        return None
    return f"family {fields['cpu family']} model {fields.get('model', '?')} stepping {fields.get('stepping', '?')}"


def hardware() -> dict[str, Any]:
    """The machine a run's timings belong to. Two records compare their step times only when these are equal
    (`compare`), so it holds what changes speed: the CPU's identity and the vector instructions torch's kernels
    use (`cpu_capability`: AVX512, AVX2, …; machines sold under one name differ in it)."""
    import torch  # only when the hardware is read (see the module docstring)

    fields = cpu_fields()
    info: dict[str, Any] = {
        "cpu": cpu_name(fields),
        "cpu_id": cpu_identity(fields),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
    }
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        info["memory_gib"] = round(pages * size / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        info["memory_gib"] = None
    return info


def environment() -> dict[str, Any]:
    return {
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": package_versions(),
        "hardware": hardware(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "runtime": runtime.describe(),
    }
