"""`patchctl apply`: the series onto an installed engine or a directory, all or nothing."""
from __future__ import annotations

from typing import TYPE_CHECKING

import click

from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.commands.text import moved_warnings, print_outcomes
from patchctl.cli.documents import document, series_json
from patchctl.cli.image_options import ImageOptions, image_options
from patchctl.cli.options import writer_options
from patchctl.core import outcomes as O
from patchctl.core.errors import EXIT_OK, EXIT_PATCH_FAILED
from patchctl.sources.spec import parse_spec

if TYPE_CHECKING:
    from patchctl.cli.commands.text import Console
    from patchctl.cli.options import WriteRules as Options
    from patchctl.sources.fetch import SourceContext
    from patchctl.store.series import Store
    from patchctl.tree.find import TargetSpec
    from patchctl.tree.journal import BuildRecord, PatchRecord, Selection
    from patchctl.tree.operations import Target


def run(spec: str, store: Store, ctx: SourceContext, options: Options, where: TargetSpec, *,
        install: bool = False, keep_going: bool = False, dry_run: bool = False, wait: float = 0.0,
        force: bool = False, name: str = "apply", no_deps: bool = False,
        selection: Selection | None = None) -> tuple[dict, int]:
    """`name` is the document's command: ensure runs this, stopping early on an intact target."""
    from patchctl.core.engines import get_engine
    from patchctl.sources import installed as inst
    from patchctl.tree import find
    from patchctl.tree.operations import Target

    ref = parse_spec(spec)
    if no_deps and not install:
        from patchctl.core.errors import UsageError

        raise UsageError("--no-deps only means something with --install")
    target = find.find_target(ref, where, install=install, ctx=ctx, no_deps=no_deps)
    python = find.env_python(where)

    def apply_one(tree: Target) -> dict:
        return _apply_one(tree, store=store, ctx=ctx, options=options, keep_going=keep_going, dry_run=dry_run,
                          wait=wait, force=force, name=name, python=python, selection=selection)

    docs = [apply_one(target)]
    warnings = moved_warnings(target.engine, target.version)
    # Code that moved to another distribution (vLLM's GGUF support → vllm-gguf-plugin) is patched
    # there, when that distribution is installed in the same environment.
    if python is not None:
        for move in target.engine.moves_at(target.version):
            other = inst.find_installed(get_engine(move.engine), where.python)
            if other is None:
                warnings.append(f"{move.engine} is not installed, so its patches were not applied")
                continue
            docs.append(apply_one(Target(other.engine, other.root, other.version, f"installed in {other.python}")))
    first = docs[0]
    code = max(d["exit_code"] for d in docs)
    first["also"] = docs[1:]
    first["exit_code"], first["ok"] = code, code == EXIT_OK
    first["warnings"] = warnings + [w for d in docs for w in d["warnings"]]
    if not first.get("error"):
        # Which build was patched: what --install installed (its URL, commit), or what the tree says.
        first["build"] = target.build._asdict() if target.build else None
        if install:
            first["note"] = "; ".join(filter(None, [f"installed {_build_line(target.build)}", first.get("note")]))
    return first, code


def _build_line(build: BuildRecord | None) -> str:
    if build is None:
        return "?"
    commit = f", commit {build.commit}" if build.commit else ""
    via = f" with {build.installer}" if build.installer else ""
    return f"{build.version}{commit} ({build.artifact or build.url or build.kind}){via}"


def _apply_one(target: Target, *, store: Store, ctx: SourceContext, options: Options, keep_going: bool,
               dry_run: bool, wait: float, force: bool, name: str, python: str | None,
               selection: Selection | None = None) -> dict:
    from patchctl.sources.fetch import base_files_for
    from patchctl.tree import operations as tgt
    from patchctl.tree.find import requirement_warnings

    ensure = name == "ensure"
    fields = dict(engine=target.engine.name, version=str(target.version), target=str(target.root),
                  source={"kind": "target", "description": target.how})
    if ensure:
        store = recorded_store(target, store)
    # What the store says for this engine, hashed without parsing it: ensure stops at "intact, and
    # applied from this very series" before reading any YAML.
    fingerprint = store_fingerprint(store, target.engine.name)
    try:
        rep = tgt.apply(target, lambda: store.series(target.engine.name).patches, options=options,
                        base_files=base_files_for(target.engine, ctx), keep_going=keep_going, dry_run=dry_run,
                        wait=wait, force=force, fingerprint=fingerprint, ensure=ensure, selection=selection,
                        stores=store_refs(store))
    except tgt.ConflictError as exc:
        return document(name, EXIT_PATCH_FAILED, patches=series_json(exc.result), written=[],
                        error={"kind": exc.kind, "message": exc.message, "hint": exc.hint}, **fields)
    except tgt.Drifted as exc:
        return document(name, EXIT_PATCH_FAILED, state=exc.status.state, written=[],
                        error={"kind": exc.kind, "message": exc.message, "hint": exc.hint}, **fields)
    if rep.result is None:  # ensure: intact, nothing evaluated
        assert rep.record is not None  # operations.apply evaluates nothing only on a record it loaded
        if rep.unlocked is not None:
            fields["warnings"] = [f"read without the lock: {target.state().dir} cannot be written ({rep.unlocked}); "
                                  f"the patches are intact, nothing was written"]
        return document(name, EXIT_OK, patches=[_recorded(p) for p in rep.record.patches], written=[],
                        note=rep.note, state_before=rep.state_before, **fields)
    patches = store.series(target.engine.name).patches
    if rep.record is not None and not rep.record.selection.everything:
        fields["selection"] = rep.record.selection.to_json()
    # Companion packages (gguf>=0.18, ...) can only be checked in an environment, not in a bare tree.
    fields["warnings"] = requirement_warnings([p for p in patches if p.in_range(target.version)], python)
    fields["state_before"] = rep.state_before
    failed = any(o.outcome == O.CONFLICT for o in rep.result.outcomes)
    code = EXIT_PATCH_FAILED if failed else EXIT_OK
    notes = [rep.note] if rep.note else []
    if rep.recovered:
        notes.append("recovered an interrupted earlier run first")
    if rep.written:
        notes.append(f"wrote {len(rep.written)} file(s)")
    return document(name, code, patches=series_json(rep.result), written=list(rep.written),
                    note="; ".join(notes) or None, **fields)


