"""The click CLI: parse, call a command function, render. No logic of its own."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from patchctl import __version__, report
from patchctl.commands import apply as apply_cmd
from patchctl.commands import check as check_cmd
from patchctl.commands import ensure as ensure_cmd
from patchctl.commands import export as export_cmd
from patchctl.commands import lint as lint_cmd
from patchctl.commands import list as list_cmd
from patchctl.commands import matrix as matrix_cmd
from patchctl.commands import rebase as rebase_cmd
from patchctl.commands import revert as revert_cmd
from patchctl.commands import smoke as smoke_cmd
from patchctl.commands import status as status_cmd
from patchctl.commands.common import make_context, options_from
from patchctl.errors import EXIT_ENVIRONMENT, PatchctlError, UsageError
from patchctl.options import (allow_modified_option, json_option, python_option, source_options, store_option,
                              strict_option, target_option, wait_option)
from patchctl.progress import progress_for
from patchctl.serve import patch_set_digest
from patchctl.serve.cli import serve_options, serve_requested, serve_smoke
from patchctl.spec import parse_spec
from patchctl.store import Store


def _run(command: str, as_json: bool, fn) -> None:
    try:
        doc, code = fn()
    except PatchctlError as exc:
        code = exc.exit_code
        doc = report.document(command, code, error={"kind": exc.kind, "message": exc.message, "hint": exc.hint})
    except KeyboardInterrupt:
        raise
    except OSError as exc:
        code = EXIT_ENVIRONMENT
        doc = report.document(command, code, error={"kind": "environment", "message": str(exc), "hint": None})
    if as_json:
        report.emit_json(doc)
    else:
        report.print_document(doc)
    sys.exit(code)


def _serve_tier_without_server():
    raise UsageError('the serve tier needs a server: --serve URL, or --start "vllm serve MODEL ..."')


def _notify(text: str) -> None:
    """Progress lines for long work, on stderr so that --json output stays one document."""
    click.echo(f"patchctl: {text}", err=True)


def _ctx(index_url, offline, nightly_source, repo, as_version):
    return make_context(index_url=index_url, offline=offline, nightly_source=nightly_source, repo=repo,
                        as_version=as_version, progress=progress_for())


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="patchctl")
def main() -> None:
    """Keep downstream patches to vLLM and SGLang alive across upstream releases.

    Exit codes: 0 ok, 1 a patch failed to apply, 2 usage or bad input, 3 environment.
    """


@main.command()
@click.argument("spec")
@click.option("--patch", "only", multiple=True, help="Check only these patches.")
@store_option
@source_options
@strict_option
@allow_modified_option
@json_option
def check(spec, only, store, index_url, offline, nightly_source, repo, as_version, strict, allow_modified, as_json):
    """Dry-run the patch series on the pristine files of ENGINE@VERSION (no install, no GPU)."""
    _run("check", as_json, lambda: check_cmd.check(
        parse_spec(spec), Store.open(store), _ctx(index_url, offline, nightly_source, repo, as_version),
        options_from(strict, allow_modified), only=only))


def _target_command(name: str, help_text: str):
    def decorate(f):
        f = json_option(f)
        f = wait_option(f)
        f = source_options(f)
        f = target_option(f)
        f = python_option(f)
        f = click.argument("spec")(f)
        return main.command(name=name, help=help_text)(f)
    return decorate


@_target_command("apply", "Apply the series to the installed engine (or --target DIR), all or nothing.")
@store_option
@strict_option
@allow_modified_option
@click.option("--install", is_flag=True, help="pip-install the named version (or nightly) first.")
@click.option("--keep-going", is_flag=True, help="Apply the patches that apply even if others conflict.")
@click.option("--dry-run", is_flag=True, help="Report what would happen; write nothing.")
@click.option("--force", is_flag=True, help="Apply even if patched files were changed by hand since.")
def apply(spec, python, target_dir, index_url, offline, nightly_source, repo, as_version, wait, as_json,
          store, strict, allow_modified, install, keep_going, dry_run, force):
    _run("apply", as_json, lambda: apply_cmd.apply(
        parse_spec(spec), Store.open(store), _ctx(index_url, offline, nightly_source, repo, as_version),
        options_from(strict, allow_modified), python=python, target_dir=target_dir, install=install,
        keep_going=keep_going, dry_run=dry_run, wait=wait, force=force))


@_target_command("ensure", "Idempotent apply for ExecStartPre=: no-op when intact, re-apply after an upgrade.")
@store_option
@strict_option
@allow_modified_option
def ensure(spec, python, target_dir, index_url, offline, nightly_source, repo, as_version, wait, as_json,
           store, strict, allow_modified):
    _run("ensure", as_json, lambda: ensure_cmd.ensure(
        parse_spec(spec), Store.open(store), _ctx(index_url, offline, nightly_source, repo, as_version),
        options_from(strict, allow_modified), python=python, target_dir=target_dir, wait=wait))


@_target_command("status", "What is applied, and whether patched files changed since (e.g. wiped by pip).")
def status(spec, python, target_dir, index_url, offline, nightly_source, repo, as_version, wait, as_json):
    _run("status", as_json, lambda: status_cmd.status(
        parse_spec(spec), _ctx(index_url, offline, nightly_source, repo, as_version),
        python=python, target_dir=target_dir))


@_target_command("revert", "Restore every patched file byte for byte.")
@click.option("--force", is_flag=True, help="Restore files even if they changed since they were patched.")
def revert(spec, python, target_dir, index_url, offline, nightly_source, repo, as_version, wait, as_json, force):
    _run("revert", as_json, lambda: revert_cmd.revert(
        parse_spec(spec), _ctx(index_url, offline, nightly_source, repo, as_version),
        python=python, target_dir=target_dir, force=force, wait=wait))


@main.command(name="list")
@click.argument("spec", required=False)
@store_option
@json_option
def list_(spec, store, as_json):
    """The series, and which variant would be chosen for ENGINE@VERSION and why."""
    def run():
        ref = parse_spec(spec) if spec else None
        version = ref.version if ref and ref.kind == "exact" else None
        return list_cmd.list_patches(Store.open(store), ref.engine.name if ref else None, version)
    _run("list", as_json, run)


@main.command()
@click.argument("spec")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@click.option("--full", is_flag=True, help="Write the whole patched package, not only the patched files.")
@store_option
@source_options
@strict_option
@allow_modified_option
@json_option
def export(spec, dest, full, store, index_url, offline, nightly_source, repo, as_version, strict, allow_modified, as_json):
    """Write the patched files (or with --full the patched package) of ENGINE@VERSION to DEST."""
    _run("export", as_json, lambda: export_cmd.export(
        parse_spec(spec), dest, Store.open(store), _ctx(index_url, offline, nightly_source, repo, as_version),
        options_from(strict, allow_modified), full=full))


@main.command()
@store_option
@json_option
def lint(store, as_json):
    """Validate the store: schema, pinned hashes, that every variant parses, sane ranges."""
    _run("lint", as_json, lambda: lint_cmd.lint(Store.open(store)))


@main.command()
@store_option
@json_option
def pin(store, as_json):
    """Record the sha256 of every variant file in series.yaml (after reviewing them)."""
    _run("pin", as_json, lambda: lint_cmd.pin(Store.open(store)))


@main.command()
@click.argument("spec")
@click.option("--patch", "only", multiple=True, help="Only these patches.")
@click.option("--tier", type=click.Choice(["cpu", "gpu", "serve"]), default="cpu", show_default=True,
              help="serve: validate a running engine; needs --serve URL or --start CMD.")
@python_option
@store_option
@source_options
@json_option
@serve_options
def smoke(spec, only, tier, python, store, index_url, offline, nightly_source, repo, as_version, as_json, **serve):
    """Run the patches' smoke checks against the patched tree of ENGINE@VERSION (cpu/gpu tiers),
    or validate a running engine (serve tier: --serve URL or --start CMD)."""
    if serve_requested(**serve):
        def run_serve():
            engine = parse_spec(spec).engine.name
            digest = patch_set_digest([Store.open(store).root / engine / "series.yaml"])
            return serve_smoke(engine, digest, progress=None if as_json else _notify, **serve)
        _run("smoke", as_json, run_serve)
        return
    if tier == "serve":
        _run("smoke", as_json, _serve_tier_without_server)
        return
    _run("smoke", as_json, lambda: smoke_cmd.smoke_checks(
        parse_spec(spec), Store.open(store), _ctx(index_url, offline, nightly_source, repo, as_version),
        only=only, tier=tier, python=python, notify=_notify))


@main.group(invoke_without_command=True)
@click.option("--engine", "engines", multiple=True, help="Only these engines (default: every engine in the store).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default="compat_matrix.yaml",
              show_default=True)
@click.option("--shard", help="I/N: only every N-th (engine, version) job, starting at I (CI fan-out).")
@click.option("--diff", "previous", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Compare with a previous matrix; exit 1 on a regression.")
@click.option("--markdown", type=click.Path(dir_okay=False, path_type=Path), help="Also write a Markdown table.")
@click.option("--html", "html_out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write a self-contained HTML page with the coloured grid.")
@click.option("--workers", type=int, default=4, show_default=True)
@click.option("--smoke", is_flag=True, help="Also run each patch's CPU smoke checks per version (slow).")
@click.option("--no-nightly", is_flag=True, help="Leave the nightly build out.")
@click.option("--version", "versions", multiple=True,
              help="Only these versions (e.g. to add smoke results for a few; merge with a full run).")
@python_option
@store_option
@source_options
@json_option
@click.pass_context
def matrix(click_ctx, engines, output, shard, previous, markdown, html_out, workers, smoke, no_nightly, versions,
           python, store,
           index_url, offline, nightly_source, repo, as_version, as_json):
    """Every patch x every release from the oldest any patch claims: compat_matrix.yaml."""
    if click_ctx.invoked_subcommand:
        return
    _run("matrix", as_json, lambda: matrix_cmd.run(
        Store.open(store), _ctx(index_url, offline, nightly_source, repo, as_version), engines=engines,
        output=output, shard=shard, previous=previous, markdown=markdown, workers=workers, smoke=smoke,
        python=python, nightly=not no_nightly, html=html_out, versions=versions))


@matrix.command(name="merge")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--markdown", type=click.Path(dir_okay=False, path_type=Path), help="Also write a Markdown table.")
@click.option("--html", "html_out", type=click.Path(dir_okay=False, path_type=Path), help="Also write the HTML grid.")
@json_option
def matrix_merge(inputs, output, markdown, html_out, as_json):
    """Merge shard outputs into one matrix (for a version in several inputs, the later input wins)."""
    _run("matrix-merge", as_json, lambda: matrix_cmd.merge(inputs, output, markdown, html_out))


@matrix.command(name="diff")
@click.argument("previous", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("current", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@json_option
def matrix_diff(previous, current, as_json):
    """Regressions and fixes between two matrices; exit 1 on a regression."""
    _run("matrix-diff", as_json, lambda: matrix_cmd.diff(previous, current))


@main.command()
@click.argument("engine")
@click.option("--onto", required=True, help="The new upstream version (or 'latest').")
@click.option("--from", "old", help="The old base (default: the newest variant base at or below --onto).")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path),
              help="Keep the replay repo and conflict worktrees here (default: a temporary directory).")
@click.option("--no-write", is_flag=True, help="Classify only; write no variant files.")
@python_option
@store_option
@source_options
@json_option
def rebase(engine, onto, old, workdir, no_write, python, store, index_url, offline, nightly_source, repo,
           as_version, as_json):
    """Carry the series onto a new version: unchanged, refreshed, conflict, upstreamed, obsolete."""
    def run():
        s = Store.open(store)
        ctx = _ctx(index_url, offline, nightly_source, repo, as_version)
        return rebase_cmd.rebase(engine, s, ctx, onto=onto, old=old, workdir=workdir, write=not no_write,
                                 verify=rebase_cmd.verify_with_smoke(s, ctx, python))
    _run("rebase", as_json, run)


@main.command(name="resolve")
@click.argument("engine")
@click.argument("workdir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--patch", "patch", required=True, help="The patch whose conflict worktree a person resolved.")
@click.option("--onto", required=True, help="The version the rebase was onto.")
@store_option
@json_option
def resolve_(engine, workdir, patch, onto, store, as_json):
    """Record a person's conflict resolution (versioned rerere) and write the new variant."""
    _run("resolve", as_json, lambda: rebase_cmd.resolve_conflict(engine, Store.open(store), workdir, patch, onto))


