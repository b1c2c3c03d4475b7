"""The one interface the apply engine reads upstream files through."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple, Protocol

from patchctl.core.paths import resolve_inside


class _ProvenanceFields(NamedTuple):
    kind: str  # "wheel", "sdist", "installed", "git", "directory"
    description: str  # e.g. the artifact file name, a path, a commit
    sha256: str | None = None  # of the artifact, when there is one
    bytes_fetched: int = 0
    # More keys for the document's `source`, only where they apply (a nightly build's version and
    # commit, "index_sha256": None with "verified_by": "RECORD" for an index that publishes no hash).
    details: tuple[tuple[str, object], ...] = ()


class Provenance(_ProvenanceFields):
    __slots__ = ()

    def _asdict(self) -> dict:  # noqa: D102
        out: dict[str, object] = {k: v for k, v in zip(self._fields, self, strict=True) if k != "details"}
        out.update(self.details)
        return out


class FileSource(Protocol):
    def read(self, path: str) -> bytes | None:
        """Bytes of a file relative to the import root, or None when the file does not exist."""

    def prefetch(self, paths: Iterable[str]) -> None:
        """Fetch several files at once (one progress display, batched requests)."""

    def provenance(self) -> Provenance: ...


class ProgressSink(Protocol):
    def start(self, label: str, total: int | None) -> None: ...

    def advance(self, amount: int) -> None: ...

    def finish(self) -> None: ...


class NoProgress:
    def start(self, label: str, total: int | None) -> None:
        pass

    def advance(self, amount: int) -> None:
        pass

    def finish(self) -> None:
        pass


class DirectorySource:
    """A tree on disk whose import root is `root` (site-packages, a checkout, an unpacked sdist)."""

    def __init__(self, root: Path, kind: str = "directory", description: str | None = None):
        self.root = Path(root)
        self._kind = kind
        self._description = description or str(root)

    def read(self, path: str) -> bytes | None:
        """The file `path` of the tree, reached beneath the root (nofollow.read_beneath): a link is
        followed only inside the tree, a FIFO or a device is refused (exit 3), never a hang."""
        from patchctl.core.nofollow import read_beneath

        resolve_inside(self.root, path)  # refuses `..`, absolute and escaping names
        return read_beneath(self.root, path)

    def prefetch(self, paths: Iterable[str]) -> None:
        pass

    def provenance(self) -> Provenance:
        return Provenance(self._kind, self._description)