def _recorded(p: PatchRecord) -> dict:
    return {"name": p.name, "outcome": O.ALREADY_APPLIED if p.outcome in O.WRITES else p.outcome,
            "variant": p.variant, "reason": "recorded as applied, and every file it wrote is intact",
            "files": [], "hunks": []}


def recorded_store(target: Target, store: Store) -> Store:
    """ensure's store: the stores the tree's record names (with any this command names in front), so
    that a patch captured into a store of the user's is re-applied with no --store. A recorded store
    that is gone is exit 3 naming it and the patches recorded from it."""
    from patchctl.core.errors import RecordUnmet
    from patchctl.store.series import recorded_layers

    record = target.state().load()
    if record is None or not record.stores:
        return store  # nothing applied, or a record older than patchctl-state/3: the stores named here
    layered, gone = recorded_layers(store, [(s.path, s.kind) for s in record.stores])
    if gone:
        path, kind = gone[0]
        names = [p.name for p in record.patches if p.store is not None and p.store.path == path] or ["(none listed)"]
        raise RecordUnmet(
            f"the {kind} store {path} is gone: the record of {target.root} lists {', '.join(names)} as applied "
            f"from it; ensure does not start the engine without them",
            hint=f"restore {path}, or change the set explicitly: `patchctl apply {target.engine.name}` with the "
                 f"stores you have (--store DIR, --exclude NAME)")
    return layered


def store_refs(store: Store) -> tuple:
    """The store's layers as a record names them (path, bundled/user), highest priority first."""
    from patchctl.store.series import store_kind
    from patchctl.tree.journal import StoreRef

    return tuple(StoreRef(str(layer), store_kind(layer)) for layer in (store.layers or (store.root,)))


def store_fingerprint(store: Store, engine: str) -> str:
    """sha256 over the engine's series.yaml and every patch folder's patch.yaml and variant files, in
    every store layer: what ensure compares with the record instead of parsing YAML."""
    import hashlib

    digest = hashlib.sha256()
    for layer in store.layers or (store.root,):
        folder = layer / engine
        digest.update(str(layer).encode() + b"\0")
        for path in sorted([folder / "series.yaml", *folder.glob("*/patch.yaml"), *folder.glob("*/*.patch")]):
            if path.is_file():
                digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def render(doc: dict, out: Console, err: Console) -> None:
    for d in [doc, *doc.get("also", [])]:
        print_outcomes(out, d)


@patchctl_command("apply", render=render, example=(
    "patchctl apply vllm                      the vLLM installed for python3",
    "patchctl apply vllm --python ~/venvs/serve/bin/python --dry-run",
    "patchctl apply sglang@0.5.9 --target ./site-packages",
    "patchctl apply vllm@0.23.0 --install     pip-install 0.23.0 first, then patch it",
    "patchctl apply vllm@nightly --install    install the nightly check resolves (by its wheel's URL), then patch it",
    "patchctl apply sglang --image reg.example/sglang:0.5.9 --to reg.example/sglang:0.5.9-patched",
))
@click.argument("spec", metavar="ENGINE[@VERSION]")
@writer_options
@click.option("--install", is_flag=True,
              help="Install exactly the named build first (a nightly by its wheel's URL, git:REF by its commit; "
                   "uv when on PATH, else pip), then patch it.")
@click.option("--no-deps", is_flag=True, help="With --install: install the engine only, not its dependencies.")
@click.option("--keep-going", is_flag=True, help="Apply the patches that apply even if others conflict.")
@click.option("--dry-run", is_flag=True, help="Report what would happen; write nothing.")
@click.option("--force", is_flag=True, help="Apply even if patched files were changed by hand since.")
@image_options(writes=True)
def command(spec: str, where: TargetSpec, ctx: SourceContext, store: Store, options: Options, wait: float,
            install: bool, no_deps: bool, keep_going: bool, dry_run: bool, force: bool,
            selection: Selection | None, image: ImageOptions | None) -> tuple[dict, int]:
    """Apply the series to the installed engine (or --target DIR, or --image REF --to REF2), all or nothing.

    --patch/--exclude choose the patches; the choice is recorded in the tree, and `ensure` keeps it.
    A smaller choice than is applied takes the others out.
    """
    if image:
        from patchctl.cli import image_command

        return image_command.apply(run, spec, image, store, ctx, options, keep_going=keep_going, dry_run=dry_run,
                                   force=force, wait=wait, selection=selection)
    return run(spec, store, ctx, options, where, install=install, keep_going=keep_going, dry_run=dry_run,
               wait=wait, force=force, no_deps=no_deps, selection=selection)
