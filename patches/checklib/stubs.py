"""Import-time stand-ins for modules a CPU smoke environment cannot import: one finder for them all.

A check (or a probe) that imports engine code from a release tree on a CPU meets imports it cannot
satisfy there: compiled extensions a source tree lacks (vLLM's `_C`), modules that touch CUDA at
import time, packages whose PyPI wheels cannot sit next to the CPU torch build (torchvision).
`install` puts a `StubFinder` on `sys.meta_path` that serves such names (a name and every module
below it) in one of three kinds:

- "anything": a package whose every attribute is a stand-in (`Stub`) that can be called, indexed,
  dotted into and derived from. For code that is imported but not run by the checks.
- "empty": a module with no attributes (`from m import x` raises ImportError), as a source tree's
  missing compiled extension would be if it were built without ops.
- "absent": the import raises ModuleNotFoundError, as for a module the engine is expected to
  report as unavailable on this machine.

`first=True` puts the finder before the real ones (the stand-in wins even where the real module
exists); `first=False` after them (only what is really missing is stood in for). `stub_missing`
is the second, for roots that do not import. `package_without_init` serves a package's modules
from its folder without running its __init__.py (which imports the GPU-only parts).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

KINDS = ("anything", "empty", "absent")


class Stub:
    """A stand-in for a name a stub module would hold: calling it, indexing it or reading an
    attribute gives another stand-in; a class statement may derive from it (the class gets
    `object` as that base, see __mro_entries__); `isinstance(x, stub)` and `issubclass(c, stub)`
    are False."""

    def __init__(self, name: str):
        self.__qualname__ = name
        self.__name__ = name.rsplit(".", 1)[-1]

    def __call__(self, *args, **kwargs):
        return Stub(self.__qualname__ + "()")

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return Stub(f"{self.__qualname__}.{item}")

    def __getitem__(self, item):
        return Stub(self.__qualname__ + "[]")

    def __mro_entries__(self, bases):
        return (object,)

    # `Stub | None` in an annotation evaluated at import time (a module-level `X | None`)
    def __or__(self, other):
        return self

    def __ror__(self, other):
        return self

    def __instancecheck__(self, instance):
        return False

    def __subclasscheck__(self, subclass):
        return False

    def __repr__(self):
        return f"<stub {self.__qualname__}>"


class StubModule(types.ModuleType):
    """An "anything" stub: every attribute not set on it is a stand-in."""

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return Stub(f"{self.__name__}.{item}")


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves `prefixes` (each a module name and everything below it) as stubs of one kind."""

    def __init__(self, prefixes, kind: str = "anything"):
        if kind not in KINDS:
            raise ValueError(f"stub kind {kind!r}: one of {', '.join(KINDS)}")
        self.prefixes = tuple(prefixes)
        self.kind = kind

    def covers(self, name: str) -> bool:
        return any(name == p or name.startswith(p + ".") for p in self.prefixes)

    def find_spec(self, name, path=None, target=None):
        if not self.covers(name):
            return None
        if self.kind == "absent":
            raise ModuleNotFoundError(f"{name} is stubbed out as absent for this check", name=name)
        return importlib.machinery.ModuleSpec(name, self, is_package=self.kind == "anything")

    def create_module(self, spec):
        if self.kind == "empty":
            return None  # a plain module
        module = StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0+stub"
        module.__file__ = "<stub>"
        return module

    def exec_module(self, module):
        pass


def install(*prefixes: str, kind: str = "anything", first: bool = True) -> StubFinder:
    finder = StubFinder(prefixes, kind)
    if first:
        sys.meta_path.insert(0, finder)
    else:
        sys.meta_path.append(finder)
    return finder


def stub_missing(*roots: str) -> StubFinder | None:
    """ "anything" stubs for those of `roots` that do not import here (nothing real is shadowed)."""
    missing = []
    for root in roots:
        try:
            __import__(root)
        except ImportError:
            missing.append(root)
    return install(*missing, first=False) if missing else None


def package_without_init(name: str, directory) -> types.ModuleType:
    """Register package `name` as the folder `directory` without running its __init__.py: its
    submodules import from there (stub the GPU-only ones with `install`)."""
    package = types.ModuleType(name)
    package.__path__ = [str(directory)]
    sys.modules[name] = package
    return package
