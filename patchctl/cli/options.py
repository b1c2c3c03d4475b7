"""Options shared by several commands, defined once (pip's cmdoptions, pip-tools' options).

Some only declare a flag; the injecting ones turn flags into the objects commands work with:
`source_options` gives a command `ctx` (a SourceContext), `store_option` gives `store` (a Store),
`apply_options` / `write_options` give `options` (the engine's Options), `target_options` gives `where` (a TargetSpec).
They run inside the command's error handling, so a bad store or a bad --as-version becomes a
document with its exit code, not a traceback. Nothing heavy is imported here: `ensure` starts fast.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable
from typing import Any

import click
from packaging.version import InvalidVersion, Version

from patchctl.core.versions import parse_version

F = Callable[..., Any]


class VersionParam(click.ParamType):
    """A PEP 440 version (or, with allow_latest, the word `latest`): a bad one names its option."""

    name = "version"

    def __init__(self, allow_latest: bool = False):
        self.allow_latest = allow_latest

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, Version) or (self.allow_latest and value == "latest"):
            return value
        try:
            return parse_version(str(value))  # bounded: a 5000-digit version is a usage error, not a traceback
        except InvalidVersion:
            expected = "a PEP 440 version" + (" or 'latest'" if self.allow_latest else "")
            self.fail(f"{value!r} is not {expected} (e.g. 0.23.0)", param, ctx)


class EngineParam(click.ParamType):
    """An engine named in engines.yaml."""

    name = "engine"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from patchctl.core.engines import all_engines

        if value in all_engines():
            return value
        self.fail(f"unknown engine {value!r} (known: {', '.join(sorted(all_engines()))})", param, ctx)


# The longest --wait: ~31 years, finite; NaN and inf (and 1e400, which is inf) would wait forever, and
# a negative wait was taken as none without a word. The deployment schema's `wait` has the same bound.
WAIT_MAX = 1_000_000_000


class WaitParam(click.ParamType):
    """Seconds of --wait: a finite number from 0 to WAIT_MAX; anything else is a usage error naming it."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            seconds = float(value)
        except (TypeError, ValueError, OverflowError):
            seconds = float("nan")
        if not 0 <= seconds <= WAIT_MAX:  # also NaN
            self.fail(f"{value!r} is not a number of seconds from 0 to {WAIT_MAX}", param, ctx)
        return seconds


WAIT = WaitParam()
VERSION = VersionParam()
VERSION_OR_LATEST = VersionParam(allow_latest=True)
ENGINE = EngineParam()


def _inject(f: F, name: str, build: Callable[..., Any], *consumed: str) -> F:
    """Wrap f so that the flags in `consumed` are replaced by build(**flags) under `name`."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        flags = {key: kwargs.pop(key) for key in consumed}
        kwargs[name] = build(**flags)
        return f(*args, **kwargs)

    return wrapper


def _apply(f: F, *decorators: Callable[[F], F]) -> F:
    for decorator in reversed(decorators):
        f = decorator(f)
    return f


# --- flags that are only declared -------------------------------------------------------------

as_version_option = click.option("--as-version", type=VERSION, help="Version to assume for a tree whose version cannot be read.")

json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print exactly one JSON document on stdout (docs/json-schema.md)."
)
wait_option = click.option(
    "--wait", type=WAIT, default=0.0, show_default=True, help="Seconds to wait for another patchctl working on the same target."
)
checks_python_option = click.option(
    "--python", "python", help="Interpreter to run the patches' checks with (default: the patch's smoke env, built once)."
)
only_option = click.option("--patch", "only", multiple=True, metavar="NAME", help="Only this patch of the series (repeatable).")


# --- flags that inject an object -------------------------------------------------------------


def store_option(f: F) -> F:
    """`--store DIR` (repeatable), `PATCHCTL_STORE` (a path list) and the config's `stores:` → `store`:
    the user's stores layered over the bundled patch set, which comes last (`--no-bundled`: without
    it). Opened inside the command's error handling."""
    return _store_flags(f, "store", _layered_store)


def _layered_store(stores: tuple[str, ...], no_bundled: bool) -> Any:
    from patchctl.store.layered import Store

    return Store.layered(list(stores), bundled=not no_bundled)


def _named_stores(stores: tuple[str, ...], no_bundled: bool) -> Any:
    from patchctl.tree.stores import Stores

    # Named: the command line chose the stores, so a tree's recorded ones give way (tree.stores.decide).
    return Stores(_layered_store(stores, no_bundled), named=bool(stores) or no_bundled)


