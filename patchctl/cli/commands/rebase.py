"""`patchctl rebase`: carry the series onto a new upstream version, classify each patch (unchanged,
refreshed, conflict, upstreamed, obsolete) and write the refreshed variants."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import click
from packaging.version import Version

from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.commands.text import Literal, coloured, print_lines, table
from patchctl.cli.documents import document
from patchctl.cli.options import ENGINE, VERSION, VERSION_OR_LATEST, checks_python_option, source_options, store_option
from patchctl.core.errors import EXIT_OK, EXIT_PATCH_FAILED

if TYPE_CHECKING:
    from patchctl.cli.commands.text import Console
    from patchctl.rebase.replay import Verifier
    from patchctl.sources.fetch import SourceContext
    from patchctl.store.layered import Store
    from patchctl.store.series import Patch


COLOURS = {"unchanged": "green", "refreshed": "green", "upstreamed": "cyan", "obsolete": "dim", "conflict": "bold red"}


def run(
    engine: str,
    store: Store,
    ctx: SourceContext,
    *,
    onto: Version | str,
    old: Version | None = None,
    workdir: Path | None = None,
    write: bool = True,
    python: str | None = None,
    past_applies_to: bool = False,
    patches: tuple[str, ...] = (),
) -> tuple[dict, int]:
    from patchctl.core.engines import get_engine
    from patchctl.rebase import replay
    from patchctl.sources.fetch import latest_release
    from patchctl.store.selection import unknown_names

    unknown_names(store.series(engine).patches, patches, engine)  # apply's and ensure's message
    only = frozenset(patches) or None
    new = onto if isinstance(onto, Version) else latest_release(get_engine(engine), ctx)  # the word "latest"
    rep = replay.rebase(
        engine,
        store,
        new,
        ctx,
        old=old,
        workdir=workdir,
        write=write,
        verify=verify_with_smoke(store, ctx, python),
        past_applies_to=past_applies_to,
        only=only,
    )
    # With --patch, a conflict only in a patch not named is reported, not a failure of this command.
    code = (
        EXIT_PATCH_FAILED
        if any(i.classification == replay.CONFLICT and (only is None or i.name in only) for i in rep.items)
        else EXIT_OK
    )
    counts: dict[str, int] = {}
    for item in rep.items:
        counts[item.classification] = counts.get(item.classification, 0) + 1
    message = f"{engine} {rep.old} -> {rep.new}: " + ", ".join(f"{n} {k}" for k, n in counts.items())
    if rep.workdir:
        message += f"; conflicts and the replay repo are in {rep.workdir}" if code else f"; the replay repo is in {rep.workdir}"
    return document(
        "rebase",
        code,
        engine=engine,
        old=rep.old,
        new=rep.new,
        workdir=rep.workdir,
        items=[i._asdict() for i in rep.items],
        message=message,
    ), code


def verify_with_smoke(store: Store, ctx: SourceContext, python: str | None) -> Verifier:
    """A reused resolution becomes a variant only if the patch's checks pass with it. The candidate is
    checked in a temporary copy of the engine's store folder: the reviewed store is never written
    with an unpinned file (a kill during the checks would leave one behind)."""

    def verify(patch: Patch, version: Version, new_variant: bytes) -> tuple[bool, str]:
        from patchctl.patching.evaluate import Options
        from patchctl.smoke.suite import cpu_gate
        from patchctl.store.layered import Store

        if (patch.directory / f"{version}.patch").exists():
            return False, f"{version}.patch exists already"
        overlay = Path(tempfile.mkdtemp(prefix="patchctl-verify-"))
        try:
            own = store.store_of(patch)
            shutil.copytree(own / patch.engine, overlay / patch.engine)
            if (own / "envs").is_dir():
                shutil.copytree(own / "envs", overlay / "envs")
            (overlay / patch.engine / patch.name / f"{version}.patch").write_bytes(new_variant)
            layers = tuple(overlay if layer == own else layer for layer in store.layers or (own,))
            candidate = Store(layers[0], layers)
            gate = cpu_gate(candidate, ctx, python)
            return gate(candidate.series(patch.engine).get(patch.name), version, Options(allow_modified=True))
        except Exception as exc:  # a gate that cannot run must say so, never pass
            return False, f"smoke could not run: {exc}"
        finally:
            shutil.rmtree(overlay, ignore_errors=True)

    return verify


def render(doc: dict, out: Console, err: Console) -> None:
    t = table(
        f"rebase {doc.get('engine')} {doc.get('old')} -> {doc.get('new')}",
        ["patch", "classification", "old variant", "new variant", "detail"],
    )
    for item in doc["items"]:
        detail = item["reason"] + (f" [resolution {item['resolution']}]" if item.get("resolution") else "")
        t.add_row(
            item["name"],
            coloured(item["classification"], COLOURS.get(item["classification"])),
            item["old_variant"] or "-",
            item["new_variant"] or "-",
            Literal(detail),
        )
    out.print(t)
    for item in doc["items"]:
        for proposal in item.get("relocations") or ():
            print_lines(
                out, [f"relocated proposal for {item['name']} ({proposal['from']} -> {proposal['to']}):", proposal["diff"]]
            )


@patchctl_command(
    "rebase",
    render=render,
    example=(
        "patchctl rebase vllm --onto 0.24.0                   write refreshed variants for 0.24.0",
        "patchctl rebase vllm --onto latest --no-write        classify only",
        "patchctl rebase sglang --onto 0.5.23 --workdir /tmp/rb   keep conflict worktrees for `resolve`",
        "patchctl rebase vllm --onto 0.33.0 --past-applies-to   would the patches ending at <0.24 carry?",
        "patchctl rebase vllm --onto 0.34.0 --patch slot-mapping-bounds --workdir /tmp/rb   write that one only",
    ),
)
@click.argument("engine", type=ENGINE)
@click.option("--onto", required=True, type=VERSION_OR_LATEST, help="The new upstream version (or 'latest').")
@click.option("--from", "old", type=VERSION, help="The old base (default: the newest variant base at or below --onto).")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep the replay repo and conflict worktrees here (default: a temporary directory).",
)
@click.option("--no-write", is_flag=True, help="Classify only; write no variant files.")
@click.option(
    "--past-applies-to",
    is_flag=True,
    help="Also replay patches whose applies_to ends below --onto, as if it did not (their items "
    "say `outside_applies_to`; nothing is written for them: widen applies_to, then rebase).",
)
@click.option(
    "--patch",
    "patches",
    multiple=True,
    metavar="NAME",
    help="Write variants for this patch only (repeatable); the others are still replayed under it "
    "and classified, nothing is written for them.",
)
@checks_python_option
@store_option
@source_options
def command(
    engine: str,
    onto: Version | str,
    old: Version | None,
    workdir: Path | None,
    no_write: bool,
    past_applies_to: bool,
    patches: tuple[str, ...],
    python: str | None,
    store: Store,
    ctx: SourceContext,
) -> tuple[dict, int]:
    """Carry the series onto a new version: unchanged, refreshed, conflict, upstreamed, obsolete."""
    return run(
        engine,
        store,
        ctx,
        onto=onto,
        old=old,
        workdir=workdir,
        write=not no_write,
        python=python,
        past_applies_to=past_applies_to,
        patches=patches,
    )
