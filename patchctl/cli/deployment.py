"""The deployment file: one YAML file that says how one service runs patchctl — the engine, where it
is installed (`python` or `target`), the stores, the patches chosen, the nightly source, the wait
and validate's settings — so that a unit's lines read `patchctl ensure --deployment FILE`.

`--deployment FILE` (or `$PATCHCTL_DEPLOYMENT`) does not open a second path through the commands: the
file becomes click's `default_map` for the command that runs (cli.py), so each key fills the option
it names and an option on the command line always wins; ENGINE[@VERSION] is filled from `engine`
and `source` when the command line names none. A key a command has no option for is left out for it
(`wait` for `check`). The file is read as another user's file is: no more than LIMIT bytes, a regular
file only, through no symlink another user owns (planted, it would choose what root writes into a
tree); every problem is a usage error (exit 2) naming the file, the line and the key.
Checked against patchctl/core/schemas/deployment.json; imported only when a deployment is named.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from patchctl.core.errors import UsageError
from patchctl.core.schemas import problem, schema
from patchctl.core.yamlio import BoundsError, YAMLError, load_yaml

if TYPE_CHECKING:
    import click

ENV = "PATCHCTL_DEPLOYMENT"
LIMIT = 1 << 20  # a deployment file is a few hundred bytes

# Key → the option it fills, on every command that has that option. `python` only where the command
# also takes --target: there --python names the engine's environment (on smoke, rebase, bisect and
# matrix it is the interpreter the patches' checks run with, another thing).
FLAGS: dict[str, str] = {
    "python": "--python",
    "target": "--target",
    "stores": "--store",
    "patches": "--patch",
    "exclude": "--exclude",
    "index_url": "--index-url",
    "nightly_source": "--nightly-source",
    "wait": "--wait",
}
# Not where a key would change what the command means: `revert` of a deployment takes every recorded
# patch out (with --patch from the file it would take out only some).
_NOT_ON: dict[str, tuple[str, ...]] = {"patches": ("revert",), "exclude": ("revert",)}
# validate's keys, for `validate` alone (`url` and `start` mean validate's server there).
VALIDATE_FLAGS: dict[str, str] = {
    "url": "--url",
    "start": "--start",
    "ready_timeout": "--ready-timeout",
    "timeout": "--timeout",
    "level_timeout": "--level-timeout",
    "model": "--model",
    "concurrency": "--concurrency",
    "requests": "--requests",
    "max_tokens": "--max-tokens",
    "reasoning_budget": "--reasoning-budget",
    "prompt": "--prompt",
    "shared_prompt": "--shared-prompt",
    "golden": "--golden",
    "baseline_dir": "--baseline-dir",
    "threshold": "--threshold",
}
# validate's keys holding a path, resolved against the file's folder when relative (as target, stores
# and a python given as a path are).
_VALIDATE_PATHS = ("golden", "baseline_dir")
_BUILTIN_PROMPTS = ("counting", "essay")


class Deployment(NamedTuple):
    path: Path  # the file, absolute (a symlink resolved)
    settings: dict[str, Any]  # validated, its paths absolute

    @property
    def spec(self) -> str:
        """ENGINE[@SOURCE], what fills a command's ENGINE[@VERSION] argument."""
        source = self.settings.get("source")
        return f"{self.settings['engine']}@{source}" if source else str(self.settings["engine"])

    def defaults_for(self, command: click.Command) -> dict[str, Any]:
        """{parameter name: value} for `command`: its default_map."""
        params = list(command.params)
        opts = {opt for p in params for opt in getattr(p, "opts", ())}
        values: dict[str, Any] = {}
        for key, flag in FLAGS.items():
            if (
                key in self.settings
                and not (key == "python" and "--target" not in opts)
                and command.name not in _NOT_ON.get(key, ())
            ):
                values[flag] = self.settings[key]
        if command.name == "validate":
            checks = dict(self.settings.get("validate", {}))
            if "concurrency" in checks:  # the option's own form: 1,8,32
                checks["concurrency"] = ",".join(str(level) for level in checks["concurrency"])
            values.update({flag: checks[key] for key, flag in VALIDATE_FLAGS.items() if key in checks})
        if self.settings.get("bundled") is False:
            values["--no-bundled"] = True
        engine = str(self.settings["engine"])
        out: dict[str, Any] = {}
        for p in params:
            if p.name is None:
                continue
            several = bool(getattr(p, "multiple", False)) or p.nargs == -1
            if p.param_type_name == "argument" and p.name == "spec":  # ENGINE[@VERSION]
                out[p.name] = self.spec
            elif (p.param_type_name == "argument" and p.name in ("engine", "engines")) or "--engine" in p.opts:
                out[p.name] = (engine,) if several else engine
            else:
                found = next((o for o in p.opts if o in values), None)
                if found is not None:
                    value = values[found]
                    if isinstance(value, list):  # one value where the option takes one: the first (new's store)
                        value = tuple(value) if several else (value[0] if value else None)
                    out[p.name] = value
        return out


