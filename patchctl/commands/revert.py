from __future__ import annotations

from patchctl import report
from patchctl.sources import fetch
from patchctl.target import operations as tgt
from patchctl.commands.common import find_target
from patchctl.errors import EXIT_OK
from patchctl.spec import EngineRef


def revert(ref: EngineRef, ctx: fetch.SourceContext, *, python, target_dir, force: bool, wait: float) -> tuple[dict, int]:
    target = find_target(ref, python=python, target_dir=target_dir, install=False, ctx=ctx)
    rep = tgt.revert(target, force=force, wait=wait)
    message = rep.note or f"restored {len(rep.restored)} file(s) byte for byte"
    if rep.skipped:
        message += f"; {len(rep.skipped)} already pristine"
    return report.document("revert", EXIT_OK, engine=target.engine.name, version=str(target.version),
                           target=str(target.root), restored=list(rep.restored), skipped=list(rep.skipped),
                           message=message), EXIT_OK
