"""Every kind of upstream, one registration line each, in the order a spec's text is tried (the
first whose syntax matches wins; an exact version is the catch-all). To add a kind: a module in
patchctl/sources/kinds/ with an object satisfying `UpstreamKind`, and a line here."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from patchctl.core.errors import UsageError
from patchctl.sources.kinds import Parsed, UpstreamKind
from patchctl.sources.kinds.commit import COMMIT
from patchctl.sources.kinds.directory import DIRECTORY
from patchctl.sources.kinds.file import FILE
from patchctl.sources.kinds.git import GIT
from patchctl.sources.kinds.image import IMAGE
from patchctl.sources.kinds.installed import INSTALLED
from patchctl.sources.kinds.nightly import NIGHTLY
from patchctl.sources.kinds.release import EXACT, LATEST
from patchctl.sources.refs import KIND_SUFFIX

if TYPE_CHECKING:
    from patchctl.core.engines import Engine
    from patchctl.sources.fetch import SourceContext, Upstream
    from patchctl.sources.refs import EngineRef

KINDS: tuple[UpstreamKind, ...] = (
    INSTALLED,
    LATEST,
    NIGHTLY,
    GIT,
    COMMIT,
    IMAGE,  # before FILE and DIRECTORY: `image:reg/x` holds a path separator
    FILE,
    DIRECTORY,
    EXACT,
)

_BY_NAME = {k.name: k for k in KINDS}
KIND_SUFFIX.update({k.name: k.suffix for k in KINDS})  # how an EngineRef prints itself


def kind_named(name: str) -> UpstreamKind:
    """The kind an EngineRef's `kind` names."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UsageError(f"no such kind of upstream: {name!r}") from None


def names() -> tuple[str, ...]:
    return tuple(_BY_NAME)


def parse(text: str | None, engine: Engine) -> tuple[UpstreamKind, Parsed]:
    """The kind the text after `@` is written in (None: no `@`), and what it says. The engine's
    `kinds:` in engines.yaml, when present, limits which it accepts."""
    for kind in KINDS:
        parsed = kind.parse(text, engine)
        if parsed is None:
            continue
        if engine.kinds is not None and kind.name not in engine.kinds:
            raise UsageError(f"{engine.name} has no {kind.syntax} upstream (engines.yaml: kinds {', '.join(engine.kinds)})")
        return kind, parsed
    # The catch-all (an exact version) first, as people read it: "not a PEP 440 version, 'latest', ..."
    assert text is not None  # no `@`: INSTALLED takes it, or the engine's kinds refused it above
    written = [k.syntax for k in (KINDS[-1], *KINDS[:-1]) if k is not INSTALLED]
    shown = repr(text) if len(text) <= 100 else repr(text[:60] + "...")
    raise UsageError(f"{shown} is not {', '.join(written[:-1])} or {written[-1]}")


def open_upstream(ref: EngineRef, ctx: SourceContext) -> Upstream:
    """The ref's version and the FileSource of its pristine files."""
    return kind_named(ref.kind).open(ref, ctx)


def open_upstream_soon(ref: EngineRef, ctx: SourceContext) -> Callable[[], Upstream]:
    """open_upstream on a thread of its own, so that the caller's work runs while the network
    answers; the returned function waits for it and raises what it raised. A daemon thread: a
    caller that fails first (a damaged store) exits at once, not after the network's timeout."""
    opened: list[Upstream] = []
    failed: list[BaseException] = []

    def work() -> None:
        try:
            opened.append(open_upstream(ref, ctx))
        except BaseException as exc:  # noqa: BLE001  (handed to the caller, which raises it)
            failed.append(exc)

    thread = threading.Thread(target=work, name="open-upstream", daemon=True)
    thread.start()

    def result() -> Upstream:
        thread.join()
        if failed:
            raise failed[0]
        return opened[0]

    return result
