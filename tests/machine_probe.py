"""What one process makes of the data, run by `tests/test_same_data_everywhere.py` under each machine setting.

`python -m tests.machine_probe WORK OUT`: the gray tokens of `WORK/rgb.npy` (`OUT/gray.npy`), a small generated
ListOps (always at `WORK/listops`, so the cache keys of two probes are comparable: its files' mtimes are pinned)
and a few Pathfinder images, summarised in `OUT/report.json`: digests only, compared across the settings.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from lra_bench.record.identity import data_identity, fingerprint, run_identity
from tasks import cache
from tasks.base import SPLITS
from tasks.generate import pathfinder
from tasks.image import tf_grayscale
from tasks.listops import ListOpsConfig, ListOpsDataModule
from tests.conftest import TINY_LISTOPS

PINNED_MTIME_NS = 1_600_000_000 * 10**9  # every probe stamps its ListOps files alike: the cache key sees the bytes
#: the test suite's tiny ListOps (`TINY_LISTOPS`' task keys), generated in this process
SMALL_LISTOPS = ListOpsConfig(
    gen_workers=1,
    **{k.removeprefix("task."): int(v) for k, v in (a.split("=", 1) for a in TINY_LISTOPS) if k.startswith("task.")},
)
#: (resolution, contour length, images): every resolution's geometry and renderer
PATHFINDER_SETS = ((32, 14, 6), (64, 9, 3), (128, 14, 3), (256, 6, 1))


def digest(*arrays: np.ndarray) -> str:
    """sha256 of the arrays' dtypes, shapes and bytes."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def listops_report(work: Path) -> dict[str, Any]:
    """The generated ListOps' data fingerprint, cache key, the cached tokens and the run identity's data part."""
    data = work / "listops"
    shutil.rmtree(data, ignore_errors=True)
    dm = ListOpsDataModule(SMALL_LISTOPS, data_dir=str(data), cache_dir=str(work / f"cache-{os.getpid()}"))
    dm.ensure_source()
    files = dm.files()
    assert files is not None
    for path in files.values():
        os.utime(path, ns=(PINNED_MTIME_NS, PINNED_MTIME_NS))
    dm.setup()
    key = cache.cache_key(dm.cache_params())
    origin = dm.origin(files)
    tables = [dm.splits[s].table for s in SPLITS]
    tokens = digest(*(np.asarray(t[c]) for t in tables for c in ("input_ids", "length", "label")))
    identity = run_identity({"task": dm.cfg}, data_identity(dm.tokens))
    return {
        "fingerprint": origin and origin["fingerprint"],
        "cache_key": key,
        "tokens": tokens,
        "data.tokens": dm.tokens,  # the identity's digest, as the harness computes it
        "identity": fingerprint(identity),
    }


def pathfinder_report(out: Path) -> dict[str, str]:
    """Digests of the generated files (images, masks, metadata) and of the geometry tables' floats."""
    files = hashlib.sha256()
    for resolution, contour, count in PATHFINDER_SETS:
        root = pathfinder.generate(out, resolution, contour, count, seed=5, write_masks=True)
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            files.update(path.relative_to(out).as_posix().encode() + path.read_bytes())
    tables = hashlib.sha256()
    for resolution in (32, 64, 128, 256):
        params = pathfinder.PathfinderParams.for_resolution(resolution)
        for margin in params.paddle_margin_list:
            geo = pathfinder._geometry(params, margin)
            weights = [w for variant in geo.cand for row in variant for _, w, _ in row]
            tables.update(geo.tail_vec.tobytes() + geo.head_vec.tobytes() + np.array(weights).tobytes())
    return {"files": files.hexdigest()[:16], "geometry": tables.hexdigest()[:16]}


def blas_kernels() -> list[str]:
    """The BLAS libraries' kernels this process runs (for the failure message), if threadpoolctl is installed."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return sorted(
        {f"{i.get('internal_api')}:{i.get('architecture')}" for i in threadpool_info() if i["user_api"] == "blas"}
    )


def main(work: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "gray.npy", tf_grayscale(np.load(work / "rgb.npy")))
    report = {"listops": listops_report(work), "pathfinder": pathfinder_report(out / "pathfinder")}
    (out / "report.json").write_text(json.dumps({**report, "blas": blas_kernels()}, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