def load(path: str | Path) -> Deployment:
    """The deployment file at `path`, checked; UsageError (exit 2) naming the file, line and key."""
    shown = Path(path)
    absolute = Path(os.getcwd(), shown)  # not abspath: `link/..` is the link's target's parent, as the kernel reads it
    raw, real = read_bytes(absolute, shown)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"deployment file {shown} is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})"
        ) from None
    try:
        data = load_yaml(text)
    except BoundsError as exc:  # a NUL byte, .nan, nesting, a key given twice: the key's line where known
        raise UsageError(f"deployment file {shown}{_line(text, exc.path) if exc.path else ''}: {exc}") from None
    except YAMLError as exc:
        raise UsageError(f"deployment file {shown} is not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise UsageError(
            f"deployment file {shown} must hold a mapping of keys (engine, python, stores, ...), "
            f"not {'nothing' if data is None else type(data).__name__}",
            hint=_HINT,
        )
    _check(data, text, shown)
    from patchctl.core.engines import all_engines

    if data["engine"] not in all_engines():
        raise UsageError(
            f"deployment file {shown}{_line(text, ('engine',))}: engine: unknown engine "
            f"{data['engine']!r} (known: {', '.join(sorted(all_engines()))})"
        )
    return Deployment(real, _resolved(data, real.parent))  # a link's paths are its file's


_HINT = 'the keys are in docs/configuration.md, "Deployment file" (schema: patchctl/core/schemas/deployment.json)'


def _check(data: dict, text: str, shown: Path) -> None:
    """Unknown keys first (a misspelt key is the likeliest mistake, and it hides the key meant), then
    python with target, then the schema's types."""
    properties = schema("deployment")["properties"]
    for keys, known, where in (
        (list(data), properties, ()),
        (
            list(data.get("validate") or {}) if isinstance(data.get("validate"), dict) else [],
            properties["validate"]["properties"],
            ("validate",),
        ),
    ):
        for key in keys:
            if key not in known:
                name = ".".join([*where, str(key)])
                raise UsageError(
                    f"deployment file {shown}{_line(text, (*where, key))}: {name}: not a key of a "
                    f"deployment file (known{' under validate' if where else ''}: "
                    f"{', '.join(known)})",
                    hint=_HINT,
                )
    if "python" in data and "target" in data:
        raise UsageError(
            f"deployment file {shown}{_line(text, ('target',))}: python and target both name the engine's tree: keep one"
        )
    wrong = problem("deployment", data)
    if wrong is None:
        return
    if wrong.startswith("the document must contain"):
        raise UsageError(f"deployment file {shown}: engine: missing (the engine it patches, e.g. engine: sglang)", hint=_HINT)
    key = wrong.split(" must ", 1)[0]
    path = tuple(int(p) if p.isdigit() else p for p in key.replace("[", ".").replace("]", "").split("."))
    hint = 'quote a version (source: "0.5.10"): unquoted, YAML reads 0.5 as a number' if key == "source" else _HINT
    raise UsageError(f"deployment file {shown}{_line(text, path)}: {key}: {wrong[len(key) + 1 :]}", hint=hint)


def _line(text: str, path: tuple[Any, ...]) -> str:
    """' line N' of the key (or list item) at `path` in the YAML text, '' when it cannot be told. The
    node tree is composed only here, for an error, by the same safe loader's composer."""
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except YAMLError:
        return ""
    line: int | None = None
    for part in path:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == str(part)), None)
            if match is None:
                break
            line, node = match[0].start_mark.line + 1, match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return f" line {line}" if line else ""


def _resolved(data: dict, folder: Path) -> dict[str, Any]:
    """Relative paths in the file are relative to the file's folder (not to where the unit runs)."""

    def at(value: str) -> str:
        return value if os.path.isabs(value) else os.path.normpath(folder / value)

    out = dict(data)
    if "python" in out and os.sep in out["python"]:  # a bare name (python3) is looked up on PATH
        out["python"] = at(out["python"])
    if "target" in out:
        out["target"] = at(out["target"])
    if "stores" in out:
        out["stores"] = [at(s) for s in out["stores"]]
    source = out.get("source")
    if isinstance(source, str):
        if source.startswith("file:"):
            out["source"] = "file:" + at(source[len("file:") :])
        elif source.startswith(".") or (os.sep in source and ":" not in source):  # a directory
            out["source"] = at(source)
    if isinstance(out.get("validate"), dict):
        checks = dict(out["validate"])
        for key in _VALIDATE_PATHS:
            if key in checks:
                checks[key] = at(checks[key])
        if "prompt" in checks and checks["prompt"] not in _BUILTIN_PROMPTS:
            checks["prompt"] = at(checks["prompt"])
        out["validate"] = checks
    return out


