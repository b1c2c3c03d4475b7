"""A tree patchctl works on, and the one rule for what may be written into it. A tree is an installed
engine or a source checkout, by its import root, version and build."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from packaging.version import Version

from patchctl.core.engines import Engine
from patchctl.core.errors import EnvironmentProblem, StoreError
from patchctl.tree.bookkeeping import BuildRecord, TargetState


class Target(NamedTuple):
    engine: Engine
    root: Path  # import root
    version: Version
    how: str  # "installed in /usr/bin/python3", "directory"
    build: BuildRecord | None = None  # which build this is (installed by --install, or read from its dist-info)

    def state(self) -> TargetState:
        return TargetState(self.root, self.engine.name, packages=tuple(self.engine.packages))


def check_paths(target: Target, paths: Iterable[str]) -> None:
    """The one rule for every path a command writes into a tree (apply, revert, --from-release,
    recovery through the record): inside one of the engine's packages (a `.pth` beside them runs code
    at every interpreter start; another distribution's files are not ours), and a path the file
    system can hold there: no name over NAME_MAX, no file where a folder must be, no folder where the
    file goes. Bad patch input is refused (exit 2) before anything is written, never an exit 3
    from the writer halfway."""
    from patchctl.core.paths import outside_packages

    packages = tuple(target.engine.packages)
    for rel in paths:
        parts = rel.split("/")
        if os.path.isabs(rel) or ".." in parts or "\0" in rel:
            raise StoreError(f"refusing {rel!r}: it leaves the tree")
        if outside_packages([rel], packages):
            raise StoreError(
                f"refusing {rel}: patchctl writes only files inside the {', '.join(p + '/' for p in packages)} package",
                hint="a patch of another distribution belongs in that engine's series",
            )
        try:
            name_max = os.pathconf(target.root, "PC_NAME_MAX")
        except (OSError, ValueError):
            name_max = 255
        long = [p for p in parts if len(os.fsencode(p)) > name_max]
        if long:
            raise StoreError(
                f"refusing {rel}: the name {long[0][:40]}… is {len(os.fsencode(long[0]))} bytes, more "
                f"than the file system holds ({name_max})"
            )
        here = target.root
        for part in parts[:-1]:
            here = here / part
            if here.exists() and not here.is_dir():
                raise StoreError(f"refusing {rel}: {here.relative_to(target.root)} is a file, not a folder")
        final = target.root / rel
        if final.is_dir():
            raise StoreError(f"refusing {rel}: it is a folder in the tree, not a file")


def check_writable(root: Path, paths: list[str]) -> None:
    for rel in paths:
        file = root / rel
        directory = file.parent  # a rename into it needs the directory writable, not the file
        while not directory.exists():
            directory = directory.parent
        if not os.access(directory, os.W_OK):
            raise EnvironmentProblem(
                f"cannot write {file}: permission denied; nothing was changed",
                hint="run as the owner of the environment, or use --target on a copy",
            )
