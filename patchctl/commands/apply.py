from __future__ import annotations

from patchctl.engine import evaluate as engine_apply
from patchctl import outcomes as O
from patchctl import report
from patchctl.sources import fetch
from patchctl.target import operations as tgt
from patchctl.commands.check import moved_warnings
from patchctl.commands.common import base_files_for, find_target, requirement_warnings
from patchctl.engines import get_engine
from patchctl.errors import EXIT_OK, EXIT_PATCH_FAILED
from patchctl.sources import installed as inst
from patchctl.spec import EngineRef
from patchctl.store import Store


def apply(ref: EngineRef, store: Store, ctx: fetch.SourceContext, options: engine_apply.Options, *,
          python: str | None, target_dir: str | None, install: bool, keep_going: bool,
          dry_run: bool, wait: float, force: bool, command: str = "apply") -> tuple[dict, int]:
    target = find_target(ref, python=python, target_dir=target_dir, install=install, ctx=ctx)
    env_python = None if target_dir else (python or inst.default_python())
    docs = [_apply_one(target, store, ctx, options, keep_going, dry_run, wait, force, command, env_python)]
    warnings = moved_warnings(target.engine, target.version)
    # Code that moved to another distribution (vLLM's GGUF support → vllm-gguf-plugin) is patched
    # there, when that distribution is installed in the same environment.
    if not target_dir:
        for move in target.engine.moves_at(target.version):
            other = inst.find_installed(get_engine(move.engine), python)
            if other is None:
                warnings.append(f"{move.engine} is not installed, so its patches were not applied")
                continue
            other_target = tgt.Target(other.engine, other.root, other.version, f"installed in {other.python}")
            docs.append(_apply_one(other_target, store, ctx, options, keep_going, dry_run, wait, force, command,
                                   env_python))
    first = docs[0]
    code = max(d["exit_code"] for d in docs)
    first["also"] = docs[1:]
    first["exit_code"], first["ok"] = code, code == EXIT_OK
    first["warnings"] = warnings + [w for d in docs for w in d["warnings"]]
    return first, code


def _apply_one(target, store, ctx, options, keep_going, dry_run, wait, force, command, env_python) -> dict:
    patches = store.series(target.engine.name).patches
    # Companion packages (gguf>=0.18, ...) can only be checked in an environment, not in a bare tree.
    warnings = requirement_warnings([p for p in patches if p.in_range(target.version)], env_python) if env_python else []
    base = base_files_for(target.engine, ctx)
    try:
        rep = tgt.apply(target, patches, options=options, base_files=base, keep_going=keep_going,
                        dry_run=dry_run, wait=wait, force=force)
    except tgt.ConflictError as exc:
        return report.document(command, EXIT_PATCH_FAILED, engine=target.engine.name, version=str(target.version),
                               target=str(target.root), source={"kind": "target", "description": target.how},
                               patches=report.series_json(exc.result), written=[],
                               error={"kind": exc.kind, "message": exc.message, "hint": exc.hint}, warnings=warnings)
    failed = any(o.outcome == O.CONFLICT for o in rep.result.outcomes)
    code = EXIT_PATCH_FAILED if failed else EXIT_OK
    note = rep.note
    if rep.recovered:
        note = (note + "; " if note else "") + "recovered an interrupted earlier run first"
    if rep.written:
        note = (note + "; " if note else "") + f"wrote {len(rep.written)} file(s)"
    return report.document(command, code, engine=target.engine.name, version=str(target.version),
                           target=str(target.root), source={"kind": "target", "description": target.how},
                           patches=report.series_json(rep.result), written=list(rep.written), note=note,
                           warnings=warnings)