@main.command()
@click.argument("patch")
@click.option("--engine", required=True)
@click.option("--from", "good", required=True, help="A good release (or commit with --repo).")
@click.option("--to", "bad", required=True, help="A bad release (or commit with --repo).")
@click.option("--smoke", is_flag=True, help="Also run the patch's CPU smoke checks at each release.")
@python_option
@store_option
@source_options
@json_option
def bisect(patch, engine, good, bad, smoke, python, store, index_url, offline, nightly_source, repo, as_version, as_json):
    """Find the first release (or commit) where PATCH stops applying or its smoke fails."""
    def run():
        s = Store.open(store)
        ctx = _ctx(index_url, offline, nightly_source, repo, as_version)
        return rebase_cmd.bisect(patch, engine, s, ctx, good=good, bad=bad, repo=repo, version=as_version,
                                 smoke=rebase_cmd.smoke_gate(s, ctx, python) if smoke else None)
    _run("bisect", as_json, run)


@main.command()
@click.argument("engines", nargs=-1)
@store_option
@source_options
@json_option
def droppable(engines, store, index_url, offline, nightly_source, repo, as_version, as_json):
    """Evaluate drop_when rules on the newest release: which patches can be deleted."""
    _run("droppable", as_json, lambda: rebase_cmd.droppable(
        Store.open(store), _ctx(index_url, offline, nightly_source, repo, as_version), engines))


if __name__ == "__main__":
    main()
