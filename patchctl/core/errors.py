"""Every error class patchctl raises, in one place; each `PatchctlError` carries the documented exit
code the CLI returns and the `kind` of its JSON error document.

Exit codes (docs/commands.md, "Exit codes"; docs/json-schema.md):
0 ok · 1 a patch failed to apply (conflict, drift) · 2 usage or bad input · 3 environment (network,
permissions, missing engine, lock held) · 4 internal error: a bug in patchctl (kind `internal`; the
traceback is written to a crash log in the data dir) · 130 interrupted (Ctrl-C), at any moment.

The other classes here (not PatchctlError) are signals between modules that their callers turn into
one of the above; one that escapes is a bug, reported as an internal error.
"""

from __future__ import annotations

import errno as _errno
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # errors.py imports nothing of patchctl: an error carries plain data, never a payload's type
    import json as _json

    import yaml as _yaml

    class BoundsError(_json.JSONDecodeError, _yaml.YAMLError):  # made at run time by __getattr__, below
        path: tuple[Any, ...] | None

        def __init__(self, message: str, path: tuple[Any, ...] | None = None) -> None: ...


EXIT_OK = 0
EXIT_PATCH_FAILED = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3
EXIT_INTERNAL = 4
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a process Ctrl-C ended

# Where a crash log tells the user to report it; the same URL as pyproject.toml's [project.urls]
# (tests/test_errors.py holds them equal).
ISSUES_URL = "https://github.com/patchctl/patchctl/issues"


class PatchctlError(Exception):
    exit_code = EXIT_USAGE
    kind = "error"

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(PatchctlError):
    exit_code = EXIT_USAGE
    kind = "usage"


class StoreError(PatchctlError):
    """The patch store is malformed or a patch was tampered with."""

    exit_code = EXIT_USAGE
    kind = "store"


class EnvironmentProblem(PatchctlError):
    exit_code = EXIT_ENVIRONMENT
    kind = "environment"


class NetworkError(EnvironmentProblem):
    kind = "network"


class AnswerTooLarge(NetworkError):
    """An answer past its limit (a range longer than asked, a page or download past its cap): exit 3."""


# What a resolver, socket or git says, in words a user can act on (the raw text stays available
# to anyone who runs the command with the network they have).
_PLAIN = (
    (
        re.compile(
            r"Could not resolve host|Failed to resolve|NameResolutionError|Name or service not known|"
            r"Temporary failure in name resolution|nodename nor servname"
        ),
        "its host name does not resolve here (no DNS or no network)",
    ),
    (re.compile(r"Connection refused"), "the connection was refused"),
    (re.compile(r"timed out|Timeout", re.I), "the connection timed out"),
    (re.compile(r"(?:CERTIFICATE_VERIFY_FAILED|SSL)"), "its TLS certificate could not be verified"),
)


def plain_network_reason(text: str) -> str:
    """'its host name does not resolve here ...' for a DNS failure, and so on; the text itself
    (shortened) when it is none of the usual ones."""
    for pattern, words in _PLAIN:
        if pattern.search(text):
            return words
    return text.strip().splitlines()[-1][:200] if text.strip() else "unknown network error"


class PatchFailed(PatchctlError):
    exit_code = EXIT_PATCH_FAILED
    kind = "patch-failed"


class InternalError(PatchctlError):
    """An exception nobody anticipated (a bug): the CLI's catch-all reports it with this code and kind."""

    exit_code = EXIT_INTERNAL
    kind = "internal"


# --- the tree (patchctl/tree/) ---


class Planted(EnvironmentProblem):
    """Something patchctl would have to follow or read is not what it made: a link, a FIFO, a device,
    a folder owned by another user. Refused (exit 3, error kind `environment`), nothing read or
    written through it."""


class StateDamaged(EnvironmentProblem):
    """The record or the journal cannot be trusted: patchctl does not guess what it did."""

    kind = "state-damaged"


