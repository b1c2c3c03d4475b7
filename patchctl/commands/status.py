from __future__ import annotations

from patchctl import report
from patchctl.sources import fetch
from patchctl.target import operations as tgt
from patchctl.commands.common import find_target
from patchctl.errors import EXIT_OK, EXIT_PATCH_FAILED
from patchctl.spec import EngineRef

EXIT_BY_STATE = {"intact": EXIT_OK, "not-applied": EXIT_OK, "wiped": EXIT_PATCH_FAILED,
                 "version-changed": EXIT_PATCH_FAILED, "modified": EXIT_PATCH_FAILED}


def status(ref: EngineRef, ctx: fetch.SourceContext, *, python, target_dir) -> tuple[dict, int]:
    target = find_target(ref, python=python, target_dir=target_dir, install=False, ctx=ctx)
    with target.state().locked(wait_seconds=30):
        recovered = target.state().recover(target.root)
    st = tgt.status(target)
    code = EXIT_BY_STATE[st.state]
    record = st.record
    return report.document(
        "status", code, engine=target.engine.name, version=str(target.version), target=str(target.root),
        state=st.state, message=st.message + (" (recovered an interrupted run first)" if recovered else ""),
        applied_version=record.version if record else None,
        applied_at=record.applied_at if record else None,
        applied=[p._asdict() for p in record.patches] if record else [],
        files=[f._asdict() for f in st.files],
    ), code
