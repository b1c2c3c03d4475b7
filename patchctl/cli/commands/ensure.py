"""`patchctl ensure`: what systemd runs before every start (ExecStartPre=): nothing when the patches
are intact, a re-apply after an upgrade wiped them, a failure when someone edited a patched file."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.commands.text import print_outcomes
from patchctl.cli.options import writer_options
from patchctl.core.errors import EXIT_OK
from patchctl.sources.spec import parse_spec

if TYPE_CHECKING:
    from patchctl.cli.commands.text import Console
    from patchctl.patching.options import Options
    from patchctl.sources.fetch import SourceContext
    from patchctl.tree.bookkeeping import Selection
    from patchctl.tree.find import TargetSpec
    from patchctl.tree.stores import Stores


def run(
    spec: str,
    stores: Stores,
    ctx: SourceContext,
    options: Options,
    where: TargetSpec,
    *,
    wait: float = 0.0,
    selection: Selection | None = None,
) -> tuple[dict, int]:
    """The service's apply in ensure mode (tree.service.Mode.ENSURE): the lock and recovery first,
    nothing read or written when the record is intact and from this series, a hand edit refused
    (exit 1, `state: modified`). The record is the contract: the recorded stores and choice are
    applied with no --store; a recorded patch or store that is gone is exit 3 (RecordUnmet)."""
    from patchctl.cli.tree_documents import apply_document
    from patchctl.tree import service

    request = service.ApplyRequest(stores, options, ctx, service.Mode.ENSURE, selection, wait=wait)
    doc, code = apply_document(service.apply(parse_spec(spec), where, request), "ensure")
    before = doc.get("state_before")
    if code == EXIT_OK and not doc.get("written") and not any(d.get("written") for d in doc.get("also", [])):
        doc["note"] = "patches intact: nothing to do"
    elif code == EXIT_OK and before in ("wiped", "version-changed"):
        doc["note"] = f"the patches were {'wiped' if before == 'wiped' else 'gone after an upgrade'}; re-applied"
    return doc, code


def render(doc: dict, out: Console, err: Console) -> None:
    for d in [doc, *doc.get("also", [])]:
        print_outcomes(out, d)


@patchctl_command(
    "ensure",
    render=render,
    example=(
        "patchctl ensure vllm --python /opt/vllm/bin/python     in a unit: ExecStartPre=",
        "patchctl ensure sglang --target /srv/sglang/site-packages --json",
    ),
)
@click.argument("spec", metavar="ENGINE[@VERSION]")
@writer_options
def command(
    spec: str, where: TargetSpec, ctx: SourceContext, stores: Stores, options: Options, wait: float, selection: Selection | None
) -> tuple[dict, int]:
    """Idempotent apply for ExecStartPre=: no-op when intact, re-apply after an upgrade.

    Applies what the tree's record names — its patches, from the stores they came from, with the
    --patch/--exclude choice apply recorded — with no --store needed. A recorded patch or store that
    is gone is exit 3 naming both; changing the set is an explicit `apply`.
    """
    return run(spec, stores, ctx, options, where, wait=wait, selection=selection)