def _store_flags(f: F, name: str, build: Callable[..., Any]) -> F:
    return _apply(
        _inject(f, name, build, "stores", "no_bundled"),
        click.option(
            "--store",
            "stores",
            multiple=True,
            type=click.Path(file_okay=False),
            metavar="DIR",
            help="A patch store of yours, layered over the bundled one (repeatable; also PATCHCTL_STORE, "
            "a path list, and `stores:` in the config file).",
        ),
        click.option(
            "--no-bundled",
            is_flag=True,
            help="Leave the bundled patch set out (only with a store of yours; also PATCHCTL_BUNDLED=0).",
        ),
    )


def _set_timeout(ctx: click.Context, param: click.Parameter, value: float | None) -> None:
    """--timeout goes to the one module that talks to the network, process-wide (imported only when
    given: `ensure` on an intact target never touches the network, nor imports it). Not given, a
    module already loaded goes back to the default: the setting is this command's, not the process's
    (commands invoked in one process, as the tests and embedding code do, would inherit it)."""
    if value is None:
        loaded = sys.modules.get("patchctl.sources.http")
        if loaded is not None:
            loaded.set_timeout(None)
        return
    if not value > 0:  # also NaN
        raise click.BadParameter(f"{value!r} is not a number of seconds > 0", ctx, param)
    from patchctl.sources import http

    http.set_timeout(value)


timeout_option = click.option(
    "--timeout",
    type=float,
    default=None,
    expose_value=False,
    callback=_set_timeout,
    metavar="SECONDS",
    help="Deadline of each network request, connect to last byte [default: 60]; a larger answer's "
    "grows by the size it may carry at 256 KiB/s, fixed up front (docs/limits.md); reading an image's "
    "layers, by their size at 4 MiB/s. Lock waits are --wait's.",
)


_SIZE = re.compile(r"([0-9]{1,20})\s*(?:([KMGT])(?:iB)?)?", re.ASCII | re.IGNORECASE)


def parse_size(text: str) -> int | None:
    """A number of bytes as `1073741824`, `512M`, `512MiB`, `2G` (binary units); None if it is none."""
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        return None
    return int(m.group(1)) << (10 * ("KMGT".index(m.group(2).upper()) + 1) if m.group(2) else 0)


