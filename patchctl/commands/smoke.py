from __future__ import annotations

from patchctl.engine import evaluate as engine_apply
from patchctl import report
from patchctl.sources import fetch
from patchctl.checks import runner as smoke
from patchctl.checks import trees as trees
from patchctl.engine.evaluate import Options
from patchctl.checks.envs import ensure_env, env_ready
from patchctl.errors import EXIT_OK, EXIT_PATCH_FAILED, UsageError
from patchctl.spec import EngineRef
from patchctl.store import Store


def smoke_checks(ref: EngineRef, store: Store, ctx: fetch.SourceContext, *, only: tuple[str, ...], tier: str,
                 python: str | None, options: Options = Options(), notify=None) -> tuple[dict, int]:
    """notify(text): progress for people (environment builds, each patch's run); None is silent."""
    notify = notify or (lambda text: None)
    if ref.kind not in ("exact", "latest"):
        raise UsageError("smoke checks need a released version: ENGINE@X.Y.Z or ENGINE@latest")
    upstream = fetch.open_upstream(ref, ctx)
    series = store.series(ref.engine.name)
    patches = tuple(p for p in series.patches if not only or p.name in only)
    unknown = set(only) - {p.name for p in series.patches}
    if unknown:
        raise UsageError(f"no such patch in the {ref.engine.name} series: {', '.join(sorted(unknown))}")
    # Decide from the sparse check first: a release where nothing applies needs no trees at all.
    quick = engine_apply.evaluate(series.patches, upstream.version, upstream.source, options=options)
    runnable = [p for p in patches if quick.outcome_of(p.name).outcome in ("clean", "offset", "fuzz", "three-way")
                or (quick.outcome_of(p.name).outcome == "upstreamed" and p.upstreamed_at(upstream.version))]
    if not runnable:
        results = [smoke.CheckResult(p.name, tier, "not-run", 0, 0, 0, 0.0,
                                     f"patch is {quick.outcome_of(p.name).outcome} on {upstream.version}", "")
                   for p in patches]
        return report.document("smoke", EXIT_OK, engine=ref.engine.name, version=str(upstream.version), tier=tier,
                               source=upstream.source.provenance()._asdict(),
                               results=[r._asdict() for r in results]), EXIT_OK
    notify(f"building the pristine and patched trees of {ref.engine.name} {upstream.version}")
    built = trees.build_trees(ref.engine, upstream.version, series.patches, ctx, options)
    results = []
    for patch in patches:
        outcome = built.result.outcome_of(patch.name)
        upstream_proof = outcome.outcome == "upstreamed" and patch.upstreamed_at(upstream.version)
        if outcome.outcome not in ("clean", "offset", "fuzz", "three-way") and not upstream_proof:
            results.append(smoke.CheckResult(patch.name, tier, "not-run", 0, 0, 0, 0.0,
                                             f"patch is {outcome.outcome} on {upstream.version}", ""))
            continue
        profile = patch.smoke.get("env")
        if python is None and not profile:
            results.append(smoke.CheckResult(patch.name, tier, "not-run", 0, 0, 0, 0.0,
                                             "patch.yaml names no smoke env", ""))
            continue
        if python is None and not env_ready(store.root, profile):
            notify(f"building smoke environment {profile!r} (once; a few minutes)")
        env_python = python or ensure_env(store.root, profile)
        notify(f"{patch.name}: running its {tier} checks")
        results.append(smoke.run_checks(patch, tier, env_python, engine=ref.engine.name,
                                        version=str(upstream.version),
                                        patched=built.pristine if upstream_proof else built.patched,
                                        pristine=built.pristine, upstream_proof=upstream_proof,
                                        extra_env=companion_trees(patch, ctx)))
    code = EXIT_PATCH_FAILED if any(r.status in ("failed", "error") for r in results) else EXIT_OK
    return report.document("smoke", code, engine=ref.engine.name, version=str(upstream.version), tier=tier,
                           source={"kind": "release", "description": built.artifact, "sha256": built.artifact_sha256},
                           results=[r._asdict() for r in results]), code


def companion_trees(patch, ctx: fetch.SourceContext) -> dict[str, str]:
    """`smoke.with: ["vllm@0.24.0"]`: pristine trees of other engines a patch's checks import
    (the GGUF plugin imports vLLM), passed as PATCHCTL_<ENGINE>_TREE."""
    from patchctl.spec import parse_spec

    env = {}
    for text in patch.smoke.get("with") or ():
        ref = parse_spec(text)
        if ref.kind != "exact":
            raise UsageError(f"{patch.engine}/{patch.name}: smoke.with {text!r} must name an exact version")
        tree = trees.pristine_tree(fetch.release(ref.engine, ref.version, ctx, prefer_sdist=True))
        env[f"PATCHCTL_{ref.engine.name.upper().replace('-', '_')}_TREE"] = str(tree)
    return env
