"""Smoke checks of a release: which patches can be checked there, the pristine and patched trees,
the patch's environment, and each patch's pytest run (smoketest/pytest_run.py). The core behind `smoke`,
the matrix's smoke cells and rebase's verification gate."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

from patchctl.core.errors import UsageError
from patchctl.patching.evaluate import Options, evaluate
from patchctl.smoke import pytest_run, trees
from patchctl.smoke.envs import ensure_env, env_ready
from patchctl.smoke.pytest_run import CheckResult
from patchctl.sources import fetch, registry
from patchctl.sources.kinds.common import SMOKE_WHAT
from patchctl.sources.spec import EngineRef, parse_spec
from patchctl.store.layered import Store

if TYPE_CHECKING:
    from packaging.version import Version

    from patchctl.store.series import Patch

RUNNABLE = ("clean", "offset", "fuzz", "three-way")


class SmokeRun(NamedTuple):
    engine: str
    version: str
    tier: str
    source: dict
    results: list[CheckResult]

    @property
    def failed(self) -> bool:
        return any(r.status in ("failed", "error") for r in self.results)


def run_smoke(
    ref: EngineRef,
    store: Store,
    ctx: fetch.SourceContext,
    *,
    only: tuple[str, ...] = (),
    tier: str = "cpu",
    python: str | None = None,
    options: Options = Options(),
    notify: Callable[[str], None] | None = None,
) -> SmokeRun:
    """notify(text): progress for people (environment builds, each patch's run); None is silent."""
    say = notify or (lambda text: None)
    # The kind says what trees are built from (a release's sdist, a build's own wheel or commit, a
    # file's archive); one with none (the installed engine, a directory) is refused before any fetch.
    kind = registry.kind_named(ref.kind)
    if kind.smoke_label is None:
        raise UsageError(SMOKE_WHAT)
    upstream = registry.open_upstream(ref, ctx)
    series = store.series(ref.engine.name)
    patches = tuple(p for p in series.patches if not only or p.name in only)
    unknown = set(only) - {p.name for p in series.patches}
    if unknown:
        raise UsageError(f"no such patch in the {ref.engine.name} series: {', '.join(sorted(unknown))}")
    version = str(upstream.version)

    def not_run(patch: Patch, reason: str) -> CheckResult:
        return CheckResult(patch.name, tier, "not-run", 0, 0, 0, 0.0, reason, "")

    # Decide from the sparse check first: a release where nothing applies needs no trees at all.
    quick = evaluate(series.patches, upstream.version, upstream.source, options=options)
    if not any(_checkable(p, quick.outcome_of(p.name).outcome, upstream.version) for p in patches):
        return SmokeRun(
            ref.engine.name,
            version,
            tier,
            upstream.source.provenance()._asdict(),
            [not_run(p, f"patch is {quick.outcome_of(p.name).outcome} on {version}") for p in patches],
        )
    say(f"building the pristine and patched trees of {ref.engine.name} {version}")
    built = trees.build_trees(ref.engine, upstream.version, series.patches, ctx, options, upstream=upstream)
    results = []
    for patch in patches:
        outcome = built.result.outcome_of(patch.name).outcome
        if not _checkable(patch, outcome, upstream.version):
            results.append(not_run(patch, f"patch is {outcome} on {version}"))
            continue
        upstream_proof = outcome == "upstreamed"
        profile: str | None = patch.smoke.get("env")
        if python is not None:
            env_python = python
        elif not profile:
            results.append(not_run(patch, "patch.yaml names no smoke env"))
            continue
        else:
            envs_store = envs_root(store, patch, profile)
            if not env_ready(envs_store, profile):
                say(f"building smoke environment {profile!r} (once; a few minutes)")
            env_python = ensure_env(envs_store, profile)
        say(f"{patch.name}: running its {tier} checks")
        results.append(
            pytest_run.run_checks(
                patch,
                tier,
                env_python,
                engine=ref.engine.name,
                version=version,
                patched=built.pristine if upstream_proof else built.patched,
                pristine=built.pristine,
                upstream_proof=upstream_proof,
                extra_env=companion_trees(patch, ctx),
            )
        )
    return SmokeRun(
        ref.engine.name,
        version,
        tier,
        {"kind": kind.smoke_label, "description": built.artifact, "sha256": built.artifact_sha256},
        results,
    )


def envs_root(store: Store, patch: Patch, profile: str) -> Path:
    """The store whose envs/ defines the profile: the patch's own, else the next layer that has it
    (a user's patch may use the bundled smoke environments)."""
    own = store.store_of(patch)
    for root in [own, *(store.layers or (store.root,))]:
        if (root / "envs" / f"{profile}.txt").is_file():
            return root
    return own


def _checkable(patch: Patch, outcome: str, version: Version) -> bool:
    """Applied patches are checked; an upstreamed one too, when its metadata claims the version
    (its checks then prove upstream's own code on the pristine tree)."""
    return outcome in RUNNABLE or (outcome == "upstreamed" and patch.upstreamed_at(version))


def companion_trees(patch: Patch, ctx: fetch.SourceContext) -> dict[str, str]:
    """`smoke.with: ["vllm@0.24.0"]`: pristine trees of other engines a patch's checks import
    (the GGUF plugin imports vLLM), passed as PATCHCTL_<ENGINE>_TREE (the last one) and all of
    them as PATCHCTL_<ENGINE>_TREES."""
    env: dict[str, str] = {}
    for text in patch.smoke.get("with") or ():
        ref = parse_spec(text)
        if ref.version is None:
            raise UsageError(f"{patch.engine}/{patch.name}: smoke.with {text!r} must name an exact version")
        tree = trees.pristine_tree(fetch.release(ref.engine, ref.version, ctx, prefer_sdist=True))
        key = f"PATCHCTL_{ref.engine.name.upper().replace('-', '_')}_TREE"
        env[key] = str(tree)  # the last one named
        # every named tree of that engine, for checks that load several releases (VERSION=PATH, os.pathsep)
        env[key + "S"] = os.pathsep.join(filter(None, (env.get(key + "S"), f"{ref.version}={tree}")))
    return env


class SmokeGate(Protocol):
    def __call__(self, patch: Patch, version: Version, options: Options | None = None) -> tuple[bool, str]: ...


def cpu_gate(store: Store, ctx: fetch.SourceContext, python: str | None) -> SmokeGate:
    """(patch, version, options) -> (ok, reason) from the patch's CPU checks on that release: the gate
    bisect --smoke and rebase's verification use."""
    from patchctl.core.engines import get_engine

    def gate(patch: Patch, version: Version, options: Options | None = None) -> tuple[bool, str]:
        run = run_smoke(
            EngineRef(get_engine(patch.engine), "exact", version),
            store,
            ctx,
            only=(patch.name,),
            tier="cpu",
            python=python,
            options=options or Options(),
        )
        (result,) = run.results
        return result.status == "passed", f"{result.status}: {result.reason}"

    return gate
