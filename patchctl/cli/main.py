"""The `patchctl` entry point: an ordered registry of commands (pip's commands_dict), imported lazily.

Each command lives in `patchctl/cli/commands/<module>.py` and owns its parsing, run and rendering. Only
the command that runs is imported, and `--help` reads the summaries below, so `ensure` under systemd
and `patchctl --help` import none of the heavy libraries (requests, GitPython, rich, matplotlib).
"""

from __future__ import annotations

# First, before any import of weight: a Ctrl-C during the imports below (click alone takes ~30 ms)
# exits 130 with nothing printed, and once a command runs it is interrupt.py's safe KeyboardInterrupt.
from patchctl.cli import interrupt

interrupt.install()

import functools  # noqa: E402  (after the handler, on purpose)
import importlib  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from typing import Any, NamedTuple  # noqa: E402

import click  # noqa: E402

from patchctl import __version__  # noqa: E402
from patchctl.core.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE, PatchctlError  # noqa: E402


class CommandInfo(NamedTuple):
    module: str
    summary: str


# Workflow order: what a user does first comes first in --help.
SECTIONS: dict[str, dict[str, CommandInfo]] = {
    "Patch an engine": {
        "check": CommandInfo("check", "Dry-run the series on a release's pristine files (no install, no GPU)."),
        "apply": CommandInfo("apply", "Apply the series to an installed engine (or --target DIR), all or nothing."),
        "ensure": CommandInfo("ensure", "Idempotent apply for ExecStartPre=: no-op when intact."),
        "status": CommandInfo("status", "What is applied, and whether patched files changed since."),
        "revert": CommandInfo("revert", "Restore every patched file byte for byte."),
    },
    "Test": {
        "smoke": CommandInfo("smoke", "Run the patches' own checks against a patched release (cpu/gpu tiers)."),
        "validate": CommandInfo("validate", "Validate a running server: answers, coherence, throughput."),
        "export": CommandInfo("export", "Write a release's patched files (or whole package) to a directory."),
    },
    "Maintain the patch set": {
        "new": CommandInfo("new", "Turn hand edits of the installed engine into a new patch."),
        "diff": CommandInfo("diff", "Hand edits that belong to no patch, as a diff to the release."),
        "refresh": CommandInfo("refresh", "Rewrite a patch's variant from the edited tree (quilt refresh)."),
        "list": CommandInfo("list_patches", "The series, and which variant a version gets and why."),
        "show": CommandInfo("show", "One patch whole: why, upstream links, variant chosen, evidence, store."),
        "lint": CommandInfo("lint", "Validate the store: schema, pins, that every variant parses."),
        "pin": CommandInfo("pin", "Record the sha256 of every variant file in series.yaml."),
        "rebase": CommandInfo("rebase", "Carry the series onto a new upstream version."),
        "resolve": CommandInfo("resolve", "Record a person's conflict resolution and write the variant."),
        "bisect": CommandInfo("bisect", "Find the first release (or commit) where a patch breaks."),
        "droppable": CommandInfo("droppable", "Which patches' drop_when rules hold on the newest release."),
        "matrix": CommandInfo("matrix", "Every patch x every release: compat_matrix.yaml (and diff, merge)."),
    },
}
COMMANDS: dict[str, CommandInfo] = {name: info for section in SECTIONS.values() for name, info in section.items()}


