"""Turning edited files into a variant and a patch of a store (patch-package's and quilt's loop): a
`git format-patch` mail made with a fixed identity and date (so the same edit always gives the same
bytes), checked to turn the base files into the edited ones exactly, written into a user's store
with its patch.yaml, its place in series.yaml and its sha256 pin.

The bundled store is read-only here: `new` and `refresh` write into the store named with --store
(or $PATCHCTL_STORE), and into the bundled patch set only when --store names it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from packaging.version import Version

from patchctl.core import gitutil
from patchctl.core.atomic import write_atomic
from patchctl.core.errors import StoreError, UsageError
from patchctl.core.yamlio import dump_yaml

if TYPE_CHECKING:
    from patchctl.store.series import Patch

# Placeholders `new` writes when no --title / --why is given; `patchctl lint` reports them unfinished.
PLACEHOLDER = "TODO:"
TITLE_PLACEHOLDER = "TODO: say in one line what this patch fixes"
WHY_PLACEHOLDER = "TODO: what breaks without this patch, and for whom"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")  # schemas/series.json's patch_name

# path -> (bytes before, bytes after); None: the file is absent.
FileEdits = Mapping[str, tuple[bytes | None, bytes | None]]


def is_placeholder(text: str | None) -> bool:
    return bool(text) and str(text).strip().startswith(PLACEHOLDER)


# --- which store ---------------------------------------------------------------------------------


def writable_store(explicit: str | None) -> Path:
    """The store `new` and `refresh` write into: --store DIR, else $PATCHCTL_STORE. The bundled patch
    set is only written when --store names it: a user's patch does not belong in the package."""
    from patchctl.core.bundled import bundled_store

    bundled = bundled_store()
    if explicit:
        return Path(explicit)
    env = os.environ.get("PATCHCTL_STORE")
    hint = "pass --store DIR (a folder of your own; it is created) or set PATCHCTL_STORE" + (
        f"; to add to the bundled patch set itself, name it: --store {bundled}" if bundled else ""
    )
    if not env:
        raise UsageError("name the store to write the patch into", hint=hint)
    if bundled is not None and _same(Path(env), bundled):
        raise UsageError(f"PATCHCTL_STORE names the bundled patch set ({bundled}), which is read-only here", hint=hint)
    return Path(env)


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


# --- the variant ---------------------------------------------------------------------------------


def message(title: str, why: str) -> str:
    """The commit message: the title as subject, why as body (what `git format-patch` mails carry)."""
    title = " ".join(title.split())
    return title + ("\n\n" + why.strip() if why and why.strip() else "")


def build_variant(files: FileEdits, title: str, why: str) -> bytes:
    """A `git format-patch` mail turning each file's before into its after: the before files committed
    to a scratch repository, the after files committed on top with the title as subject and why as
    body, exported with patchctl's fixed identity and date (byte-identical for the same input)."""
    _refuse_binary(files)
    with _scratch_repo(files) as repo:
        gitutil.commit_all(repo, message(title, why))
        return gitutil.format_patch(repo)


def unified_diff(files: FileEdits) -> str:
    """The same change as a plain `git diff` (for `patchctl diff`): `git apply` / `patch -p1` in the
    import root take it."""
    _refuse_binary(files)
    with _scratch_repo(files) as repo:
        gitutil.git(repo, "add", "-A")
        return gitutil.git(repo, "diff", "--cached", "--no-color", "--no-ext-diff").stdout


class _scratch_repo:
    """A scratch repository holding the before files as its first commit and the after files in the
    work tree; removed on the way out."""

    def __init__(self, files: FileEdits):
        self.files = files
        self.dir = Path(tempfile.mkdtemp(prefix="patchctl-capture-"))

    def __enter__(self) -> Path:
        repo = self.dir / "repo"
        gitutil.init(repo)
        gitutil.git(repo, "config", "diff.renames", "false")  # patchctl's parser takes no renames
        _write(repo, {p: before for p, (before, _) in self.files.items()})
        gitutil.commit_all(repo, "pristine")
        _write(repo, {p: after for p, (_, after) in self.files.items()})
        return repo

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _write(repo: Path, files: Mapping[str, bytes | None]) -> None:
    for rel, data in files.items():
        path = repo / rel
        if data is None:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)


def _not_text(data: bytes | None) -> str | None:
    if data is None:
        return None
    if b"\0" in data:
        return "binary"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8 text"
    return None


def text_only(files: FileEdits, named: Collection[str] = ()) -> tuple[dict[str, tuple[bytes | None, bytes | None]], list[str]]:
    """The files a text diff can carry, and warnings for those left out (binary, not UTF-8). A file
    named with --file is kept: build_variant refuses it with the reason."""
    kept, warnings = {}, []
    for path, pair in files.items():
        why = next((w for w in map(_not_text, pair) if w), None)
        if why and path not in named:
            warnings.append(f"{path} is {why}: left out (patchctl's variants are text diffs)")
        else:
            kept[path] = pair
    return kept, warnings


