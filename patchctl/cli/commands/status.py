"""`patchctl status`: what is applied to a target, and whether its patched files changed since."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from patchctl.cli.commands.framework import patchctl_command
from patchctl.cli.image_options import ImageOptions, image_options
from patchctl.cli.options import WAIT, target_options
from patchctl.sources.spec import parse_spec

if TYPE_CHECKING:
    from patchctl.cli.commands.text import Console
    from patchctl.tree.find import TargetSpec


def run(spec: str, where: TargetSpec, *, wait: float = 30.0) -> tuple[dict, int]:
    from patchctl.cli.tree_documents import status_document
    from patchctl.tree import service
    from patchctl.tree.find import find_target

    return status_document(service.status(find_target(parse_spec(spec), where), wait=wait))


def build_line(build: dict | None) -> str | None:
    """`vllm 0.23.1.dev12+g1234abcd5 (commit 1234abcd5) from <URL>, installed with uv`."""
    if not build:
        return None
    line = build["version"] + (f" (commit {build['commit']})" if build.get("commit") else "")
    if build.get("url"):
        line += f" from {build['url']}"
    if build.get("sha256"):
        line += f", sha256 {build['sha256']}"
    if build.get("installer"):
        line += f", installed with {build['installer']}"
    return line


def render(doc: dict, out: Console, err: Console) -> None:
    line = build_line(doc.get("build"))
    if line:
        out.print(f"patched build: {doc['engine']} {line}", markup=False, highlight=False)
    chosen = selection_line(doc.get("selection"))
    if chosen:
        out.print(f"chosen: {chosen}", markup=False, highlight=False)
    for p in doc.get("applied", []):
        if p.get("store"):
            out.print(
                f"  {p['name']}: {p['variant'] or '-'} from {p['store']['path']} ({p['store']['kind']})",
                markup=False,
                highlight=False,
            )
    for f in doc.get("files", []):
        out.print(f"  {f['status']:<9} {f['path']}", markup=False, highlight=False)


def selection_line(selection: dict | None) -> str | None:
    """`only a, b` / `every patch except c`; None for every patch of the series."""
    if not selection or (selection["patches"] is None and not selection["exclude"]):
        return None
    text = "only " + ", ".join(selection["patches"]) if selection["patches"] is not None else "every patch"
    return text + (f" except {', '.join(selection['exclude'])}" if selection["exclude"] else "")


@patchctl_command(
    "status",
    render=render,
    example=(
        "patchctl status vllm                         the vLLM installed for python3",
        "patchctl status sglang --target ./site-packages --json",
    ),
)
@click.argument("spec", metavar="ENGINE")
@target_options
@click.option(
    "--wait", type=WAIT, default=30.0, show_default=True, help="Seconds to wait for another patchctl working on the same target."
)
@image_options(writes=False)
def command(spec: str, where: TargetSpec, wait: float, image: ImageOptions | None) -> tuple[dict, int]:
    """What is applied, and whether patched files changed since (e.g. wiped by pip).

    Also lists hand edits: .py files that differ from the dist-info RECORD and belong to no patch
    (`patchctl new ENGINE NAME` turns them into one); they do not change the exit code.
    """
    if image:
        from patchctl.cli import image_command

        return image_command.status(spec, image, wait=wait)
    return run(spec, where, wait=wait)
