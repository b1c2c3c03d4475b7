"""`ENGINE[@VERSION]` → EngineRef.

VERSION is an exact PEP 440 version, `latest`, `nightly`, `git:REF`, `commit:SHA`, `file:PATH` (a
wheel or sdist on disk) or a local directory (anything containing a path separator, or starting with
`.` or `~`). Each is a kind of upstream (patchctl/sources/kinds/), tried in the order of
patchctl/sources/registry.py.

`commit:SHA` (7 to 40 hex digits) names the build of one upstream commit on the engine's nightly
wheel index: vLLM's `<root>/<SHA>/` (e.g. `vllm@commit:2f3f441f8`). For a git nightly source (SGLang) it
is the same as `git:SHA`.
"""

from __future__ import annotations

from patchctl.core.engines import get_engine
from patchctl.core.errors import UsageError
from patchctl.sources import registry
from patchctl.sources.refs import EngineRef

__all__ = ["KINDS", "EngineRef", "parse_spec", "shown"]  # EngineRef: importing it from here loads the registry

KINDS = registry.names()


def shown(text: str) -> str:
    """The spec as a message quotes it: a runaway one (a 5000-digit version) shortened."""
    return repr(text) if len(text) <= 100 else repr(text[:60] + "...") + f" ({len(text)} characters)"


def parse_spec(text: str) -> EngineRef:
    name, sep, rest = text.strip().partition("@")
    if not name:
        raise UsageError(f"bad spec {shown(text)}: expected ENGINE[@VERSION], e.g. vllm@0.23.0")
    engine = get_engine(name)
    if sep and not rest:
        raise UsageError(f"bad spec {shown(text)}: nothing after '@'")
    try:
        kind, parsed = registry.parse(rest if sep else None, engine)
    except UsageError as exc:
        raise UsageError(f"bad spec {shown(text)}: {exc.message}", hint=exc.hint) from None
    return EngineRef(engine, kind.name, *parsed)
