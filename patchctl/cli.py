"""The `patchctl` entry point: an ordered registry of commands (pip's commands_dict), imported lazily.

Each command lives in `patchctl/commands/<module>.py` and owns its parsing, run and rendering. Only
the command that runs is imported, and `--help` reads the summaries below, so `ensure` under systemd
and `patchctl --help` import none of the heavy libraries (requests, GitPython, rich, matplotlib).
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, NamedTuple

import click

from patchctl import __version__


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
        return importlib.import_module(f"patchctl.commands.{info.module}").command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        for title, commands in SECTIONS.items():
            with formatter.section(title):
                formatter.write_dl([(name, info.summary) for name, info in commands.items()])

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        try:
            rv = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as exc:
            # --json promises one document on stdout, also for a usage error click found.
            if "--json" in argv:
                from patchctl.documents import document, emit_json

                name = next((a for a in argv if a in COMMANDS), "patchctl")
                emit_json(document(name, exc.exit_code,
                                   error={"kind": "usage", "message": exc.format_message(), "hint": None}))
                sys.exit(exc.exit_code)
            if not standalone_mode:
                raise
            exc.show()
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            if not standalone_mode:
                raise
            click.echo("Aborted!", err=True)
            sys.exit(1)
        if standalone_mode:
            sys.exit(rv if isinstance(rv, int) else 0)
        return rv


@click.group(cls=Registry, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="patchctl")
def main() -> None:
    """Keep downstream patches to vLLM and SGLang alive across upstream releases.

    Exit codes: 0 ok, 1 a patch failed to apply, 2 usage or bad input, 3 environment.

    \b
    Start here:
      patchctl check vllm@latest            does the series apply to the newest vLLM?
      patchctl apply vllm                   patch the vLLM installed for python3
      patchctl COMMAND --help               every command's options and examples
    """


if __name__ == "__main__":
    main()
