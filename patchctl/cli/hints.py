"""Hints that run as printed: the one place a hint's `patchctl ...` command line is completed.

Hints are written where the problem is found (tree/, sources/, the commands), which do not know how
the user located the target. A hint copied without the user's `--python`, `--target`, `--store` or
`--deployment` patches another environment, or is a usage error (issue 36). So before a document is
rendered, every backticked `patchctl COMMAND ...` in its messages gets the locating options the user
gave on this command line, each only where COMMAND has that option and the hint does not already name
it; values are shell-quoted, so a path with spaces still runs.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable
from typing import Any

import click

# The documents' keys whose text is the patch set's or a file's own (a diff, a model's reply): never rewritten.
_VERBATIM = {"diff", "text", "reply", "content", "context", "hunks"}
_COMMAND = re.compile(r"`(patchctl [^`\n]+)`")
# `--python` of smoke, rebase and bisect names the interpreter the checks run with, not the target.
_LOCATORS = ("--python", "--target", "--store", "--no-bundled")


def locating_args(ctx: click.Context | None) -> list[tuple[str, str | None]]:
    """(flag, value) of the options that located this command's target, as the user typed them (a
    value from a deployment file or the environment is found again by the hint's own run)."""
    if ctx is None or ctx.command is None:
        return []
    found: list[tuple[str, str | None]] = []
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name is None:
            continue
        flag = next((o for o in param.opts if o in _LOCATORS), None)
        if flag is None or not _locates(param):
            continue
        if ctx.get_parameter_source(param.name) is not click.core.ParameterSource.COMMANDLINE:
            continue
        value = ctx.params.get(param.name)
        if param.is_flag:
            if value:
                found.append((flag, None))
        elif isinstance(value, (tuple, list)):
            found += [(flag, str(v)) for v in value]
        elif value is not None:
            found.append((flag, str(value)))
    deployment = ctx.meta.get("patchctl.cli.deployment")  # cli.main.DEPLOYMENT_KEY
    if deployment and deployment != os.environ.get("PATCHCTL_DEPLOYMENT"):
        found.append(("--deployment", str(deployment)))
    return found


def _locates(param: click.Option) -> bool:
    from patchctl.cli.options import checks_python_option

    if "--python" not in param.opts:
        return True
    probe = checks_python_option(lambda: None).__click_params__[0]  # type: ignore[attr-defined]
    return param.help != probe.help


# The locating flags each command takes (--deployment: every command). A table, not a look-up of the
# click command: that would import the command's module, and `ensure` on an intact tree must stay off
# `check` and the apply engine (tests/test_startup_imports.py). test_hints checks it against the commands.
_STORE = ("--store", "--no-bundled")
_WHERE = ("--python", "--target")
LOCATING: dict[str, frozenset[str]] = {
    name: frozenset(flags)
    for name, flags in {
        "apply": _WHERE + _STORE,
        "ensure": _WHERE + _STORE,
        "revert": _WHERE + _STORE,
        "status": _WHERE,
        "validate": _WHERE,
        "diff": _WHERE,
        "new": _WHERE + ("--store",),
        "refresh": _WHERE + ("--store",),
        **{
            name: _STORE
            for name in ("check", "smoke", "export", "list", "show", "lint", "pin", "rebase", "resolve", "bisect", "droppable")
        },
        "matrix diff": (),
        "matrix merge": (),
    }.items()
}


def _locating_flags(words: list[str]) -> frozenset[str] | None:
    """The locating flags of the command a hint names (with --deployment); None for no such command."""
    for name in (" ".join(words[:2]), " ".join(words[:1])):
        if name in LOCATING:
            return LOCATING[name] | {"--deployment"}
    return None


def complete_command(hint: str, given: Iterable[tuple[str, str | None]]) -> str:
    """One backticked command line with the locating options added that it lacks and accepts."""
    try:
        words = shlex.split(hint)[1:]
    except ValueError:
        return hint
    locating = _locating_flags(words)
    if locating is None:
        return hint
    named = {w.split("=", 1)[0] for w in words if w.startswith("--")}
    add: list[str] = []
    where_named = bool(named & {"--python", "--target"})
    for flag, value in given:
        if flag not in locating or flag in named:
            continue
        if flag in ("--python", "--target") and where_named:
            continue  # the hint names its own target (a journal's --target ROOT)
        add += [flag] if value is None else [flag, value]
    # `new` writes into a store it must be told: the hint says so when nothing names one.
    if words[:1] == ["new"] and "--store" not in named and "--store" not in add and not os.environ.get("PATCHCTL_STORE"):
        add += ["--store", "DIR"]
    if not add:
        return hint
    return hint + " " + " ".join(shlex.quote(w) for w in add)


def complete(doc: Any, ctx: click.Context | None) -> Any:
    """The document with every backticked `patchctl ...` in its text completed (in place, and returned)."""
    if ctx is None:
        return doc
    given = locating_args(ctx)

    def fix(text: str) -> str:
        return _COMMAND.sub(lambda m: "`" + complete_command(m.group(1), given) + "`", text)

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return fix(value) if "`patchctl " in value else value
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, dict):
            return {k: (v if k in _VERBATIM else walk(v)) for k, v in value.items()}
        return value

    if isinstance(doc, dict):
        for key in list(doc):
            if key not in _VERBATIM:
                doc[key] = walk(doc[key])
    return doc
