"""The package's layers, held, and drawn by its folders: every import (at module level, inside
functions and under `if TYPE_CHECKING:` alike) points to the importer's own layer or one below it,
the graph has no cycle, and the core knows nothing of the command line. CONTRIBUTING.md ("Layers")
draws the same table.

The graph is read from the code (pip-tools' test_circular_imports, by reading instead of importing):
an ast walk of every `import` and `from ... import` anywhere in a module. Type-only imports count
too: a type a lower layer names from a layer above ties the two together all the same (an error that
carries a payload lives with its payload, or carries plain data).
"""

from __future__ import annotations

import ast
from pathlib import Path

import patchctl

# ---------------------------------------------------------------------------------------------
# KNOWN EXCEPTIONS: imports that break the layering or close a cycle today, each in a file another
# branch owns and is fixing. An entry here exempts exactly that edge (importer, imported) from both
# checks. Remove an entry once its fix lands; test_known_exceptions_are_still_needed fails for an
# entry that no longer occurs, so the list can only shrink.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}
# ---------------------------------------------------------------------------------------------

ROOT = Path(patchctl.__file__).parent

# Lowest first: one folder per layer or feature, so this table is the folders. A module may import its
# own layer and the layers below it, never one above. A name covers the module and, for a package,
# everything in it; the most specific name wins (cli.main sits above the rest of cli/).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("ground", ("patchctl", "patchctl.core")),
    ("sources and store", ("patchctl.sources", "patchctl.store", "patchctl.image")),
    (
        "the work",
        ("patchctl.patching", "patchctl.tree", "patchctl.smoke", "patchctl.validate", "patchctl.matrix", "patchctl.rebase"),
    ),
    ("command line", ("patchctl.cli",)),
    ("entry point", ("patchctl.cli.main", "patchctl.cli.__main__")),
]
# The command-line layers: nothing below them imports these or a terminal library.
CLI_LAYERS = ("command line", "entry point")
TERMINAL_LIBRARIES = ("click", "rich")
# At most this many modules directly under patchctl/ (issue 34): the rest live in their layer's folder.
LOOSE_MODULES_MAX = 6


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """What a module imports, anywhere in it (functions and `if TYPE_CHECKING:` blocks included):
    patchctl modules by their full name, third-party packages by their top-level name."""
    tree = ast.parse(path.read_text())
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            # `from pkg import submodule` depends on the submodule; `from mod import name` on mod
            names = {f"{base}.{alias.name}" for alias in node.names}
            submodules = {n for n in names if n in MODULES}
            found.update(submodules)
            if len(submodules) < len(names):
                found.add(base)
    return found


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def layer_of(module: str) -> int:
    """The index in LAYERS of the most specific name covering module."""
    best, length = -1, -1
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            covers = module == name or (module.startswith(name + ".") and name != "patchctl")
            if covers and len(name) > length:
                best, length = index, len(name)
    if best < 0:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS (and to CONTRIBUTING.md)")
    return best


def graph() -> dict[str, set[str]]:
    """Each patchctl module and the patchctl modules it imports, known exceptions left out."""
    out = {}
    for m, p in MODULES.items():
        out[m] = {n for n in imports(p) if n in MODULES and n != m and (m, n) not in KNOWN_EXCEPTIONS}
    return out


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state:
                found = dfs(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state:
            found = dfs(m)
            if found:
                return found
    return None


def test_every_module_has_a_layer():
    for m in MODULES:
        layer_of(m)


def test_no_import_cycle():
    """Imports inside functions count: a cycle through one breaks as soon as that function runs
    during another module's import, and it ties the two modules together all the same."""
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_nothing_imports_upward():
    offenders = []
    for m, imported in graph().items():
        for n in sorted(imported):
            if layer_of(n) > layer_of(m):
                offenders.append(f"{m} ({LAYERS[layer_of(m)][0]}) imports {n} ({LAYERS[layer_of(n)][0]})")
    assert not offenders, "\n".join(offenders)


def test_core_imports_neither_the_cli_nor_the_terminal():
    cli_layers = {i for i, (title, _) in enumerate(LAYERS) if title in CLI_LAYERS}
    offenders = []
    for m, p in MODULES.items():
        if layer_of(m) in cli_layers:
            continue
        for name in imports(p):
            if name.split(".")[0] in TERMINAL_LIBRARIES:
                offenders.append(f"{m} imports {name}")
    assert not offenders, "\n".join(offenders)


def test_known_exceptions_are_still_needed():
    """An exception whose import is gone must leave the list (the coordinator removes entries after
    merging the branch that fixed it)."""
    gone = [edge for edge in KNOWN_EXCEPTIONS if edge[0] not in MODULES or edge[1] not in imports(MODULES[edge[0]])]
    assert not gone, f"no longer imported, remove from KNOWN_EXCEPTIONS: {gone}"


def _fake_package(tmp_path: Path, files: dict[str, str], monkeypatch) -> None:
    pkg = tmp_path / "patchctl"
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    monkeypatch.setitem(globals(), "ROOT", pkg)
    monkeypatch.setitem(globals(), "MODULES", {module_name(p): p for p in pkg.rglob("*.py")})
    monkeypatch.setitem(globals(), "KNOWN_EXCEPTIONS", {})


def test_the_graph_reader_sees_a_cycle_through_a_function(tmp_path, monkeypatch):
    """The check can fail: a cycle closed by an import inside a function is reported."""
    _fake_package(
        tmp_path,
        {
            "__init__.py": "",
            "core/__init__.py": "",
            "core/errors.py": "from patchctl.core import atomic\n",
            "core/atomic.py": "def f():\n    import patchctl.core.errors\n",
        },
        monkeypatch,
    )
    assert find_cycle(graph()) == ["patchctl.core.atomic", "patchctl.core.errors", "patchctl.core.atomic"]


def test_the_graph_reader_sees_an_upward_import_inside_a_function(tmp_path, monkeypatch):
    _fake_package(
        tmp_path,
        {
            "__init__.py": "",
            "sources/__init__.py": "",
            "cli/__init__.py": "",
            "cli/main.py": "",
            "sources/x.py": "def f():\n    from patchctl.cli.main import main\n",
        },
        monkeypatch,
    )
    try:
        test_nothing_imports_upward()
    except AssertionError as exc:
        assert "patchctl.sources.x (sources and store) imports patchctl.cli.main (entry point)" in str(exc)
    else:
        raise AssertionError("the upward import was not found")


def test_the_graph_reader_counts_type_checking_blocks(tmp_path, monkeypatch):
    """A type named from a layer above is an upward import too (the third build's errors.py named
    tree.operations' and patching.evaluate's types so, and 50 modules formed one circle)."""
    _fake_package(
        tmp_path,
        {
            "__init__.py": "",
            "cli/__init__.py": "",
            "cli/options.py": "",
            "core/__init__.py": "",
            "core/paths.py": "",
            "core/errors.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from patchctl.cli.options import WriteRules\n"
                "else:\n    from patchctl.core import paths\n"
            ),
        },
        monkeypatch,
    )
    assert graph()["patchctl.core.errors"] == {"patchctl.cli.options", "patchctl.core.paths"}


