"""The carried wheels: which of them the running Python lacks, installing those into a temporary site, and
proving the result works (`python -m scripts.gpu.wheelsite verify` prints a JSON verdict).

Why only the missing ones: the GPU node's own packages (torch, numpy, pyarrow, …) must stay the ones that run;
a carried copy of something it already has would shadow it through PYTHONPATH. The verification therefore
checks, in a fresh process with the site on PYTHONPATH, that every listed module imports, that torch still comes
from the node's environment, that nothing in the site shadows a module the node already has, and that every
requirement the listed distributions declare is installed (a version outside the declared range is a warning:
`--no-deps` installs skip pip's resolver, so this is the only place it is looked at).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
WHEEL_LIST = HERE / "wheels.txt"


@dataclass(frozen=True)
class Wanted:
    """One line of wheels.txt."""

    dist: str
    version: str
    module: str
    sdist: bool = False

    @property
    def wheel_prefix(self) -> str:
        """Wheel file names normalise `-` to `_` (PEP 427)."""
        return f"{self.dist.replace('-', '_')}-{self.version}-"


def read_list(path: Path = WHEEL_LIST) -> list[Wanted]:
    out = []
    for raw in path.read_text().splitlines():
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        dist, _, version = words[0].partition("==")
        if not version or len(words) < 2:
            raise ValueError(f"{path}: {raw.strip()!r}: expected 'NAME==VERSION MODULE [sdist]'")
        out.append(Wanted(dist, version, words[1], sdist=words[2:] == ["sdist"]))
    return out


def importable(module: str) -> bool:
    """Whether `module` can be imported here (without importing it; parents of a dotted name are imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def find_wheel(wheel_dir: Path, wanted: Wanted) -> Path | None:
    matches = sorted(wheel_dir.glob(f"{wanted.wheel_prefix}*.whl"))
    return matches[0] if matches else None


def install_command(python: str, wheels: list[Path], site: Path) -> list[str]:
    return [
        python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
        "--disable-pip-version-check", "--target", str(site), *map(str, wheels),
    ]  # fmt: skip


def _top_level_names(site: Path) -> list[str]:
    """Modules and regular packages a site directory provides (what could shadow the node's own). Namespace
    packages — implicit (`hydra_plugins`: no `__init__.py`) or pkgutil/pkg_resources style (omegaconf's
    `pydevd_plugins`) — merge with the node's portions of the same name instead of replacing them: not counted."""
    names = set()
    for entry in site.iterdir():
        if entry.name.endswith((".dist-info", ".egg-info", ".pth")) or entry.name in ("bin", "__pycache__"):
            continue
        if entry.is_dir() and _regular_package(entry) or entry.suffix == ".py":
            names.add(entry.name.removesuffix(".py"))
        elif entry.suffix == ".so":
            names.add(entry.name.split(".", 1)[0])
    return sorted(names)


def _regular_package(folder: Path) -> bool:
    init = folder / "__init__.py"
    if not init.exists():
        return False
    text = init.read_text(errors="replace")
    return "extend_path" not in text and "declare_namespace" not in text


def requirement_problems(dists: list[str]) -> tuple[list[str], list[str]]:
    """(missing, out-of-range) requirements of `dists` (no extras) in the current environment."""
    from packaging.requirements import Requirement

    missing, out_of_range = [], []
    for dist in dists:
        try:
            requires = importlib.metadata.distribution(dist).requires or []
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{dist} (itself)")
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                have = importlib.metadata.version(req.name)
            except importlib.metadata.PackageNotFoundError:
                missing.append(f"{req.name} (needed by {dist})")
                continue
            if req.specifier and not req.specifier.contains(have, prereleases=True):
                out_of_range.append(f"{req.name} {have} outside {req.specifier} (needed by {dist})")
    return missing, out_of_range


def verify(site: Path | None, wanted: list[Wanted], shadow_probe: list[str]) -> dict:
    """Run in the process whose PYTHONPATH holds `site` (see the module docstring). `shadow_probe` are the
    site's top-level names that the node had before the install (computed by the caller without the site)."""
    failed = {}
    for w in wanted:
        try:
            __import__(w.module)
        except Exception as err:  # an ImportError, or a broken package raising anything at import
            failed[w.module] = f"{type(err).__name__}: {err}"
    import torch

    torch_file = str(Path(torch.__file__).resolve())
    missing, out_of_range = requirement_problems([w.dist for w in wanted])
    return {
        "import_errors": failed,
        "torch": torch.__version__,
        "torch_file": torch_file,
        "torch_from_site": bool(site) and torch_file.startswith(str(site.resolve())),
        "shadowed": shadow_probe,
        "missing_requirements": missing,
        "out_of_range": out_of_range,
        "versions": {w.dist: _version(w.dist) for w in wanted},
    }


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def shadow_candidates(site: Path) -> list[str]:
    """Names in `site` that are importable without it (call this in the process *without* the site)."""
    return [name for name in _top_level_names(site) if importable(name)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.gpu.wheelsite")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("verify", help="print a JSON verdict on the environment (site on PYTHONPATH)")
    check.add_argument("--site", type=Path, default=None)
    check.add_argument("--shadowed", default="", help="comma-separated names the caller found shadowed")
    check.add_argument("--list", type=Path, default=WHEEL_LIST, help="the wheel list (default: wheels.txt)")
    args = parser.parse_args(argv)
    shadowed = [s for s in args.shadowed.split(",") if s]
    print(json.dumps(verify(args.site, read_list(args.list), shadowed), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
