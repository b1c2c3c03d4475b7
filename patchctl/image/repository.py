"""Which Repository a reference opens: an OCI layout directory for `oci:DIR`, a registry otherwise."""

from __future__ import annotations

from typing import TYPE_CHECKING

from patchctl.image.layout import LayoutRepository
from patchctl.image.reference import ImageRef
from patchctl.image.registry import RegistryRepository, Repository

if TYPE_CHECKING:
    from patchctl.sources.files import ProgressSink


def open_repository(
    ref: ImageRef, *, insecure: bool = False, progress: ProgressSink | None = None, create: bool = False
) -> Repository:
    """create: a layout directory that does not exist yet is made (a --to target)."""
    if ref.layout is not None:
        return LayoutRepository(ref.layout, create=create)
    return RegistryRepository(ref, insecure=insecure, progress=progress)