def read_bytes(path: Path, shown: Path) -> tuple[bytes, Path]:
    """The file's bytes and its path (links resolved): a regular file of at most LIMIT bytes that only
    root or this user can change, reached through no symlink owned by another user (systemd runs
    ensure as root on a file a service user might have replaced or redirected), never a FIFO that
    would hang the unit's start. As sshd's StrictModes and sudo's sudoers checks do: the file is
    opened one name at a time from /, each folder and the file itself with O_NOFOLLOW, and a link on
    the way is followed only after its owner is checked; nothing can be swapped in between."""
    trusted = {0, os.geteuid()}
    fd, real = _open_checked(path, shown, trusted)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"deployment file {shown} is not a regular file")
        writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if st.st_uid not in trusted or writable:
            who = (
                "writable by everyone"
                if st.st_mode & stat.S_IWOTH
                else "writable by its group"
                if writable
                else f"owned by uid {st.st_uid}"
            )
            raise UsageError(
                f"deployment file {shown} can be changed by another user ({who}, mode "
                f"{stat.S_IMODE(st.st_mode):04o}): patchctl takes its stores and patches from no such file",
                hint=f"chown root and chmod go-w {shown}",
            )
        if st.st_size > LIMIT:
            raise UsageError(f"deployment file {shown} is {st.st_size} bytes, more than a deployment file may be ({LIMIT})")
        chunks: list[bytes] = []
        total = 0
        while chunk := os.read(fd, LIMIT + 1 - total):
            chunks.append(chunk)
            total += len(chunk)
            if total > LIMIT:
                raise UsageError(f"deployment file {shown} grew past {LIMIT} bytes while being read")
        return b"".join(chunks), real
    finally:
        os.close(fd)


_MAX_LINKS = 40  # as the kernel's path walk (ELOOP)
_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_FILE = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def _open_checked(path: Path, shown: Path, trusted: set[int]) -> tuple[int, Path]:
    """The file at absolute `path` opened for reading, and its real path. UsageError for a missing
    name, and for a link on the way (a folder's or the file's) that a user outside `trusted` owns."""
    parts = [p for p in path.parts[1:] if p not in ("", ".")]
    real: list[str] = []
    links = 0
    fd = os.open("/", _DIR)
    try:
        while parts:
            name = parts.pop(0)
            last = not parts
            if name == "..":
                fd = _step(fd, os.open("..", _DIR, dir_fd=fd))
                real = real[:-1]
                continue
            try:
                opened = os.open(name, _FILE if last else _DIR, dir_fd=fd)
            except FileNotFoundError:
                raise UsageError(
                    f"deployment file {shown} does not exist"
                    + ("" if last else f" ({os.path.join('/', *real, name)} is missing)"),
                    hint=f"name an existing file with --deployment or ${ENV}",
                ) from None
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise UsageError(f"deployment file {shown} cannot be read: {exc.strerror}") from None
                where = os.path.join("/", *real, name)
                link = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(link.st_mode):
                    raise UsageError(f"deployment file {shown} cannot be read: {where} is not a directory") from None
                if link.st_uid not in trusted:
                    raise UsageError(
                        f"deployment file {shown}: {where} is a symlink owned by uid {link.st_uid}, "
                        f"neither root nor this user: patchctl follows no link another user planted",
                        hint="point --deployment at the file itself, or have root own the link",
                    ) from None
                links += 1
                if links > _MAX_LINKS:
                    raise UsageError(f"deployment file {shown}: more than {_MAX_LINKS} symlinks on its path") from None
                target = os.readlink(name, dir_fd=fd)
                if target.startswith("/"):
                    fd, real = _step(fd, os.open("/", _DIR)), []
                parts[:0] = [p for p in target.split("/") if p not in ("", ".")]
                continue
            if last:
                os.close(fd)
                return opened, Path("/", *real, name)
            fd = _step(fd, opened)
            real.append(name)
        raise UsageError(f"deployment file {shown} is a directory")
    except BaseException:
        os.close(fd)
        raise


def _step(old: int, new: int) -> int:
    os.close(old)
    return new
