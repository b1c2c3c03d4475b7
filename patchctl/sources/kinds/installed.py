"""`ENGINE` with no `@`: the engine installed in an environment. It names no upstream files of its
own (`apply` and `ensure` patch the installed tree); `apply --install` installs the latest release."""

from __future__ import annotations

from typing import TYPE_CHECKING

from patchctl.core.errors import UsageError
from patchctl.sources.kinds import Parsed
from patchctl.sources.kinds.common import Refusals
from patchctl.sources.kinds.release import LATEST

if TYPE_CHECKING:
    from patchctl.core.engines import Engine
    from patchctl.sources.fetch import SourceContext, Upstream
    from patchctl.sources.kinds import PinnedBuild
    from patchctl.sources.refs import EngineRef


class Installed(Refusals):
    name = "installed"
    syntax = "nothing (the installed engine)"

    def parse(self, text: str | None, engine: Engine) -> Parsed | None:
        return Parsed() if text is None else None

    def suffix(self, ref: EngineRef) -> str:
        return ""

    def open(self, ref: EngineRef, ctx: SourceContext) -> Upstream:
        raise UsageError(f"{ref} names no upstream files (use ENGINE@VERSION)")

    def pin(self, ref: EngineRef, python: str, ctx: SourceContext) -> PinnedBuild:
        return LATEST.pin(ref, python, ctx)


INSTALLED = Installed()
