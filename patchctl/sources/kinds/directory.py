"""`ENGINE@./tree` (anything with a path separator, or starting with `.` or `~`): a tree on disk,
a checkout or an unpacked package, read in place. Checked only: it is neither installed nor
smoke-tested; `export --full` copies its packages."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from patchctl.core.errors import UsageError
from patchctl.sources.fetch import Upstream
from patchctl.sources.files import DirectorySource
from patchctl.sources.installed import version_of_tree
from patchctl.sources.kinds import Parsed
from patchctl.sources.kinds.common import Refusals

if TYPE_CHECKING:
    from patchctl.core.engines import Engine
    from patchctl.sources.fetch import SourceContext
    from patchctl.sources.files import FileSource
    from patchctl.sources.refs import EngineRef


class Directory(Refusals):
    name = "path"
    syntax = "a directory"

    def parse(self, text: str | None, engine: Engine) -> Parsed | None:
        if text is None or not (os.sep in text or text.startswith((".", "~"))):
            return None
        return Parsed(path=os.path.expanduser(text))

    def suffix(self, ref: EngineRef) -> str:
        return f"@{ref.path}"

    def open(self, ref: EngineRef, ctx: SourceContext) -> Upstream:
        engine = ref.engine
        assert ref.path is not None  # parse gives every path ref its path
        root = Path(ref.path).resolve()
        if not root.is_dir():
            raise UsageError(f"{ref.path} is not a directory")
        package = engine.version_package
        prefix = engine.layout_prefix("git")
        if prefix and (root / prefix / package).is_dir():
            root = root / prefix
        if not (root / package).is_dir():
            raise UsageError(f"{root} does not contain the {package}/ package")
        version = ctx.version_override or version_of_tree(engine, root) or version_of_tree(engine, root.parent)
        if version is None:
            raise UsageError(f"cannot tell the {engine.name} version of {root}", hint="pass --as-version X.Y.Z")
        return Upstream(ref, version, DirectorySource(root), f"{engine.name} {version} ({root})")

    def full_source(self, upstream: Upstream, ctx: SourceContext) -> FileSource:
        return upstream.source


DIRECTORY = Directory()
