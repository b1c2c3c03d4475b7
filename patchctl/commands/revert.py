"""`patchctl revert`: restore every file patchctl wrote in a target, byte for byte."""
from __future__ import annotations

import click

from patchctl.commands.base import patchctl_command
from patchctl.documents import document
from patchctl.errors import EXIT_OK
from patchctl.options import target_options, wait_option
from patchctl.spec import parse_spec


def run(spec: str, where, *, force: bool = False, wait: float = 0.0) -> tuple[dict, int]:
    from patchctl.target import operations as tgt
    from patchctl.target.find import find_target

    target = find_target(parse_spec(spec), where)
    rep = tgt.revert(target, force=force, wait=wait)
    message = rep.note or f"restored {len(rep.restored)} file(s) byte for byte"
    if rep.skipped:
        message += f"; {len(rep.skipped)} already pristine"
    return document("revert", EXIT_OK, engine=target.engine.name, version=str(target.version),
                    target=str(target.root), restored=list(rep.restored), skipped=list(rep.skipped),
                    message=message), EXIT_OK


@patchctl_command("revert", example=(
    "patchctl revert vllm",
    "patchctl revert sglang --target ./site-packages --force    also files edited since",
))
@click.argument("spec", metavar="ENGINE")
@target_options
@wait_option
@click.option("--force", is_flag=True, help="Restore files even if they changed since they were patched.")
def command(spec, where, wait, force):
    """Restore every patched file byte for byte."""
    return run(spec, where, force=force, wait=wait)