class RollbackPending(EnvironmentProblem):
    """An interrupted write that cannot be undone yet (exit 3): the journal is kept, and the next
    command finishes the rollback. errno: what stopped it, so the hint can say what to fix."""

    def __init__(self, message: str, *, errno: int | None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.errno = errno


def write_hint(errno: int | None) -> str:
    """What to do about a write into the tree that failed with `errno`, in words (the start of a
    hint): a permission error is not a full disk."""
    if errno in (_errno.EACCES, _errno.EPERM):
        return (
            "give the user running patchctl write permission on the file or folder named (or run "
            "patchctl as the owner of the environment)"
        )
    if errno == _errno.EROFS:
        return "make the file system writable (remount it read-write)"
    return "free space (or fix the disk)"


class RecordUnmet(EnvironmentProblem):
    """A patch the tree's record lists as applied, or the store it came from, is gone: `ensure` never
    starts a server with a recorded patch missing (exit 3); changing the set is an explicit `apply`."""

    kind = "record-unmet"


# --- writing files (patchctl/core/atomic.py) ---


class WriteError(OSError):
    """A failed write_atomic: errno, strerror (the reason) and filename (the path written) as any
    OSError; its message reads `cannot write PATH: REASON`."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"


# --- reading from the network and from archives (patchctl/sources/) ---


class RangeNotSupported(Exception):
    """The server answered a Range request with the whole file (200): the caller reads it whole."""


class ZipFormatError(ValueError):
    """The bytes are not the zip the central directory promised (a truncated or tampered artifact)."""


# --- a served engine (patchctl/validate/) ---


class ServerStartError(EnvironmentProblem):
    """The server exited, or did not get ready in time; carries its log tail (exit code 3)."""


class RequestFailed(RuntimeError):
    """One request of validate's client got no usable answer (refused, reset, cut short): a failed
    request's record or a failed check reports it; NetworkError is only for a server that never answered."""


class HTTPError(RequestFailed):
    """The server answered a request of validate's client with an error status (400 or more)."""


class RequestDeadline(RequestFailed):
    """A request's deadline passed; `answered`: whether the server's status line came before it."""

    def __init__(self, message: str, answered: bool):
        super().__init__(message)
        self.answered = answered


class ServerError(RuntimeError):
    """The server put an error object into the stream instead of a chunk."""


class TruncatedStream(RuntimeError):
    """The stream stopped before the server said it was done."""


class BadServerReply(RuntimeError):
    """The server broke the protocol or a limit: an event or reply that is not what an OpenAI-compatible
    server sends (not JSON, `choices` not a list, `content` not a string, ...), an SSE line or a whole
    reply past its cap. validate names the request and the event, and exits 3 (the server, not the
    command, is wrong)."""


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


class CacheFileDamaged(Exception):
    """A cache file that is not what patchctl writes there: a symlink, a FIFO, too large, ... Not a
    PatchctlError: the artifact cache catches it and fetches again (online) or says why (offline)."""

    def __init__(self, path: Path, why: str):
        super().__init__(f"cache file {path} {why}")
        self.path = path
        self.why = why


# --- container images (patchctl/image/) ---


class ImageRefError(UsageError):
    """An image reference that cannot be read (`REGISTRY/REPO:TAG`, `@sha256:…`, `oci:DIR[:TAG]`): exit 2."""

    kind = "image-reference"


class RegistryError(EnvironmentProblem):
    """The registry could not be reached, refused the login, has no such tag or answered with a
    manifest of a type patchctl does not read: exit 3, with the registry's own answer in the message."""

    kind = "registry"


class BlobMismatch(RegistryError):
    """A blob whose bytes are not its digest (or not the manifest's size): refused, exit 3."""

    def __init__(self, message: str, digest: str):
        super().__init__(
            message,
            hint="the copy is damaged or was changed after its digest was taken: fetch "
            "the image again (skopeo copy, or pull it from its registry)",
        )
        self.digest = digest


class LayerDamaged(Exception):
    """The layer's compressed stream or tar is broken (the caller checks the digest first, then says so)."""


class ImageContentError(EnvironmentProblem):
    """The image does not hold what the command needs: no tree of the engine in its layers, or two
    (exit 3: the image, not the command line, is wrong)."""

    kind = "image"


def __getattr__(name: str) -> Any:
    """`BoundsError` (patchctl/core/yamlio.py: a document past a bound) is both a json.JSONDecodeError and a
    yaml.YAMLError, so every reader's existing handler names the file. Importing yaml costs ~11 ms
    that `--help` and most commands never pay, so the class is made here on first use (PEP 562)."""
    if name != "BoundsError":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import json

    import yaml

    class BoundsError(json.JSONDecodeError, yaml.YAMLError):
        """A document past one of yamlio's bounds; str() is what is wrong, with where when it is known."""

        def __init__(self, message: str, path: tuple[Any, ...] | None = None):
            ValueError.__init__(self, message)
            self.msg, self.doc, self.pos, self.lineno, self.colno = message, "", 0, 0, 0
            self.path = path  # the value's keys and indices from the top, when the document was loaded

        def __reduce__(self) -> tuple[Any, ...]:
            return type(self), (self.msg, self.path)

    BoundsError.__qualname__ = "BoundsError"  # pickled and shown as patchctl.core.errors.BoundsError
    globals()["BoundsError"] = BoundsError
    return BoundsError
