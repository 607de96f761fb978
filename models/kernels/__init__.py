"""Compiled CPU kernels, built from the C++ sources beside this file on first use.

Why compiled: the CPU training step spends most of its time in memory passes torch runs one op at a time; a fused
kernel does the same arithmetic in one pass over data that stays in cache (see each source's header for what it
computes). Built with torch's C++ extension tooling into a cache folder per torch version, Python version and CPU
capability (`LRA_BENCH_KERNEL_CACHE`, default `~/.cache/lra-bench/kernels`), so the first run on a machine compiles
(about a minute) and every later one loads. The sources never use `-march=native`: their vector loops are compiled
for AVX-512, AVX2 and a baseline and picked at load time, so a cache on a shared file system serves every node.

Each kernel builds in a folder named by a digest of its source, the shared headers (`*.h` beside them: the hashed
dropout mask, the argument check) and its flags, and compiles from copies of them kept in that folder. So a changed
header or source builds afresh, and every checkout of the same sources loads one build: torch's loader hands ninja
the sources' absolute paths, and a build made from another checkout's path was compiled again — about a minute each
time two checkouts (two worktrees, a second clone on a cluster sharing the cache) took turns. The digest also
holds the path torch is imported from: the compiler's command names torch's headers by that path, and ninja builds
again when its command changes, so two environments (a venv and a link to it, two venvs) taking turns on one folder
compiled each time; each now has its folder.

Builds of one kernel are serialised by a lock the system drops with its holder (`filelock`'s flock), not only by
torch's own: torch's loader marks a build with a `lock` file it removes when the build ends, so a build that was
killed (a Ctrl-C during `make install`, a session ended mid-compile) leaves one behind and every later load waits on it
forever — what ended a CI run at its time limit. Under the held flock no build of ours is running, so a `lock` file
found there is such a leftover and is removed first.

A machine that cannot build them (no compiler, no headers) gets `None` from `load` and one line on stderr; callers
then run their eager form.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

import torch
from filelock import FileLock

SOURCES = Path(__file__).parent

#: a kernel's own compiler flags. `-fno-trapping-math` lets GCC turn a floating-point compare-and-select into a
#: vector blend (otherwise it keeps a branch, for a trap torch never enables) — GELU's sign and range selects, the
#: dropout factor on AVX2 — which also lets it contract a multiply and an add around the select into one FMA
#: (fp32 rounding), so it is given only to the kernels written for it: the others keep the values they had. The
#: RPCholesky and pivoted-QR pivots, the row log-sum-exp, the flash kernel's softmax, local attention, Performer's
#: features and blocked core, Skyformer's kernel and the spectral mixer's tanh need it to vectorise their selects
#: (the log-weights of drawable tokens, the clamped downdates, exp's floor, the masked scores, the clamp, tanh's two
#: branches).
#: `-ffp-contract=off` keeps polynomial attention's feature loops, vectorised along a block's rows, in the operations
#: of its scalar rows (a product, then a sum: no FMA), so the features and their gradients are those rows' bit for bit
FLAGS: dict[str, tuple[str, ...]] = {
    "fused_encoder": ("-fno-trapping-math",),
    "rpcholesky_pivots": ("-fno-trapping-math",),
    "row_logsumexp": ("-fno-trapping-math",),
    "pivoted_qr": ("-fno-trapping-math",),
    "local_attention": ("-fno-trapping-math",),
    "shifted_exp": ("-fno-trapping-math",),
    "performer_core": ("-fno-trapping-math",),
    "clamped_exp": ("-fno-trapping-math",),
    "flash_attention": ("-fno-trapping-math",),
    "tanh_affinity": ("-fno-trapping-math",),
    "polynomial_features": ("-ffp-contract=off",),
}

#: the file torch's extension loader creates in the build folder while it builds, and waits on while it exists
TORCH_BUILD_MARK = "lock"


def cache_dir() -> Path:
    """The build folders of this torch, Python and CPU capability."""
    root = Path(os.environ.get("LRA_BENCH_KERNEL_CACHE", Path.home() / ".cache" / "lra-bench" / "kernels"))
    tag = f"torch{torch.__version__}-py{sys.version_info.major}{sys.version_info.minor}"
    return root / f"{tag}-{platform.machine()}-{torch.backends.cpu.get_cpu_capability()}".replace("+", "_")


def inputs(name: str) -> list[Path]:
    """What a build of kernel `name` compiles: its source and the shared headers."""
    return [SOURCES / f"{name}.cpp", *sorted(SOURCES.glob("*.h"))]


def cflags(name: str) -> list[str]:
    """The compiler flags of kernel `name`: the same for every kernel but its own `FLAGS`."""
    return ["-O3", *FLAGS.get(name, ())]


def build_dir(name: str) -> Path:
    """The build folder of kernel `name` as its sources read now: `<name>-<digest of sources, flags, torch path>`."""
    digest = hashlib.sha256(" ".join(cflags(name)).encode())
    digest.update(b"\0" + os.path.dirname(torch.__file__).encode())  # the headers' path in the compiler's command
    for path in inputs(name):
        digest.update(b"\0" + path.name.encode() + b"\0" + path.read_bytes())
    return cache_dir() / f"{name}-{digest.hexdigest()[:12]}"


def stage_sources(name: str, build: Path) -> Path:
    """Copies of the build's inputs in its folder, written only where missing or different (an unchanged copy keeps
    its time stamp, so ninja finds the build up to date); the copied source's path, for the compiler."""
    for path in inputs(name):
        copy, content = build / path.name, path.read_bytes()
        if not copy.is_file() or copy.read_bytes() != content:
            partial = build / f".{path.name}.{os.getpid()}"
            partial.write_bytes(content)
            partial.replace(copy)
    return build / f"{name}.cpp"


def draw_seed() -> int:
    """One seed for one call's in-kernel dropout mask, from torch's default CPU generator (so a run's masks follow
    its seed, and a resume, which restores that generator, draws the same ones)."""
    return int(torch.randint(0, 2**62, (1,), dtype=torch.int64).item())


@cache
def load(name: str) -> ModuleType | None:
    """The compiled module of `SOURCES/<name>.cpp`, built on first use; None (with one line on stderr) where it
    cannot be built."""
    from torch.utils import cpp_extension  # imports setuptools: only when a kernel is asked for

    build = build_dir(name)
    build.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(build / "build.flock"):
            (build / TORCH_BUILD_MARK).unlink(missing_ok=True)  # a killed build's: see the module's docstring
            return cpp_extension.load(
                name=f"lra_bench_{name}",
                sources=[str(stage_sources(name, build))],
                build_directory=str(build),
                extra_cflags=cflags(name),
                verbose=False,
            )
    except (OSError, RuntimeError, ImportError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"[lra-bench] kernel {name!r} could not be built ({first}); running the eager form", file=sys.stderr)
        return None


def applies(name: str, x: torch.Tensor) -> bool:
    """Whether kernel `name` can compute on `x`: a CPU tensor of fp32 or fp64, and the kernel built here."""
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and load(name) is not None


def built(name: str) -> ModuleType:
    """The compiled module of `name`, for a caller that checked `load(name)` first (its eager form otherwise)."""
    module = load(name)
    assert module is not None, f"models.kernels: the kernel {name!r} is not built on this machine"
    return module


def groups(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """`[..., n, k]` tensors as the contiguous `[G, n, k]` the blocked cores read (G: the leading dims, B × H)."""
    return [t.reshape(-1, *t.shape[-2:]).contiguous() for t in tensors]