def test_the_folders_are_the_layer_table():
    """Every folder of the package is named in LAYERS (or lies in one that is), and at most
    LOOSE_MODULES_MAX modules sit directly under patchctl/."""
    named = {n for _, names in LAYERS for n in names}
    folders = {module_name(p.parent) for p in ROOT.rglob("__init__.py") if p.parent != ROOT}
    unnamed = sorted(f for f in folders if not any(f == n or f.startswith(n + ".") for n in named if n != "patchctl"))
    assert not unnamed, f"folders in no layer: {unnamed} (add them to LAYERS and CONTRIBUTING.md)"
    loose = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(loose) <= LOOSE_MODULES_MAX, f"{len(loose)} modules directly under patchctl/: {loose}"


def test_commands_never_import_each_other():
    """A command parses, calls the work layer and renders; what two commands share lives below them."""
    commands = {m for m in MODULES if m.startswith("patchctl.cli.commands.")}
    shared = {"patchctl.cli.commands.framework", "patchctl.cli.commands.text"}
    offenders = [
        f"{m} imports {n}"
        for m in sorted(commands - shared)
        for n in sorted(imports(MODULES[m]) & (commands - shared))
        if (m, n) not in KNOWN_EXCEPTIONS
    ]
    assert not offenders, "\n".join(offenders)


def test_contributing_draws_these_layers():
    """CONTRIBUTING.md's diagram names every module and package of LAYERS, in the same order."""
    text = (ROOT.parent / "CONTRIBUTING.md").read_text()
    diagram = text.split("## Layers", 1)[1].split("```", 2)[1]
    lines = diagram.splitlines()

    def line_of(name: str) -> int:
        short = name.removeprefix("patchctl.").replace(".", "/")
        for index, line in enumerate(lines):
            words = line.replace(",", " ").split()
            if any(w.rstrip("/") in (short, short + ".py", f"patchctl/{short}", f"patchctl/{short}.py") for w in words):
                return index
        raise AssertionError(f"{name} is not in CONTRIBUTING.md's layer diagram")

    order = [[line_of(n) for n in names if n != "patchctl"] for _, names in LAYERS]
    for lower, upper in zip(order, order[1:], strict=False):
        assert min(lower) > max(upper), "the diagram draws the layers top (cli) to bottom (ground)"


# Generated code (the compiled JSON schemas) is written by scripts/compile_schemas.py, not read by people.
MODULE_LINE_LIMIT = 500


def test_no_hand_written_module_is_over_the_house_limit():
    """One module per idea, none over 500 lines (the guide's house rule): a module that grows past it
    holds two ideas; split it by idea, as tree/operations.py and cli/commands/validate.py were."""
    root = Path(patchctl.__file__).parent
    compiled = root / "core" / "schemas" / "compiled"
    over = {
        str(p.relative_to(root)): n
        for p in root.rglob("*.py")
        if compiled not in p.parents and (n := len(p.read_text(encoding="utf-8").splitlines())) > MODULE_LINE_LIMIT
    }
    assert not over, f"modules over {MODULE_LINE_LIMIT} lines: {over}"
