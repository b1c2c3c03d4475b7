"""`patchctl ensure`: what systemd runs before every start (ExecStartPre=): nothing when the patches
are intact, a re-apply after an upgrade wiped them, a failure when someone edited a patched file."""
from __future__ import annotations

import click

from patchctl.commands import apply as apply_command
from patchctl.commands.base import patchctl_command
from patchctl.documents import document
from patchctl.errors import EXIT_OK, EXIT_PATCH_FAILED
from patchctl.options import fetch_options, store_option, target_options, wait_option, write_options
from patchctl.spec import parse_spec


def run(spec: str, store, ctx, options, where, *, wait: float = 0.0) -> tuple[dict, int]:
    from patchctl.target import operations as tgt
    from patchctl.target.find import find_target

    target = find_target(parse_spec(spec), where, ctx=ctx)
    st = tgt.status(target)
    if st.state == "modified":
        return document("ensure", EXIT_PATCH_FAILED, engine=target.engine.name, version=str(target.version),
                        target=str(target.root), state=st.state,
                        error={"kind": "patch-failed", "message": st.message,
                               "hint": "inspect the files; `patchctl revert --force` restores them"}), EXIT_PATCH_FAILED
    doc, code = apply_command.run(spec, store, ctx, options, where, wait=wait, name="ensure")
    doc["state_before"] = st.state
    if code == EXIT_OK and not doc.get("written") and not any(d.get("written") for d in doc.get("also", [])):
        doc["note"] = "patches intact: nothing to do"
    elif code == EXIT_OK and st.state in ("wiped", "version-changed"):
        doc["note"] = f"{st.message.split(':')[0]}; re-applied"
    return doc, code


@patchctl_command("ensure", render=apply_command.render, example=(
    "patchctl ensure vllm --python /opt/vllm/bin/python     in a unit: ExecStartPre=",
    "patchctl ensure sglang --target /srv/sglang/site-packages --json",
))
@click.argument("spec", metavar="ENGINE[@VERSION]")
@target_options
@fetch_options
@store_option
@write_options
@wait_option
def command(spec, where, ctx, store, options, wait):
    """Idempotent apply for ExecStartPre=: no-op when intact, re-apply after an upgrade."""
    return run(spec, store, ctx, options, where, wait=wait)