def _refuse_binary(files: FileEdits) -> None:
    for path, pair in files.items():
        why = next((w for w in map(_not_text, pair) if w), None)
        if why:
            raise UsageError(
                f"{path} is {why}: patchctl's variants are text diffs", hint="leave it out (name the other files with --file)"
            )


def verify(data: bytes, files: FileEdits, where: str) -> None:
    """The variant, parsed as every command parses it, turns each before into its after exactly and
    with every hunk clean (no offset, no fuzz): what `check` will find on the release."""
    from patchctl.patching.hunks import apply_hunks, parse_variant

    parsed = parse_variant(data, where)
    if set(parsed.paths) != {p for p, (before, after) in files.items() if before != after}:
        raise StoreError(f"{where}: the variant touches {sorted(parsed.paths)}, not the edited files")
    for fp in parsed.files:
        before, after = files[fp.path]
        text = None if before is None else before.decode("utf-8", errors="surrogateescape")
        result = apply_hunks(text, fp, max_fuzz=0)
        got = None if result.text is None else result.text.encode("utf-8", errors="surrogateescape")
        if not result.ok or got != after or any(h.status != "clean" for h in result.hunks):
            raise StoreError(
                f"{where}: the variant does not reproduce {fp.path} exactly ({result.problem or 'hunks moved'})",
                hint="a file with form feeds or other unusual line breaks? leave it out with --file",
            )


# --- writing into a store ----------------------------------------------------------------------------


class Written(NamedTuple):
    patch_dir: Path
    variant: Path
    sha256: str


def check_new_name(store_root: Path, engine: str, name: str) -> None:
    """Refuse a name the series already has (or a folder already there), before anything is read."""
    from patchctl.store.layered import Store

    if not NAME_RE.match(name):
        raise UsageError(f"patch name {name!r}: use letters, digits and . _ + - (starting with a letter or digit)")
    if store_root.is_dir() and (store_root / engine / "series.yaml").is_file():
        series = Store(store_root).series(engine)
        if any(p.name == name for p in series.patches):
            raise UsageError(
                f"{engine}/series.yaml in {store_root} already has a patch {name!r}",
                hint=f"pick another name, or `patchctl refresh {engine} {name}` to update it from the tree",
            )
    folder = store_root / engine / name
    if folder.exists():
        raise UsageError(f"{folder} already exists (not in the series)", hint="pick another name, or remove the folder")


def write_new_patch(store_root: Path, engine: str, name: str, version: Version, data: bytes, *, title: str, why: str) -> Written:
    """<store>/<engine>/<name>/patch.yaml and <version>.patch, appended to <engine>/series.yaml
    (created when missing) with the variant's sha256 pinned. series.yaml is written last: a crash
    before it leaves a folder `lint` names, never a series entry without its files."""
    check_new_name(store_root, engine, name)
    folder = store_root / engine / name
    series_file = store_root / engine / "series.yaml"
    from patchctl.store.reading import load_store_yaml  # a damaged series.yaml: StoreError naming it

    series = load_store_yaml(series_file) if series_file.is_file() else None
    if series is None:
        series = {"engine": engine, "patches": []}
    meta = {
        "title": " ".join(title.split()),
        "why": why.strip(),
        "upstream": [],
        "applies_to": f">={version}",
        "drop_when": "upstreamed",
    }
    variant = folder / f"{version}.patch"
    digest = hashlib.sha256(data).hexdigest()
    write_atomic(variant, data)
    write_atomic(folder / "patch.yaml", dump_yaml(meta, sort_keys=False, allow_unicode=True).encode())
    series["patches"] = list(series.get("patches") or []) + [{"name": name, "variants": {variant.name: digest}}]
    write_atomic(series_file, dump_yaml(series, sort_keys=False, allow_unicode=True).encode())
    return Written(folder, variant, digest)


def write_refreshed(store_root: Path, patch: Patch, version: Version, data: bytes) -> Written:
    """<version>.patch of an existing patch, replaced or added, and pinned in series.yaml."""
    from patchctl.store.layered import Store, write_variant

    filename = f"{version}.patch"
    write_variant(Store(store_root), patch, filename, data)
    return Written(patch.directory, patch.directory / filename, hashlib.sha256(data).hexdigest())


__all__ = [
    "NAME_RE",
    "PLACEHOLDER",
    "TITLE_PLACEHOLDER",
    "WHY_PLACEHOLDER",
    "Written",
    "build_variant",
    "check_new_name",
    "is_placeholder",
    "message",
    "text_only",
    "unified_diff",
    "verify",
    "writable_store",
    "write_new_patch",
    "write_refreshed",
]
