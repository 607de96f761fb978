"""The same data on every machine: tokens, generated files and their fingerprints do not depend on which BLAS
kernel, thread count or vector code path the CPU runs.

Each setting below starts `tests/machine_probe.py` in a process of its own: OpenBLAS forced onto each kernel this
CPU can execute (`OPENBLAS_CORETYPE`), at 1 and 2 threads, and once with numpy's dispatched loops and glibc's
FMA/AVX2 builds of libm switched off (what an older CPU runs). The Image tokens are also checked against a
pure-Python float32 oracle of TensorFlow's left-to-right sum, over the RGB triples nearest a token boundary (where
a different summation order shows first) plus random ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import REPO

#: OpenBLAS kernels and the /proc/cpuinfo flags they need (SSE3 is `pni` there)
CORETYPES = {
    "Haswell": ("avx2", "fma"),
    "SkylakeX": ("avx512f", "avx512bw", "avx512dq", "avx512vl"),
    "Zen": ("avx2", "fma"),
    "Prescott": ("pni",),
}
THREADS = ("1", "2")
#: glibc's libm picks its FMA/AVX2 builds of sin, cos, exp … by these CPU features (names of glibc >= 2.33)
OLD_CPU_LIBM = "glibc.cpu.hwcaps=-AVX512F,-AVX2,-FMA"
#: what a setting decides: a probe never inherits these from the test's own environment
CONTROLLED = (
    "OPENBLAS_CORETYPE",
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NPY_DISABLE_CPU_FEATURES",
    "NPY_ENABLE_CPU_FEATURES",
    "GLIBC_TUNABLES",
)
WEIGHTS = (0.2989, 0.5870, 0.1140)  # tf.image.rgb_to_grayscale's
SENSITIVE_ULPS = 64  # a triple is rounding-sensitive when its gray·255.5 lies this close to an integer
RANDOM_TRIPLES = 20_000


def cpu_flags() -> set[str]:
    """The CPU's feature flags (empty off Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return next((set(line.split(":", 1)[1].split()) for line in text.splitlines() if line.startswith("flags")), set())


def numpy_dispatch_targets() -> str:
    """numpy's runtime-dispatched SIMD targets this CPU has: `NPY_DISABLE_CPU_FEATURES` turns them off."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    except ImportError:  # numpy < 2
        from numpy.core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    return " ".join(t for t in __cpu_dispatch__ if __cpu_features__.get(t))


def machine_settings() -> dict[str, dict[str, str]]:
    """Name → environment of every setting a probe runs under (only kernels this CPU can execute)."""
    flags = cpu_flags()
    settings: dict[str, dict[str, str]] = {"kernel OpenBLAS picks": {}}
    for core, needs in CORETYPES.items():
        if set(needs) <= flags:
            for n in THREADS:
                settings[f"{core}, {n} threads"] = {
                    "OPENBLAS_CORETYPE": core,
                    "OPENBLAS_NUM_THREADS": n,
                    "OMP_NUM_THREADS": n,
                }
    settings["old CPU: numpy and libm without dispatch"] = {
        "NPY_DISABLE_CPU_FEATURES": numpy_dispatch_targets(),
        "GLIBC_TUNABLES": OLD_CPU_LIBM,
        "OMP_NUM_THREADS": "1",
    }
    return settings


def sensitive_triples() -> np.ndarray:
    """`[n, 3]` uint8: every RGB triple whose exact gray·255.5 lies within `SENSITIVE_ULPS` float32 ulps of an
    integer (where another summation order can change the truncated token), found in float64 a red plane at a
    time."""
    w = np.array(WEIGHTS, dtype=np.float32)
    v = np.arange(256, dtype=np.float32) * np.float32(1.0 / 255.0)
    g, b = (a.ravel() for a in np.meshgrid(np.arange(256), np.arange(256), indexing="ij"))
    rest = (v[g] * w[1]).astype(np.float64) + (v[b] * w[2]).astype(np.float64)
    found = []
    for r in range(256):
        x = (float(v[r] * w[0]) + rest) * 255.5
        near = np.abs(x - np.rint(x)) <= SENSITIVE_ULPS * np.spacing(x.astype(np.float32)).astype(np.float64)
        found.append(np.stack([np.full(near.sum(), r), g[near], b[near]], axis=1))
    return np.concatenate(found).astype(np.uint8)


def oracle(rgb: np.ndarray) -> np.ndarray:
    """TensorFlow's token, one triple at a time in numpy float32 scalars: `((r·w0 + g·w1) + b·w2)·255.5`."""
    scale, back = np.float32(1.0 / 255.0), np.float32(255.5)
    w0, w1, w2 = (np.float32(w) for w in WEIGHTS)
    tokens = []
    for r, g, b in rgb.tolist():
        rf, gf, bf = np.float32(r) * scale, np.float32(g) * scale, np.float32(b) * scale
        tokens.append(int(((rf * w0 + gf * w1) + bf * w2) * back))
    return np.array(tokens, dtype=np.uint8)


