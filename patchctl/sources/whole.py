"""A release's whole artifact in the download cache, proven on the descriptor it is read from (split
out of release.py, whose ReleaseSource it is a part of): hashed against the index's sha256, unless this
user wrote it and the mark left when it was hashed still holds (issue 33, 3a)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from patchctl.core.errors import EnvironmentProblem
from patchctl.sources.cache import ARTIFACT_LIMIT, ArtifactCache, Damaged, written_by_us
from patchctl.sources.download import download
from patchctl.sources.files import ProgressSink
from patchctl.sources.index import IndexFile

# Where hashing an artifact again costs more than writing its mark (two fsyncs, ~16 ms here).
VERIFY_MARK_BYTES = 8 << 20


class WholeArtifact:
    """ReleaseSource's whole-artifact part: what it reads of the source, and the cache paths the
    source names (defined there)."""

    artifact: IndexFile
    cache: ArtifactCache
    offline: bool
    progress: ProgressSink
    bytes_fetched: int
    _how: set[str]
    _refetched: list[str]
    _artifact_key: str | None

    def _full_file(self) -> Path:
        raise NotImplementedError

    def _fetched_digest_file(self) -> Path:
        raise NotImplementedError

    def _verified_file(self) -> Path:
        raise NotImplementedError

    def _damaged(self, exc: Damaged) -> None:
        raise NotImplementedError

    def _read_text(self, path: Path) -> str | None:
        raise NotImplementedError

    def _need_network(self, what: str) -> None:
        raise NotImplementedError

    def download_full(self) -> Path:
        """The whole artifact in the cache, proven on the descriptor it will be read from (kept for
        open_artifact): fetched when there is none, or when what is there is not what its sha256
        says (removed and fetched again online, and the document says so; offline, exit 3)."""
        target = self._full_file()
        self._release_held()
        held = self._proven_artifact(target)
        if held is None:
            self._download(target)
            held = self._proven_artifact(target)
        if held is None:
            raise EnvironmentProblem(
                f"cache file {target} was replaced while patchctl read it",
                hint="run again; if it recurs, someone else writes the cache: set PATCHCTL_CACHE_DIR to a folder of your own",
            )
        self._held = held
        return target

    _held: BinaryIO | None = None  # the artifact as download_full proved it, for open_artifact

    def _release_held(self) -> None:
        if self._held is not None:
            self._held.close()
            self._held = None

    def _proven_artifact(self, target: Path) -> BinaryIO | None:
        """The cached artifact opened (no link followed) and proven: hashed against the index's sha256
        (an unhashed index: the digest recorded at its download), unless this user (or root) wrote it,
        no one else may write it, and its size, mtime and inode are still those recorded when it was
        hashed (the mark, itself written by this user; or this run's own hash). Another user's file,
        or a mark anyone else could write, proves nothing: the bytes are hashed (issue 33, 3a)."""
        expected = self.artifact.sha256 or self._read_text(self._fetched_digest_file())
        f: BinaryIO | None = None
        try:
            with self.cache.open_file(target, self.artifact.size or ARTIFACT_LIMIT) as opened:
                if opened is None or expected is None:
                    return None
                # Kept open past the with: duplicated, so that leaving it closes only the original.
                f = os.fdopen(os.dup(opened.fileno()), "rb")
        except Damaged as exc:
            self._damaged(exc)
            return None
        st = os.fstat(f.fileno())
        key = _stat_key(st, expected)
        if written_by_us(st) and key in (self._artifact_key, self._own_mark()):
            return f
        digest = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
        if digest.hexdigest() == expected:
            f.seek(0)
            self._mark_verified(st, key)
            return f
        f.close()
        why = f"does not match the sha256 {expected} it is kept under"
        if self.offline:
            raise EnvironmentProblem(
                f"cache file {target} {why}: it was changed after patchctl wrote it",
                hint="run once without --offline to fetch it again",
            )
        self.cache.remove(target)
        self._refetched.append(f"cache file {target} {why}: fetched again")
        return None

    def _own_mark(self) -> str | None:
        try:
            raw, ours = self.cache.read_owned(self._verified_file(), limit=4096)
        except Damaged as exc:
            self._damaged(exc)
            return None
        try:
            return raw.decode().strip() if raw and ours else None
        except UnicodeDecodeError:
            return None

    def _download(self, target: Path) -> None:
        self._need_network("the artifact")
        self.cache.make_dirs(target.parent)
        self.cache.sweep(target.parent)  # what an earlier, killed download of it left

        def count(n: int) -> None:
            self._how.add("whole")
            self.bytes_fetched += n

        digest = download(
            self.artifact.url,
            target,
            filename=self.artifact.filename,
            expected_sha256=self.artifact.sha256,
            size=self.artifact.size,
            progress=self.progress,
            count=count,
        )
        self._how.add("whole")
        if self.artifact.sha256 is None:
            # Nothing to compare with: RECORD checks the members read from it; the digest is recorded.
            self.cache.write(self._fetched_digest_file(), digest.encode(), durable=True)
        # Hashed as it streamed: the file this run just renamed into place needs no second pass
        # (_proven_artifact still asks that it be the same file, by inode, and written by this user),
        # and its mark spares the next run one.
        st = os.lstat(target)
        self._mark_verified(st, _stat_key(st, digest))

    @contextmanager
    def open_artifact(self) -> Iterator[BinaryIO]:
        """The whole artifact (downloaded and checked first), the very descriptor that was proven."""
        self.download_full()
        f, self._held = self._held, None
        if f is None:  # download_full returns only with a proven file held
            raise EnvironmentProblem(f"cache file {self._full_file()} could not be proven")
        with f:
            yield f

    def _mark_verified(self, st: os.stat_result, key: str) -> None:
        self._artifact_key = key
        # Only where hashing again costs more than the write (VERIFY_MARK_BYTES). And only over a
        # file of this user's: a mark proves nothing of a file someone else may rewrite.
        if st.st_size >= VERIFY_MARK_BYTES and written_by_us(st) and self._own_mark() != key:
            self.cache.write(self._verified_file(), key.encode(), durable=True)


def _stat_key(st: os.stat_result, sha256: str) -> str:
    return f"{st.st_size} {st.st_mtime_ns} {st.st_ino} {sha256}"
