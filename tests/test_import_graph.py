"""The package's import graph: no cycle among module-level imports, and a core that knows nothing of
the command line (pip-tools' test_circular_imports, by reading the code instead of importing it)."""
from __future__ import annotations

import ast
from pathlib import Path

import patchctl

ROOT = Path(patchctl.__file__).parent
# The command-line layer: the registry, the commands, their options, and the terminal.
CLI_LAYER = ("patchctl.cli", "patchctl.commands", "patchctl.options", "patchctl.progress")
TERMINAL_LIBRARIES = ("click", "rich")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, *, module_level_only: bool) -> set[str]:
    """patchctl modules (and third-party top-level names) a module imports."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]

    def visit(nodes, in_function=False):
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not module_level_only:
                    visit(node.body, True)
                continue
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue  # never executed
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                # `from pkg import submodule` depends on the submodule; `from mod import name` on mod
                names = {f"{base}.{alias.name}" for alias in node.names}
                submodules = {n for n in names if n in MODULES}
                found.update(submodules)
                if len(submodules) < len(names):
                    found.add(base)
            for field in ("body", "orelse", "finalbody", "handlers"):
                child = getattr(node, field, None)
                if isinstance(child, list):
                    visit(child, in_function)

    visit(tree.body)
    return found


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def internal(names: set[str]) -> set[str]:
    return {n for n in names if n in MODULES}


def test_no_import_cycle():
    graph = {m: internal(imports(p, module_level_only=True)) - {m} for m, p in MODULES.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycle = stack[stack.index(n):] + [n]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if n not in state:
                dfs(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            dfs(m)


def test_core_imports_neither_the_cli_nor_the_terminal():
    offenders = []
    for m, p in MODULES.items():
        if m.startswith(CLI_LAYER) or m.startswith("patchctl.testing"):
            continue
        for name in imports(p, module_level_only=False):
            if name.startswith(CLI_LAYER) or name.split(".")[0] in TERMINAL_LIBRARIES:
                offenders.append(f"{m} imports {name}")
    assert not offenders, "\n".join(offenders)


def test_the_graph_reader_sees_a_cycle(tmp_path):
    """The check can fail: two modules importing each other are reported."""
    pkg = tmp_path / "patchctl"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from patchctl import b\n")
    (pkg / "b.py").write_text("import patchctl.a\n")
    global MODULES
    saved = MODULES
    try:
        globals()["ROOT"] = pkg
        MODULES = {module_name(p): p for p in pkg.rglob("*.py")}
        try:
            test_no_import_cycle()
        except AssertionError as exc:
            assert "patchctl.a -> patchctl.b -> patchctl.a" in str(exc)
        else:
            raise AssertionError("the cycle was not found")
    finally:
        globals()["ROOT"] = Path(patchctl.__file__).parent
        MODULES = saved
