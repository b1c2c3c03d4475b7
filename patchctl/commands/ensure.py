from __future__ import annotations

from patchctl import report
from patchctl.sources import fetch
from patchctl.target import operations as tgt
from patchctl.commands import apply as apply_command
from patchctl.commands.common import find_target
from patchctl.errors import EXIT_OK, EXIT_PATCH_FAILED
from patchctl.spec import EngineRef


def ensure(ref: EngineRef, store, ctx: fetch.SourceContext, options, *, python, target_dir, wait: float) -> tuple[dict, int]:
    """Idempotent: nothing when intact, re-apply after an upgrade wiped the patches."""
    target = find_target(ref, python=python, target_dir=target_dir, install=False, ctx=ctx)
    st = tgt.status(target)
    if st.state == "modified":
        return report.document("ensure", EXIT_PATCH_FAILED, engine=target.engine.name, version=str(target.version),
                               target=str(target.root), state=st.state,
                               error={"kind": "patch-failed", "message": st.message,
                                      "hint": "inspect the files; `patchctl revert --force` restores them"}), EXIT_PATCH_FAILED
    doc, code = apply_command.apply(ref, store, ctx, options, python=python, target_dir=target_dir, install=False,
                                    keep_going=False, dry_run=False, wait=wait, force=False, command="ensure")
    doc["state_before"] = st.state
    if code == EXIT_OK and not doc.get("written") and not any(d.get("written") for d in doc.get("also", [])):
        doc["note"] = "patches intact: nothing to do"
    elif code == EXIT_OK and st.state in ("wiped", "version-changed"):
        doc["note"] = f"{st.message.split(':')[0]}; re-applied"
    return doc, code