def probe_env(setting: dict[str, str]) -> dict[str, str]:
    """This process's environment without the `CONTROLLED` variables, plus `setting`'s."""
    return {**{k: v for k, v in os.environ.items() if k not in CONTROLLED}, **setting}


@pytest.fixture(scope="module")
def triples() -> np.ndarray:
    rng = np.random.default_rng(30)
    return np.concatenate([sensitive_triples(), rng.integers(0, 256, (RANDOM_TRIPLES, 3), dtype=np.uint8)])


@pytest.fixture(scope="module")
def probes(tmp_path_factory: pytest.TempPathFactory, triples: np.ndarray) -> dict[str, dict[str, Any]]:
    """Setting name → the probe's report (plus its gray tokens under `gray`), one process per setting in turn."""
    work = tmp_path_factory.mktemp("machines")
    np.save(work / "rgb.npy", triples)
    reports = {}
    for i, (name, setting) in enumerate(machine_settings().items()):
        out = work / f"probe-{i}"
        cmd = [sys.executable, "-m", "tests.machine_probe", str(work), str(out)]
        proc = subprocess.run(cmd, cwd=REPO, env=probe_env(setting), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{name}: probe failed\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        reports[name] = {**json.loads((out / "report.json").read_text()), "gray": np.load(out / "gray.npy")}
    return reports


def test_the_fixture_is_rounding_sensitive(triples: np.ndarray) -> None:
    """Another summation order changes some of the fixture's tokens: the tokens below would show an order change."""
    want = oracle(triples)
    p = (triples.astype(np.float32) * np.float32(1.0 / 255.0)) * np.array(WEIGHTS, dtype=np.float32)
    for other in (p[:, 0] + (p[:, 1] + p[:, 2]), (p[:, 0] + p[:, 2]) + p[:, 1]):
        assert ((other * np.float32(255.5)).astype(np.uint8) != want).sum() > 0


@pytest.mark.slow  # a process per setting (about 10 s each under load)
def test_image_tokens_are_tensorflows_under_every_blas_kernel_and_thread_count(
    probes: dict[str, dict[str, Any]], triples: np.ndarray
) -> None:
    want = oracle(triples)
    wrong = {name: int((r["gray"] != want).sum()) for name, r in probes.items()}
    kernels = {name: r["blas"] for name, r in probes.items()}
    assert not any(wrong.values()), f"tokens unlike the float32 oracle (of {len(want)}): {wrong}; kernels {kernels}"


@pytest.mark.slow
def test_generated_listops_fingerprint_and_cache_key_are_the_same_everywhere(
    probes: dict[str, dict[str, Any]],
) -> None:
    seen = {name: r["listops"] for name, r in probes.items()}
    assert len({json.dumps(v, sort_keys=True) for v in seen.values()}) == 1, seen
    assert all(seen["kernel OpenBLAS picks"].values())


@pytest.mark.slow
def test_pathfinder_generator_is_the_same_everywhere(probes: dict[str, dict[str, Any]]) -> None:
    seen = {name: r["pathfinder"] for name, r in probes.items()}
    assert len({json.dumps(v, sort_keys=True) for v in seen.values()}) == 1, seen
