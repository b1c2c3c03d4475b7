"""`patchctl ensure`: what systemd runs before every start (ExecStartPre=): nothing when the patches
are intact, a re-apply after an upgrade wiped them, a failure when someone edited a patched file."""
from __future__ import annotations

from typing import TYPE_CHECKING

import click

from patchctl.cli.commands import apply as apply_command
from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.options import writer_options
from patchctl.core.errors import EXIT_OK

if TYPE_CHECKING:
    from patchctl.cli.options import WriteRules as Options
    from patchctl.sources.fetch import SourceContext
    from patchctl.store.series import Store
    from patchctl.tree.find import TargetSpec
    from patchctl.tree.journal import Selection


def run(spec: str, store: Store, ctx: SourceContext, options: Options, where: TargetSpec, *,
        wait: float = 0.0, selection: Selection | None = None) -> tuple[dict, int]:
    """apply's run under the ensure rules (operations.apply(ensure=True)): the lock and recovery
    first, nothing read or written when the record is intact and from this series, a hand edit
    refused (exit 1, `state: modified`). The record is the contract: the recorded stores and choice
    are applied with no --store; a recorded patch or store that is gone is exit 3 (RecordUnmet)."""
    doc, code = apply_command.run(spec, store, ctx, options, where, wait=wait, name="ensure", selection=selection)
    before = doc.get("state_before")
    if code == EXIT_OK and not doc.get("written") and not any(d.get("written") for d in doc.get("also", [])):
        doc["note"] = "patches intact: nothing to do"
    elif code == EXIT_OK and before in ("wiped", "version-changed"):
        doc["note"] = f"the patches were {'wiped' if before == 'wiped' else 'gone after an upgrade'}; re-applied"
    return doc, code


@patchctl_command("ensure", render=apply_command.render, example=(
    "patchctl ensure vllm --python /opt/vllm/bin/python     in a unit: ExecStartPre=",
    "patchctl ensure sglang --target /srv/sglang/site-packages --json",
))
@click.argument("spec", metavar="ENGINE[@VERSION]")
@writer_options
def command(spec: str, where: TargetSpec, ctx: SourceContext, store: Store, options: Options,
            wait: float, selection: Selection | None) -> tuple[dict, int]:
    """Idempotent apply for ExecStartPre=: no-op when intact, re-apply after an upgrade.

    Applies what the tree's record names — its patches, from the stores they came from, with the
    --patch/--exclude choice apply recorded — with no --store needed. A recorded patch or store that
    is gone is exit 3 naming both; changing the set is an explicit `apply`.
    """
    return run(spec, store, ctx, options, where, wait=wait, selection=selection)
