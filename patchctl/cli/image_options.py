"""The command line's image flags, defined once: `--image REF` (with `--to REF2` for the commands
that write) and `--insecure`. They inject `image` (an ImageOptions, or None without --image) into
the command; the command's one `if image:` hands the work to patchctl/image/command.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import click

F = Callable[..., Any]


class ImageOptions(NamedTuple):
    ref: str
    to: str | None
    insecure: bool


def image_options(*, writes: bool) -> Callable[[F], F]:
    """writes: the command pushes a new image, so it takes --to."""

    def decorate(f: F) -> F:
        import functools

        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ref = kwargs.pop("image_ref")
            to = kwargs.pop("image_to", None)
            insecure = kwargs.pop("insecure")
            if ref is None:
                from patchctl.core.errors import UsageError

                if to is not None or insecure:
                    raise UsageError("--to and --insecure only mean something with --image REF")
                kwargs["image"] = None
            else:
                if writes and to is None:
                    from patchctl.core.errors import UsageError

                    raise UsageError(
                        "--image REF writes a new image: name it with --to REF2",
                        hint="e.g. --to registry.example/team/vllm:patched, or oci:DIR:TAG",
                    )
                kwargs["image"] = ImageOptions(ref, to, insecure)
            return f(*args, **kwargs)

        decorated: F = wrapper
        if writes:
            decorated = click.option(
                "--to", "image_to", metavar="REF2", help="With --image: the reference the patched image is pushed to."
            )(decorated)
        decorated = click.option(
            "--insecure",
            is_flag=True,
            help="With --image: talk plain HTTP to a registry that is not on this machine (loopback registries need no flag).",
        )(decorated)
        decorated = click.option(
            "--image",
            "image_ref",
            metavar="REF",
            help="A container image (REGISTRY/REPO:TAG, or oci:DIR:TAG) instead of an installed "
            "engine: read from its layers, no container daemon.",
        )(decorated)
        return decorated

    return decorate
