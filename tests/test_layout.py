"""The package layout: no import cycles in the project's code, counting function-level imports too, neither between
modules nor between the harness's layers (its subpackages and top-level modules); few imports inside functions, each
with its reason; no function longer than MAX_FUNCTION_LINES.

Why function-level imports count: a cycle hidden inside a function still means two modules that each need the
other (neither can be read, tested or moved alone), and the import order then decides at run time whether it works.
Imports under `if TYPE_CHECKING:` count as well: they are only for annotations, but a cycle through them is the
same design knot. The graph is read from the source with `ast` (nothing is imported), so the test is fast.

Why a length limit: a function that does not fit on a screen does several jobs (issue 21 found four 140–182-line
renderers), and its parts can then be neither named nor tested alone.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("lra_bench", "models", "tasks", "hydra_plugins")
#: where the function-length limit applies (the scripts too: they are maintained code)
LENGTH_CHECKED = ("lra_bench", "models", "tasks", "scripts")
MAX_FUNCTION_LINES = 80
#: where imports inside functions are counted, and how many may stay: each one a command's `--help` that must not
#: load torch, a light module on the pre-flight's path, an optional library (issue 34: 192 of them hid cycles)
LAZY_CHECKED = ("lra_bench", "models", "tasks", "scripts")
MAX_LAZY_IMPORTS = 50


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Every module of the project's packages, by dotted name."""
    out: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            out[module_name(path, root)] = path
    return out


def imported(node: ast.Import | ast.ImportFrom, here: str, is_package: bool, modules: set[str]) -> list[str]:
    """The project modules one import statement depends on: `from a import b` depends on module `a.b` when there is
    one (not on package `a`'s facade), else on `a`, which defines `b`."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the importing module's package
        package = here.split(".") if is_package else here.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]


def import_graph(root: Path = ROOT, packages: Iterable[str] = PACKAGES) -> dict[str, set[str]]:
    """module → the project modules it imports anywhere in its body (module level and inside functions)."""
    modules = project_modules(root, packages)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in imported(node, name, path.name == "__init__.py", set(modules)):
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every import cycle lies in
    exactly one of them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph[node]:
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert found == [], "import cycles (each a set of modules that import each other):\n" + "\n".join(
        " ↔ ".join(c) for c in found
    )


def layer_graph(root: Path = ROOT, package: str = "lra_bench") -> dict[str, set[str]]:
    """The harness's layers as one graph: each subpackage or top-level module of `package` is one node (`run`,
    `config`, `reproduce`), with an arrow wherever one of its modules imports another node's."""

    def layer(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if parts[0] == package and len(parts) > 1 else None

    graph: dict[str, set[str]] = {}
    for module, targets in import_graph(root, [package]).items():
        here = layer(module)
        if here is None:
            continue
        graph.setdefault(here, set())
        for target in targets:
            there = layer(target)
            if there is not None and there != here:
                graph[here].add(there)
                graph.setdefault(there, set())
    return graph


def test_the_layers_import_one_way() -> None:
    """No two layers of the harness need each other (a cycle between packages is an arrow back up the layers, even
    when no two files form one)."""
    found = cycles(layer_graph())
    assert found == [], "layers that import each other (move the shared part below both):\n" + "\n".join(
        " ↔ ".join(c) for c in found
    )


def lazy_imports(root: Path = ROOT, folders: Iterable[str] = LAZY_CHECKED) -> list[str]:
    """`path:line` of every import inside a function."""
    found: list[str] = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            lines: set[int] = set()  # (a nested function's import is inside its outer function too: counted once)
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines |= {sub.lineno for sub in ast.walk(node) if isinstance(sub, (ast.Import, ast.ImportFrom))}
            found += [f"{path.relative_to(root)}:{line}" for line in sorted(lines)]
    return found


def test_few_imports_inside_functions() -> None:
    found = lazy_imports()
    assert len(found) <= MAX_LAZY_IMPORTS, (
        f"{len(found)} imports inside functions (at most {MAX_LAZY_IMPORTS}: import at the top unless start-up time "
        "needs it, and say why):\n" + "\n".join(found)
    )


def test_layer_and_lazy_checks_see_what_is_planted(tmp_path: Path) -> None:
    """The checks themselves: two subpackages that import each other only through different files are a layer
    cycle; an import inside a nested function counts."""
    for folder in ("pkg", "pkg/low", "pkg/high"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "pkg/high/a.py").write_text("from pkg.low import b\n")
    (tmp_path / "pkg/low/b.py").write_text("X = 1\n")
    (tmp_path / "pkg/low/c.py").write_text("def f():\n    def g():\n        from pkg.high import a\n")
    assert cycles(import_graph(tmp_path, ["pkg"])) == []
    assert cycles(layer_graph(tmp_path, "pkg")) == [["high", "low"]]
    assert lazy_imports(tmp_path, ["pkg"]) == ["pkg/low/c.py:3"]


def test_cycle_finder_sees_a_planted_function_level_cycle(tmp_path: Path) -> None:
    """The check itself: a cycle made only of a function-level import is found."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.a import x\n")
    (pkg / "c.py").write_text("from . import a\n")
    assert cycles(import_graph(tmp_path, ["pkg"])) == [["pkg.a", "pkg.b"]]


def long_functions(root: Path = ROOT, folders: Iterable[str] = LENGTH_CHECKED) -> list[str]:
    """`path:line name (N lines)` for every function (methods and nested ones too) over MAX_FUNCTION_LINES."""
    found = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_over_the_length_limit() -> None:
    found = long_functions()
    assert found == [], f"functions over {MAX_FUNCTION_LINES} lines (split them into named parts):\n" + "\n".join(found)


def test_length_check_sees_a_long_method(tmp_path: Path) -> None:
    """The check itself: a method one line over the limit is found, one at the limit is not."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 1))
    (pkg / "a.py").write_text(f"class A:\n    def ok(self):\n{body}\n\n    def long(self):\n{body}\n        y = 0\n")
    assert long_functions(tmp_path, ["pkg"]) == [
        f"pkg/a.py:{MAX_FUNCTION_LINES + 3} long ({MAX_FUNCTION_LINES + 1} lines)"
    ]
