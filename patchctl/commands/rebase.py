from __future__ import annotations

from pathlib import Path

from packaging.version import Version

from patchctl.rebase import bisect as bisect_mod
from patchctl import config, report, store as st
from patchctl.sources import fetch
from patchctl.rebase import replay as rebase_mod
from patchctl.commands.common import parse_version
from patchctl.engines import get_engine
from patchctl.errors import EXIT_OK, EXIT_PATCH_FAILED, UsageError


def rebase(engine: str, store: st.Store, ctx: fetch.SourceContext, *, onto: str, old: str | None, workdir: Path | None,
           write: bool, verify) -> tuple[dict, int]:
    rep = rebase_mod.rebase(engine, store, _version(onto, ctx, engine), ctx, old=parse_version(old),
                            workdir=workdir, write=write, verify=verify)
    code = EXIT_PATCH_FAILED if any(i.classification == rebase_mod.CONFLICT for i in rep.items) else EXIT_OK
    counts = {}
    for item in rep.items:
        counts[item.classification] = counts.get(item.classification, 0) + 1
    message = f"{engine} {rep.old} -> {rep.new}: " + ", ".join(f"{n} {k}" for k, n in counts.items())
    if rep.workdir:
        message += f"; conflicts and the replay repo are in {rep.workdir}"
    return report.document("rebase", code, engine=engine, old=rep.old, new=rep.new, workdir=rep.workdir,
                           items=[i._asdict() for i in rep.items], message=message), code


def _version(text: str, ctx, engine) -> Version:
    if text == "latest":
        versions = ctx.index().project(get_engine(engine).dist).versions()
        return versions[-1]
    return parse_version(text)


def resolve_conflict(engine: str, store: st.Store, workdir: Path, patch: str, onto: str) -> tuple[dict, int]:
    filename = rebase_mod.record_resolution(store, engine, workdir, patch, parse_version(onto))
    return report.document("resolve", EXIT_OK, engine=engine, patch=patch, written=filename,
                           message=f"recorded the resolution and wrote {patch}/{filename}; "
                                   f"review both with `git diff`, then commit"), EXIT_OK


def bisect(patch_name: str, engine: str, store: st.Store, ctx: fetch.SourceContext, *, good: str, bad: str,
           repo: str | None, version: str | None, smoke) -> tuple[dict, int]:
    eng = get_engine(engine)
    series = store.series(engine).patches
    patch = store.series(engine).get(patch_name)
    if repo:
        from patchctl.sources.git import open_repo

        git_repo = open_repo(repo, config.cache_dir(), offline=ctx.offline)
        commits = git_repo.git.rev_list("--reverse", "--first-parent", f"{good}..{bad}").split()
        points = [git_repo.commit(good).hexsha] + commits
        if version is None:
            raise UsageError("bisecting commits needs --as-version (the version to choose variants for)")
        predicate = bisect_mod.commit_predicate(patch, series, git_repo, eng, parse_version(version))
    else:
        lo, hi = Version(good), Version(bad)
        points = [str(v) for v in ctx.index().project(eng.dist).versions() if lo <= v <= hi]
        predicate = bisect_mod.release_predicate(patch, series, ctx, eng, smoke)
    result = bisect_mod.bisect(points, predicate)
    return report.document("bisect", EXIT_OK, patch=patch_name, engine=engine, first_bad=result.first_bad,
                           last_good=result.last_good, steps=[s._asdict() for s in result.steps],
                           message=f"{patch_name} first breaks at {result.first_bad} (last good {result.last_good}, "
                                   f"{len(result.steps)} evaluations of {len(points)} points)"), EXIT_OK


def droppable(store: st.Store, ctx: fetch.SourceContext, engines: tuple[str, ...]) -> tuple[dict, int]:
    """Patches whose drop_when rule holds on the newest release: candidates for deletion."""
    from patchctl.engine import evaluate as engine_apply

    rows = []
    for engine in engines or tuple(store.engines()):
        eng = get_engine(engine)
        latest = ctx.index().project(eng.dist).versions()[-1]
        series = store.series(engine).patches
        outcomes = None
        for patch in series:
            met = st.drop_rule_met(patch, eng.dist, latest)
            why = f"{patch.drop_when} holds for {latest}" if met else None
            if patch.drop_when == "upstreamed" and patch.upstreamed_at(latest):
                met, why = True, f"upstreamed_in {patch.upstreamed_in} covers {latest}"
            elif patch.drop_when == "upstreamed":
                if outcomes is None:
                    outcomes = engine_apply.evaluate(series, latest, fetch.release(eng, latest, ctx))
                met = outcomes.outcome_of(patch.name).outcome == "upstreamed"
                why = f"upstreamed in {latest} (reverse-apply proof)" if met else None
            rows.append({"engine": engine, "patch": patch.name, "drop_when": patch.drop_when,
                         "latest": str(latest), "droppable": bool(met), "why": why})
    names = [f"{r['engine']}/{r['patch']} ({r['why']})" for r in rows if r["droppable"]]
    return report.document("droppable", EXIT_OK, patches=rows,
                           message=("can be deleted once no supported deployment runs an older version: " + "; ".join(names))
                           if names else "no patch can be dropped yet"), EXIT_OK


def smoke_gate(store: st.Store, ctx: fetch.SourceContext, python: str | None):
    """(patch, version) -> (ok, reason) from the patch's CPU smoke checks on that release."""
    from patchctl.commands import smoke as smoke_cmd
    from patchctl.spec import EngineRef

    def gate(patch, version, options=None):
        from patchctl.engine.evaluate import Options

        doc, _ = smoke_cmd.smoke_checks(EngineRef(get_engine(patch.engine), "exact", version), store, ctx,
                                        only=(patch.name,), tier="cpu", python=python,
                                        options=options or Options())
        (result,) = doc["results"]
        return result["status"] == "passed", f"{result['status']}: {result['reason']}"

    return gate


def verify_with_smoke(store: st.Store, ctx: fetch.SourceContext, python: str | None):
    """A reused resolution becomes a variant only if the patch's checks pass with it."""
    gate = smoke_gate(store, ctx, python)

    def verify(patch, version, new_variant: bytes):
        target = patch.directory / f"{version}.patch"
        if target.exists():
            return False, f"{target.name} exists already"
        target.write_bytes(new_variant)  # the candidate, in place (unpinned), for the checks to use
        try:
            from patchctl.engine.evaluate import Options

            return gate(store.series(patch.engine).get(patch.name), version, Options(allow_modified=True))
        except Exception as exc:  # a gate that cannot run must say so, never pass
            return False, f"smoke could not run: {exc}"
        finally:
            target.unlink(missing_ok=True)

    return verify
