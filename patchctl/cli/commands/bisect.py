"""`patchctl bisect`: the first release (or, with --repo, commit) where a patch stops applying or,
with --smoke, where its CPU checks start failing."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.documents import document
from patchctl.cli.options import ENGINE, checks_python_option, source_options, store_option
from patchctl.core.errors import EXIT_OK, UsageError

if TYPE_CHECKING:
    from packaging.version import Version

    from patchctl.cli.commands.text import Console
    from patchctl.sources.fetch import SourceContext
    from patchctl.store.layered import Store


def run(
    engine: str,
    patch_name: str,
    store: Store,
    ctx: SourceContext,
    *,
    good: str,
    bad: str,
    smoke: bool = False,
    python: str | None = None,
) -> tuple[dict, int]:
    from packaging.version import InvalidVersion, Version

    from patchctl.core import config
    from patchctl.core.engines import get_engine
    from patchctl.rebase import first_break

    eng = get_engine(engine)
    series = store.series(engine).patches
    patch = store.series(engine).get(patch_name)
    if ctx.repo:
        from patchctl.sources.git import open_repo

        if ctx.version_override is None:
            raise UsageError("bisecting commits needs --as-version (the version to choose variants for)")
        git_repo = open_repo(ctx.repo, config.cache_dir(), offline=ctx.offline)
        commits = git_repo.git.rev_list("--reverse", "--first-parent", f"{good}..{bad}").split()
        points = [git_repo.commit(good).hexsha] + commits
        predicate = first_break.commit_predicate(patch, series, git_repo, eng, ctx.version_override)
    else:
        try:
            lo, hi = Version(good), Version(bad)
        except InvalidVersion as exc:
            raise UsageError(
                f"--good/--bad must be releases (PEP 440 versions): {exc}", hint="to bisect commits, pass --repo and commits"
            ) from None
        points = [str(v) for v in ctx.index_for().project(eng.dist).versions() if lo <= v <= hi]
        gate = None
        if smoke:
            from patchctl.smoke.suite import cpu_gate

            cpu = cpu_gate(store, ctx, python)

            def gate(version: Version) -> tuple[bool, str]:
                return cpu(patch, version)

        predicate = first_break.release_predicate(patch, series, ctx, eng, gate)
    result = first_break.bisect(points, predicate)
    return document(
        "bisect",
        EXIT_OK,
        patch=patch_name,
        engine=engine,
        first_bad=result.first_bad,
        last_good=result.last_good,
        steps=[s._asdict() for s in result.steps],
        message=f"{patch_name} first breaks at {result.first_bad} (last good {result.last_good}, "
        f"{len(result.steps)} evaluations of {len(points)} points)",
    ), EXIT_OK


def render(doc: dict, out: Console, err: Console) -> None:
    for step in doc.get("steps", []):
        out.print(f"  {'good' if step['good'] else 'bad ':<4} {step['point']}  {step['detail']}", markup=False, highlight=False)


@patchctl_command(
    "bisect",
    render=render,
    example=(
        "patchctl bisect vllm gguf-glm-dsa --good 0.16.0 --bad 0.23.0",
        "patchctl bisect vllm gguf-glm-dsa --good 0.20.0 --bad 0.23.0 --smoke",
        "patchctl bisect sglang bench-native-nonstream-timing --repo ./sglang --good v0.5.9 --bad main --as-version 0.5.9",
    ),
)
@click.argument("names", nargs=-1, metavar="ENGINE PATCH")
@click.option("--good", "--from", "good", required=True, help="A good release (or commit with --repo).")
@click.option("--bad", "--to", "bad", required=True, help="A bad release (or commit with --repo).")
@click.option("--smoke", is_flag=True, help="Also run the patch's CPU smoke checks at each release.")
@checks_python_option
@store_option
@source_options
def command(
    names: tuple[str, ...], good: str, bad: str, smoke: bool, python: str | None, store: Store, ctx: SourceContext
) -> tuple[dict, int]:
    """Find the first release (or commit) where PATCH stops applying or its smoke fails."""
    if len(names) == 2:
        engine, patch = ENGINE.convert(names[0], None, None), names[1]
    else:
        raise UsageError("name the engine and the patch: patchctl bisect ENGINE PATCH --good X --bad Y")
    return run(engine, patch, store, ctx, good=good, bad=bad, smoke=smoke, python=python)