class Registry(click.Group):
    """A group whose commands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        info = COMMANDS.get(name)
        if info is None:
            return None
        command: click.Command = importlib.import_module(f"patchctl.cli.commands.{info.module}").command
        if not any(p.name == "deployment" for p in command.params):  # every command takes it, once
            command.params.insert(0, _deployment_option())
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        for title, commands in SECTIONS.items():
            with formatter.section(title):
                formatter.write_dl([(name, info.summary) for name, info in commands.items()])

    def main(
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        entry = args is None  # the program itself (the console script), not a CliRunner in a test
        # A Ctrl-C during a command unwinds it (locks released, temp files removed) and lands below
        # as exit 130: in the program, raised only where Python can take it (interrupt.py); in a
        # program or test that invokes the CLI, Python's own KeyboardInterrupt.
        interrupt.running() if entry else interrupt.library()
        argv = list(sys.argv[1:] if args is None else args)
        exit = functools.partial(_exit, entry=entry)
        try:
            rv = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        except SystemExit:  # a command's run_and_exit: its output written, the process ends
            if entry:
                interrupt.exiting()
            raise
        except click.ClickException as exc:
            # --json promises one document on stdout, also for a usage error click found.
            if "--json" in argv:
                from patchctl.cli.documents import document, emit_json

                emit_json(
                    document(
                        _command_name(argv), exc.exit_code, error={"kind": "usage", "message": exc.format_message(), "hint": None}
                    )
                )
                exit(exc.exit_code)
            if not standalone_mode:
                raise
            exc.show()
            exit(exc.exit_code)
        except click.exceptions.Abort as exc:
            # click turns a Ctrl-C (and end of input at a prompt) into Abort; neither is exit 1,
            # the code of a patch that failed.
            if not standalone_mode:
                raise
            if isinstance(exc.__cause__, KeyboardInterrupt):
                exit(EXIT_INTERRUPTED)
            click.echo("error: end of input where an answer was expected", err=True)
            exit(EXIT_USAGE)
        except KeyboardInterrupt:
            exit(EXIT_INTERRUPTED)
        except PatchctlError as exc:  # found while the command line is read: a bad deployment file
            if not standalone_mode:
                raise
            from patchctl.cli.commands.framework import failure_document, render_text
            from patchctl.cli.documents import emit_json

            doc, code = failure_document(_command_name(argv), exc)
            emit_json(doc) if "--json" in argv else render_text(doc, None)
            exit(code)
        except Exception as exc:  # a bug outside any command's run (parsing, a command's import)
            if not standalone_mode:
                raise
            from patchctl.cli.commands.framework import internal_error_document, render_text
            from patchctl.cli.documents import emit_json

            doc = internal_error_document(_command_name(argv), exc)
            emit_json(doc) if "--json" in argv else render_text(doc, None)
            exit(EXIT_INTERNAL)
        if standalone_mode:
            exit(rv if isinstance(rv, int) else 0)
        return rv


def _deployment_option() -> click.Option:
    """`--deployment FILE` on a command: read first (eager), it makes the file the command's default_map
    (patchctl/cli/deployment.py), so every option given on the command line still wins."""
    return click.Option(
        ["--deployment"],
        metavar="FILE",
        is_eager=True,
        expose_value=False,
        callback=_use_deployment,
        type=click.Path(dir_okay=False),
        help="The deployment file whose settings fill this command's options and ENGINE "
        "(also `patchctl --deployment FILE COMMAND` and $PATCHCTL_DEPLOYMENT; "
        "docs/configuration.md).",
    )


def _use_deployment(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """The command's own --deployment, else the group's, else $PATCHCTL_DEPLOYMENT. Nothing is imported
    when none is named: `ensure` without a deployment starts as fast as before."""
    path = value or ctx.meta.get(DEPLOYMENT_KEY) or os.environ.get("PATCHCTL_DEPLOYMENT")
    if not path or ctx.command is None:
        return
    from patchctl.cli import deployment

    used = deployment.load(path)  # a bad file: its UsageError, which Registry.main renders
    ctx.default_map = {**(ctx.default_map or {}), **used.defaults_for(ctx.command)}
    ctx.meta[DEPLOYMENT_KEY] = str(used.path)  # framework.run_and_exit names it in the document


def _group_deployment(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value:
        ctx.meta[DEPLOYMENT_KEY] = value


DEPLOYMENT_KEY = "patchctl.cli.deployment"  # in click's ctx.meta, which a command's context shares with the group's


def _command_name(argv: list[str]) -> str:
    return next((a for a in argv if a in COMMANDS), "patchctl")


def _exit(code: int, *, entry: bool) -> None:
    """sys.exit; in the program itself a Ctrl-C from here on (the output written, the interpreter
    shutting down) still ends it with 130 and no traceback, and an interrupted command ends at once:
    its worker threads are abandoned (not waited for) and the cache's temporary files removed."""
    if entry:
        if code == EXIT_INTERRUPTED:
            interrupt.stop(EXIT_INTERRUPTED, at_exit=True)
        interrupt.exiting()
    sys.exit(code)


@click.group(cls=Registry, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="patchctl")
@click.option(
    "--deployment",
    metavar="FILE",
    expose_value=False,
    callback=_group_deployment,
    type=click.Path(dir_okay=False),
    help="A deployment file for the command that follows (also COMMAND --deployment FILE, $PATCHCTL_DEPLOYMENT).",
)
def main() -> None:
    """Keep downstream patches to vLLM and SGLang alive across upstream releases.

    Exit codes: 0 ok, 1 a patch failed to apply, 2 usage or bad input, 3 environment,
    4 internal error (a bug: a crash log names where to report it), 130 interrupted.

    \b
    Start here:
      patchctl check vllm@latest            does the series apply to the newest vLLM?
      patchctl apply vllm                   patch the vLLM installed for python3
      patchctl COMMAND --help               every command's options and examples
    """


interrupt.imported()

if __name__ == "__main__":
    main()
