"""`patchctl refresh`: rewrite a patch's variant for the installed version from the edited tree (quilt's
refresh): the files its chosen variant touches, plus --file extras, diffed against the pristine
release → `<installed version>.patch`, pinned. The loop is edit → refresh → check → commit."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import click

from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.documents import document
from patchctl.cli.options import ENGINE, fetch_options, target_options, wait_option
from patchctl.core.errors import EXIT_OK, UsageError
from patchctl.sources.spec import parse_spec

if TYPE_CHECKING:
    from packaging.version import Version

    from patchctl.cli.commands.text import Console
    from patchctl.patching.hunks import ParsedVariant
    from patchctl.sources.fetch import SourceContext
    from patchctl.sources.release import ReleaseSource
    from patchctl.store.series import Patch, Series
    from patchctl.tree.find import TargetSpec
    from patchctl.tree.target import Target

REFRESHED, ADDED, UNCHANGED = "refreshed", "added", "unchanged"


def run(
    engine: str,
    name: str,
    where: TargetSpec,
    store_dir: str | None,
    ctx: SourceContext,
    *,
    files: tuple[str, ...] = (),
    wait: float = 0.0,
) -> tuple[dict, int]:
    from patchctl.patching import capture
    from patchctl.patching.evaluate import load_variant
    from patchctl.sources import fetch
    from patchctl.store.layered import Store
    from patchctl.store.series import choose_variant
    from patchctl.tree import edits as ed
    from patchctl.tree.bookkeeping import sha256
    from patchctl.tree.find import find_target
    from patchctl.tree.target import check_paths

    store_root = capture.writable_store(store_dir)
    store = Store.open(store_root)
    series = store.series(engine)
    patch = series.get(name)
    target = find_target(parse_spec(engine), where)
    version = target.version
    choice = choose_variant(patch, version)
    if choice.variant is None:
        raise UsageError(f"{engine}/{name}: {choice.reason}", hint=f"widen applies_to in {patch.directory / 'patch.yaml'} first")
    old = load_variant(choice.variant, allow_modified=True)
    extras = [ed.inside_engine(target, f) for f in files]
    paths = list(dict.fromkeys([*old.paths, *extras]))
    check_paths(target, paths)  # the variant is the store's: it may name a .pth or another package
    release = fetch.release(target.engine, version, ctx)
    pristine = ed.release_bytes(target, release, paths)
    base = _base_files(target, series, patch, version, release, paths, pristine)
    now = {p: ed.current_bytes(target, p) for p in paths}
    changed = {p: (base[p], now[p]) for p in paths if base[p] != now[p]}
    warnings = [f"{p} does not differ from {engine} {version}: left out" for p in extras if p not in changed]
    if not changed:
        raise UsageError(
            f"the tree holds none of {name}'s changes: {', '.join(old.paths)} are {engine} {version}'s own",
            hint=f"apply it first (`patchctl apply {engine} --store {store_root}`) or edit the files; "
            f"--file PATH adds another file",
        )
    dropped = [p for p in old.paths if p not in changed]
    if dropped:
        warnings.append(f"{', '.join(dropped)} no longer differ(s) from the release: left out of the variant")

    data = capture.build_variant(changed, patch.title, patch.why)
    filename = f"{version}.patch"
    capture.verify(data, changed, f"{engine}/{name}/{filename}")
    if choice.variant.base == version:
        outcome = UNCHANGED if data == choice.variant.read_bytes() else REFRESHED
    else:
        # An older base whose variant still gives exactly these files stays the one variant: the store
        # holds as few variants as the code's history needs (docs/patch-format.md).
        same = (
            not dropped
            and set(changed) == set(old.paths)
            and old.subject == " ".join(patch.title.split())
            and _gives(old, changed)
        )
        outcome = UNCHANGED if same else ADDED
    stale_pin = choice.variant.pinned_sha256 != choice.variant.actual_sha256()
    if outcome != UNCHANGED or (stale_pin and choice.variant.base == version):
        capture.write_refreshed(store_root, patch, version, data)
    variant = filename if outcome != UNCHANGED else choice.variant.filename
    for path in unmanaged_besides(target, paths):
        warnings.append(f"{path} also differs from the release and belongs to no patch: `--file {path}` takes it into {name}")
    refused = ed.adopt(
        target,
        name,
        variant,
        {p: (pristine[p], now[p]) for p in paths},
        wait=wait,
        store=store_root,
        variant_sha256=hashlib.sha256(data).hexdigest() if outcome != UNCHANGED else choice.variant.actual_sha256(),
    )
    if refused:
        warnings.append(refused)
    where_to = patch.directory / variant
    message = {
        REFRESHED: f"rewrote {where_to} from the tree ({len(changed)} file(s)) and pinned it",
        ADDED: f"wrote {where_to} for {version} (the variant had base {choice.variant.base}) and pinned it",
        UNCHANGED: f"{where_to} already gives these files on {version}: nothing to write",
    }[outcome] + f"; next: `patchctl check {engine}@{version} --store {store_root}`"
    return document(
        "refresh",
        EXIT_OK,
        engine=target.engine.name,
        version=str(version),
        target=str(target.root),
        store=str(store_root),
        patch=name,
        outcome=outcome,
        variant=variant,
        previous_variant=choice.variant.filename,
        sha256=sha256(where_to.read_bytes()),
        files=sorted(changed),
        dropped=dropped,
        recorded=refused is None,
        message=message,
        warnings=warnings,
    ), EXIT_OK


def _base_files(
    target: Target,
    series: Series,
    patch: Patch,
    version: Version,
    release: ReleaseSource,
    paths: list[str],
    pristine: dict[str, bytes | None],
) -> dict[str, bytes | None]:
    """What the patch's change is the difference from: the release's files with the applied patches
    that come before it in the series (the tree's record says which). A later applied patch touching
    the same file is refused: only the topmost patch of a file can be refreshed (quilt's rule)."""
    from patchctl.patching.evaluate import Options, evaluate, load_variant
    from patchctl.store.series import choose_variant

    record = target.state().load()
    if record is None or record.version != str(version):
        return dict(pristine)
    applied = {p.name for p in record.patches}
    names = [p.name for p in series.patches]
    earlier = []
    for other in series.patches:
        if other.name == patch.name or other.name not in applied:
            continue
        choice = choose_variant(other, version)
        if choice.variant is None:
            continue
        shared = sorted(set(load_variant(choice.variant, allow_modified=True).paths) & set(paths))
        if not shared:
            continue
        if names.index(other.name) > names.index(patch.name):
            raise UsageError(
                f"{', '.join(shared)} is also changed by {other.name}, which comes after {patch.name} "
                f"in the series: refresh cannot tell their changes apart",
                hint=f"revert, apply the series up to {patch.name}, edit and refresh, then apply the rest",
            )
        earlier.append(other)
    base = dict(pristine)
    if earlier:
        result = evaluate(tuple(earlier), version, release, options=Options(allow_modified=True))
        base.update({c.path: c.after for c in result.changes if c.path in base})
    return base


def _gives(parsed: ParsedVariant, changed: dict[str, tuple[bytes | None, bytes | None]]) -> bool:
    """The parsed variant turns each base into the edited bytes exactly (clean or at an offset)."""
    from patchctl.patching.hunks import apply_hunks

    for fp in parsed.files:
        before, after = changed[fp.path]
        text = None if before is None else before.decode("utf-8", errors="surrogateescape")
        result = apply_hunks(text, fp, max_fuzz=0)
        got = None if result.text is None else result.text.encode("utf-8", errors="surrogateescape")
        if not result.ok or got != after:
            return False
    return True


def unmanaged_besides(target: Target, paths: list[str]) -> list[str]:
    from patchctl.tree.edits import unmanaged

    try:
        return [p for p in unmanaged(target) if p not in paths]
    except OSError:
        return []


def render(doc: dict, out: Console, err: Console) -> None:
    for path in doc.get("files", []):
        out.print(f"  {doc['outcome']:<9} {path}", markup=False, highlight=False)


@patchctl_command(
    "refresh",
    render=render,
    example=(
        "patchctl refresh vllm glm5-rope-fix --store ~/patches     after editing the installed files again",
        "patchctl refresh sglang my-fix --target ./site-packages --store ./patches --file sglang/srt/utils.py",
        "patchctl refresh vllm my-fix --store ~/patches && patchctl check vllm@0.23.0 --store ~/patches",
    ),
)
@click.argument("engine", type=ENGINE, metavar="ENGINE")
@click.argument("name", metavar="PATCH")
@target_options
@click.option(
    "--store",
    "store_dir",
    type=click.Path(file_okay=False),
    help="Store holding PATCH (default: $PATCHCTL_STORE). The bundled patch set is written only when named here.",
)
@click.option(
    "--file",
    "files",
    multiple=True,
    metavar="PATH",
    help="Also take this file into the patch (relative to the import root, or a path into the tree; repeatable).",
)
@wait_option
@fetch_options
def command(
    engine: str, name: str, where: TargetSpec, store_dir: str | None, files: tuple[str, ...], wait: float, ctx: SourceContext
) -> tuple[dict, int]:
    """Rewrite PATCH's variant for the installed ENGINE version from the edited tree.

    The files the chosen variant touches (and --file extras) are diffed against the pristine release
    (with the applied patches that come before PATCH in the series) into <installed version>.patch,
    pinned in series.yaml: the same file when the variant's base is the installed version, a new one
    when it is older (unless the old one still gives these files). The loop: edit, refresh, check,
    commit.
    """
    return run(engine, name, where, store_dir, ctx, files=files, wait=wait)