def _set_max_download(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """--max-download goes where --timeout goes (http.py, process-wide, undone when not given: the
    setting is this command's)."""
    if value is None:
        loaded = sys.modules.get("patchctl.sources.http")
        if loaded is not None:
            loaded.set_max_download(None)
        return
    from patchctl.sources import http

    size = parse_size(value)
    if size is None or not 0 < size <= http.MAX_SIZE:
        raise click.BadParameter(f"{value!r} is not a number of bytes > 0 (e.g. 2GiB, 800M, 1073741824)", ctx, param)
    http.set_max_download(size)


max_download_option = click.option(
    "--max-download",
    type=str,
    default=None,
    expose_value=False,
    callback=_set_max_download,
    metavar="SIZE",
    help="Most bytes any one download may carry, e.g. --max-download 2GiB [default: 1GiB, twice vLLM's largest "
    "wheel]; a file the index lists as larger is refused before it is fetched (docs/limits.md).",
)


def _fetch_flags(f: F, *, with_as_version: bool) -> F:
    consumed = ["index_url", "offline", "nightly_source", "repo", "verify"] + (["as_version"] if with_as_version else [])

    def build(
        index_url: str | None = None,
        offline: bool = False,
        nightly_source: str | None = None,
        repo: str | None = None,
        verify: bool = False,
        as_version: Version | None = None,
    ) -> Any:
        # The flags become the one type that says how to fetch (sources.fetch.SourceContext), here.
        from patchctl.cli.progress import progress_for
        from patchctl.sources.fetch import SourceContext

        return SourceContext(
            index_url=index_url,
            offline=offline,
            progress=progress_for(),
            nightly_source=nightly_source,
            repo=repo,
            version_override=as_version,
            sparse=not verify,
        )

    declared = [
        timeout_option,
        max_download_option,
        click.option("--index-url", help="Package index (default: pip's configuration, PIP_INDEX_URL)."),
        click.option("--offline", is_flag=True, help="Use only the cache; never touch the network."),
        click.option(
            "--verify",
            is_flag=True,
            help="Download the whole artifact and check its sha256 against the index, instead of range "
            "reads whose bytes are as the index served them (source.verified says which).",
        ),
        click.option("--nightly-source", help="Where ENGINE@nightly comes from (wheel index URL or git URL)."),
        click.option("--repo", help="Git repository (URL or path) for ENGINE@git:REF."),
    ] + ([as_version_option] if with_as_version else [])
    return _apply(_inject(f, "ctx", build, *consumed), *declared)


def source_options(f: F) -> F:
    """Where upstream files come from → `ctx` (a SourceContext with a progress bar for people)."""
    return _fetch_flags(f, with_as_version=True)


def fetch_options(f: F) -> F:
    """source_options without --as-version, for commands whose --as-version names their target's version."""
    return _fetch_flags(f, with_as_version=False)


def apply_options(f: F) -> F:
    """--strict, --allow-modified → `options` (the apply engine's Options)."""

    def build(strict: bool, allow_modified: bool) -> Any:
        from patchctl.patching.evaluate import Options

        return Options(strict=strict, allow_modified=allow_modified)

    return _apply(
        _inject(f, "options", build, "strict", "allow_modified"),
        click.option("--strict", is_flag=True, help="Treat fuzz as a failure."),
        click.option("--allow-modified", is_flag=True, help="Accept variant files whose sha256 differs from the series pin."),
    )


def write_options(f: F) -> F:
    """For commands that write an engine (apply, ensure): strict by default, as dpkg-source and Yocto
    are — a hunk that only applies with reduced context is refused unless --allow-fuzz. → `options`
    (the apply engine's Options, from its own module: the engine itself is not imported)."""

    def build(allow_fuzz: bool, allow_modified: bool) -> Any:
        from patchctl.patching.options import Options

        return Options(
            strict=not allow_fuzz,
            allow_modified=allow_modified,
            fuzz_refusal="apply refuses fuzz by default: review the hunks with `patchctl check`, "
            "rebase the patch, or pass --allow-fuzz",
        )

    return _apply(
        _inject(f, "options", build, "allow_fuzz", "allow_modified"),
        click.option(
            "--allow-fuzz", is_flag=True, help="Accept hunks that only apply with reduced context (refused by default)."
        ),
        click.option("--allow-modified", is_flag=True, help="Accept variant files whose sha256 differs from the series pin."),
    )


def _target_spec(**flags: Any) -> Any:
    from patchctl.tree.find import TargetSpec

    return TargetSpec(**flags)


def target_options(f: F) -> F:
    """--python / --target / --as-version → `where` (a TargetSpec)."""
    return _apply(
        _inject(f, "where", _target_spec, "python", "target_dir", "as_version"),
        click.option(
            "--python", "python", help="Interpreter whose environment holds the engine (default: the first python3 on PATH)."
        ),
        click.option(
            "--target",
            "target_dir",
            type=click.Path(file_okay=False),
            help="A source checkout or unpacked tree to patch instead of an installed engine.",
        ),
        as_version_option,
    )


def selection_options(f: F) -> F:
    """--patch NAME / --exclude NAME (repeatable) → `selection` (a tree.bookkeeping.Selection; None when
    neither is given: the tree's recorded choice, else every patch of the series)."""

    def build(patches: tuple[str, ...], exclude: tuple[str, ...]) -> Any:
        if not patches and not exclude:
            return None
        from patchctl.tree.bookkeeping import Selection

        return Selection(tuple(dict.fromkeys(patches)) or None, tuple(dict.fromkeys(exclude)))

    return _apply(
        _inject(f, "selection", build, "patches", "exclude"),
        click.option(
            "--patch",
            "patches",
            multiple=True,
            metavar="NAME",
            help="Only this patch of the series, with the patches it depends on (repeatable; recorded: "
            "`ensure` keeps the choice).",
        ),
        click.option(
            "--exclude",
            "exclude",
            multiple=True,
            metavar="NAME",
            help="Every patch of the series but this one (repeatable; recorded).",
        ),
    )


def stores_option(f: F) -> F:
    """store_option for the commands that write a tree → `stores` (a tree.stores.Stores: the store, and
    whether --store/--no-bundled named it, which decides between it and the tree's recorded stores)."""
    return _store_flags(f, "stores", _named_stores)


def writer_options(f: F) -> F:
    """Everything apply and ensure share: the target, where base files come from, the stores, which
    patches, the strict writing rules and the lock wait."""
    return _apply(f, target_options, fetch_options, stores_option, selection_options, write_options, wait_option)
