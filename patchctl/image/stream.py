"""A layer as patchctl reads it: the blob hashed against its digest as it streams and cut at the size
the manifest gives (a blob changed in place, even at the same size, is refused before anything read
out of it is used), the tar inside inflated up to a cap, and the whole read of an image's layers
under one deadline that a layer inflating for ever cannot extend. Nothing here holds a layer in
memory."""

from __future__ import annotations

import gzip
import hashlib
import io
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING

from patchctl.core.errors import BlobMismatch, ImageContentError, LayerDamaged

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

    from patchctl.sources.files import ProgressSink

# Reading the layers (after any download, which has its own deadline per request) may take --timeout
# plus their compressed size at this rate: a loaded 2-core machine inflates and scans ~50 MB/s of
# tar, so real layers (2-4:1) need about a quarter of it, incompressible ones a twelfth.
READ_RATE = 4 << 20
# A layer may inflate to INFLATE_RATIO times its compressed size, and always to INFLATE_FLOOR; never
# past MAX_INFLATED. Image layers inflate 2-4:1 (source and libraries); a gigabyte of zeros deflates
# 1000:1, the sign of a decompression bomb.
INFLATE_RATIO = 200
INFLATE_FLOOR = 1 << 30
MAX_INFLATED = 256 << 30
_CHUNK = 1 << 20


def inflate_limit(size: int) -> int:
    return min(MAX_INFLATED, max(INFLATE_FLOOR, INFLATE_RATIO * size))


class Deadline:
    """One deadline for a read of an image's layers: --timeout, plus their compressed size at
    READ_RATE. Time spent downloading a blob is not counted (each request has its own deadline)."""

    def __init__(self, total_size: int):
        from patchctl.sources import http

        self.timeout = http.TIMEOUT
        self.seconds = http.TIMEOUT + total_size / READ_RATE
        self._end = time.monotonic() + self.seconds

    @contextmanager
    def paused(self) -> Iterator[None]:
        began = time.monotonic()
        try:
            yield
        finally:
            self._end += time.monotonic() - began

    def check(self, where: Callable[[], str]) -> None:
        if time.monotonic() > self._end:
            raise ImageContentError(
                f"{where()}: reading the image's layers passed its deadline of {self.seconds:.0f} s (--timeout "
                f"{self.timeout:g} s, plus their compressed size at {READ_RATE >> 20} MiB/s)",
                hint="a layer that inflates to far more than it weighs, or a very slow disk; pass a larger "
                "--timeout SECONDS to wait longer",
            )


class Position:
    """What the reader is at, for messages: the layer and the tar entry last begun."""

    def __init__(self, layer: str):
        self.layer = layer
        self.entry = ""

    def __str__(self) -> str:
        return f"{self.entry} (layer {self.layer})" if self.entry else f"layer {self.layer}"


class VerifiedBlob(io.RawIOBase):
    """The blob's bytes from an open file, hashed as they are read; more than `size` bytes is refused
    as it happens, and `verify()` reads what the tar reader left and checks size and digest."""

    def __init__(
        self, raw: IO[bytes], digest: str, size: int, shown: str, deadline: Deadline, at: Position, progress: ProgressSink | None
    ):
        self._raw = raw
        self._hash = hashlib.sha256()
        self.digest, self.size, self.count = digest, size, 0
        self._shown = shown
        self._deadline = deadline
        self._at = at
        self._progress = progress

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        # One byte past the size is asked for: a longer blob is caught without reading the rest.
        data = self._raw.read(min(len(view), self.size - self.count + 1, _CHUNK))
        view[: len(data)] = data
        self.count += len(data)
        self._hash.update(data)
        if self.count > self.size:
            raise BlobMismatch(
                f"{self._shown}: blob {self.digest} is longer than the {self.size} bytes the manifest says: refusing it",
                self.digest,
            )
        if self._progress is not None and data:
            self._progress.advance(len(data))
        self._deadline.check(lambda: str(self._at))
        return len(data)

    def verify(self) -> None:
        """The rest of the blob read (within its size and the deadline), then size and digest checked."""
        buffer = bytearray(_CHUNK)
        while self.readinto(buffer):
            pass
        got = "sha256:" + self._hash.hexdigest()
        if self.count != self.size or got != self.digest:
            raise BlobMismatch(
                f"{self._shown}: blob {self.digest} does not have its digest: its {self.count} bytes "
                f"(the manifest says {self.size}) hash to {got}: refusing it",
                self.digest,
            )


class Inflated(io.RawIOBase):
    """The tar inside a layer: gunzipped when the blob is gzip, at most `limit` bytes, each read
    under the deadline."""

    def __init__(self, blob: IO[bytes], gzipped: bool, limit: int, deadline: Deadline, at: Position):
        self._source: IO[bytes] | gzip.GzipFile = gzip.GzipFile(fileobj=blob, mode="rb") if gzipped else blob
        self.limit, self.count = limit, 0
        self._deadline = deadline
        self._at = at

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        try:
            data = self._source.read(min(len(view), _CHUNK))
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise LayerDamaged(str(exc) or "truncated") from None
        view[: len(data)] = data
        self.count += len(data)
        if self.count > self.limit:
            raise ImageContentError(
                f"{self._at}: the layer inflates to more than {self.limit} bytes, the most patchctl inflates of a "
                f"layer ({INFLATE_RATIO}× its compressed size, at least {INFLATE_FLOOR >> 20} MiB, at most "
                f"{MAX_INFLATED >> 30} GiB)",
                hint="a decompression bomb, or a file of zeros stored whole (a sparse file): rebuild the image without it",
            )
        self._deadline.check(lambda: str(self._at))
        return len(data)
