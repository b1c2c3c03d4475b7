"""The layers stacked as a container runtime stacks them, with damage refused. A later entry
replaces an earlier one, `.wh.NAME` deletes NAME, `.wh..wh..opq` empties a folder of what lower
layers put there; the files a filter wants are written out to a staging folder. Damage is refused
rather than read as "obsolete": a FIFO, a device, a link or a folder where a wanted file is, a
whiteout deleting a patched file, or one deleting the engine's package while its dist-info stays. A
damaged path is remembered until a later entry mends it (the same file again: what the runtime
would show) and is an error (exit 3, naming the path and the layer) when the stack ends damaged.
Every layer is hashed against its digest, inflated within a cap and read under one deadline
(stream.py); what is written out is capped per file and in total."""

from __future__ import annotations

import errno
import io
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, NamedTuple

from patchctl.core.errors import EnvironmentProblem, ImageContentError, LayerDamaged, RegistryError
from patchctl.image.stream import Deadline, Inflated, Position, VerifiedBlob, inflate_limit

if TYPE_CHECKING:
    from patchctl.image.manifest import Layer
    from patchctl.image.registry import Repository
    from patchctl.sources.files import ProgressSink

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
# A file patchctl reads out of a layer is source or its own record: past this it is not one.
MAX_FILE = 64 << 20
# All that one read of an image's layers writes out to its staging folder: the files a series
# touches with their bytecode (a few MB), the dist-info METADATA and the `.patchctl/` record.
MAX_STAGED = 1 << 30
_CHUNK = 1 << 20
_KINDS = {
    tarfile.SYMTYPE: "symlink",
    tarfile.LNKTYPE: "hard link",
    tarfile.FIFOTYPE: "FIFO",
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.DIRTYPE: "folder",
}


class Meta(NamedTuple):
    """What a tar entry said about a file or folder (kept so the new layer writes it back alike)."""

    mode: int
    uid: int
    gid: int
    uname: str
    gname: str
    mtime: float


class Staged(NamedTuple):
    """The image's files that were read, as the top of the stack shows them."""

    folder: Path  # the staging folder: <folder>/<image path>
    files: dict[str, Meta]  # image path → its entry's metadata (the files written under folder)
    dirs: dict[str, Meta]  # every folder entry seen, for the new layer's parent folders
    layers_read: int


class Want(NamedTuple):
    """What read_layers reads out of the layers, and where it refuses damage."""

    read: Callable[[str], bool]  # image paths written out to the staging folder
    # A patched file: deleting it by a whiteout (and not putting it back) is damage, never "obsolete".
    protected: Callable[[str], bool] = lambda name: False
    packages: tuple[str, ...] = ()  # the engine's package folders: deleting one, its dist-info kept, is damage
    engine_dist_info: Callable[[str], str | None] = lambda name: None  # its import root, for the engine's METADATA


def clean_name(name: str) -> str | None:
    """A tar member's path as an image path without a leading ./ or /; None when it leaves the
    root (`..`): such entries are never written out."""
    path = name.lstrip("/")
    while path.startswith("./"):
        path = path[2:]
    path = path.rstrip("/")
    parts = PurePosixPath(path).parts if path else ()
    if ".." in parts or "\0" in path:
        return None
    return "/".join(parts)


def _under(name: str, folder: str, *, itself: bool) -> bool:
    """name lies in folder ('' is the root); itself: the folder's own path counts."""
    if not folder:
        return True
    return name.startswith(folder + "/") or (itself and name == folder)


class Stack:
    """One read of an image's layers into a staging folder."""

    def __init__(self, folder: Path, want: Want, own: frozenset[int]):
        self.folder = folder
        self.want = want
        self.own = own
        self.files: dict[str, Meta] = {}
        self.dirs: dict[str, Meta] = {}
        self.from_own: set[str] = set()  # files patchctl's own layers wrote: deleting them later is damage too
        self.damage: dict[str, tuple[int, str]] = {}  # path → (layer number, what is wrong), until mended
        self.packages: dict[str, int] = {}  # the engine's package folders seen → the first layer holding one
        self.gone: dict[str, tuple[int, str]] = {}  # package folders deleted or replaced, until put back
        self.staged = 0
        self._layer_files: set[str] = set()  # staged from the layer being read: its own whiteouts spare them
        self._parents: set[str] | None = None  # the folders above staged files (None: to be worked out again)

    def read(self, repo: Repository, layers: list[Layer], progress: ProgressSink | None) -> Staged:
        deadline = Deadline(sum(layer.size for layer in layers))
        for number, layer in enumerate(layers, 1):
            at = Position(f"{number} of {len(layers)}, {layer.digest[:19]}…")
            if progress is not None:
                progress.start(f"layer {number}/{len(layers)}", layer.size)
            try:
                with ExitStack() as held:
                    with deadline.paused():  # a download has its own deadline per request
                        raw = held.enter_context(repo.open_blob(layer.digest, layer.size))
                    blob = VerifiedBlob(raw, layer.digest, layer.size, repo.name, deadline, at, progress)
                    self._layer(number, layer, blob, deadline, at)
            finally:
                if progress is not None:
                    progress.finish()
        self._finish()
        return Staged(self.folder, self.files, self.dirs, len(layers))

    def _layer(self, number: int, layer: Layer, blob: VerifiedBlob, deadline: Deadline, at: Position) -> None:
        self._layer_files = set()
        buffered = io.BufferedReader(blob, _CHUNK)
        magic = buffered.peek(4)[:4]
        if magic == b"\x28\xb5\x2f\xfd":
            raise RegistryError(
                f"layer {layer.digest[:19]}… is zstd-compressed ({layer.media_type}): patchctl reads tar and tar+gzip layers only"
            )
        inflated = Inflated(buffered, magic[:2] == b"\x1f\x8b", inflate_limit(layer.size), deadline, at)
        try:
            tar = tarfile.open(fileobj=io.BufferedReader(inflated, _CHUNK), mode="r|")
            try:
                for member in tar:
                    tar.members = []  # type: ignore[attr-defined]  # stream mode keeps every entry otherwise: memory would grow with their count
                    name = clean_name(member.name)
                    if name is not None:
                        at.entry = "/" + name
                        self._entry(number, tar, member, name, at)
            finally:
                tar.close()
            blob.verify()
        except (tarfile.TarError, LayerDamaged) as exc:
            blob.verify()  # a copy changed after its digest was taken says so first
            raise RegistryError(f"layer {layer.digest[:19]}… is damaged at {at.entry or 'its start'}: {exc}") from None

    # --- one tar entry ------------------------------------------------------------------------

    def _entry(self, number: int, tar: tarfile.TarFile, member: tarfile.TarInfo, name: str, at: Position) -> None:
        parent, _, base = name.rpartition("/")
        own = number - 1 in self.own
        if base == OPAQUE:
            self._delete(parent, number, f"an opaque whiteout ({at.entry}) in layer {at.layer}", own, opaque=True)
            return
        if base.startswith(WHITEOUT):
            target = f"{parent}/{base[len(WHITEOUT) :]}" if parent else base[len(WHITEOUT) :]
            self._delete(target, number, f"a whiteout ({at.entry}) in layer {at.layer}", own, opaque=False)
            return
        self._mend(name, number)
        kind = _KINDS.get(member.type, "regular file" if member.isfile() else "special file")
        if not member.isdir():
            self._replaces_folder(name, kind, number, at)
        meta = Meta(member.mode, member.uid, member.gid, member.uname, member.gname, member.mtime)
        if member.isdir():
            self.dirs[name] = meta
            if name in self.files:
                self._drop(name)
                self.damage[name] = (number, f"/{name} is a folder in layer {at.layer}, where a file is expected")
            return
        if not self.want.read(name):
            if name in self.files:  # a file here replaces what a lower layer had, even one not read out
                self._drop(name)
            return
        self._drop(name)
        if member.isfile():
            stream = tar.extractfile(member)
            assert stream is not None  # a regular file always has a stream
            self._stage(name, stream, member.size, at)
        elif member.islnk() and (clean_name(member.linkname) or "") in self.files:
            source = clean_name(member.linkname) or ""
            size = (self.folder / source).stat().st_size
            with open(self.folder / source, "rb") as stream:
                self._stage(name, stream, size, at)
        else:
            link = f" to {member.linkname}" if member.issym() or member.islnk() else ""
            self.damage[name] = (
                number,
                f"/{name} is a {kind}{link} in layer {at.layer}, where a regular file is "
                f"expected: patchctl patches regular files only",
            )
            return
        self.files[name] = meta
        self._parents = None
        if own:
            self.from_own.add(name)
        self._layer_files.add(name)

    def _mend(self, name: str, number: int) -> None:
        """An entry at name: what was wrong there before (from a lower layer) is replaced by it."""
        self.damage.pop(name, None)
        for folder in [f for f in self.gone if _under(name, f, itself=True)]:
            del self.gone[folder]
        padded = f"/{name}/"
        for package in self.want.packages:
            at = padded.find(f"/{package}/")
            if at >= 0:
                self.packages.setdefault(padded[1 : at + len(package) + 1], number)

    def _replaces_folder(self, name: str, kind: str, number: int, at: Position) -> None:
        """A file (or link, FIFO, ...) where a lower layer had a folder: the folder's content is gone."""
        if self._parents is None:
            self._parents = {str(p) for n in self.files for p in PurePosixPath(n).parents}
        inside = [n for n in self.files if n.startswith(name + "/")] if name in self._parents else []
        for n in inside:
            if self.want.protected(n) or n in self.from_own:  # asked before _drop forgets where it came from
                self.damage[n] = (
                    number,
                    f"/{n} is gone: /{name} is a {kind} in layer {at.layer}, where the folder holding it was",
                )
            self._drop(n)
        if self.packages.get(name, number) < number:
            self.gone[name] = (number, f"the engine's package /{name} is a {kind} in layer {at.layer}, where its folder was")

    def _delete(self, target: str, number: int, what: str, own: bool, *, opaque: bool) -> None:
        """A whiteout: target (an opaque one: what target holds) as lower layers left it is gone."""
        for n in [n for n in self.files if _under(n, target, itself=not opaque) and n not in self._layer_files]:
            if not own and (self.want.protected(n) or n in self.from_own):  # asked before _drop forgets
                self.damage[n] = (number, f"/{n} is deleted by {what}")
            self._drop(n)
        for n in [n for n, (k, _) in self.damage.items() if k < number and _under(n, target, itself=not opaque)]:
            if not own and self.want.protected(n):
                self.damage[n] = (number, f"/{n} is deleted by {what}")
            else:
                del self.damage[n]
        if own:
            return
        for folder, first in self.packages.items():
            if first < number and _under(folder, target, itself=not opaque):
                self.gone[folder] = (number, f"the engine's package /{folder} is deleted by {what}, while its dist-info stays")

    def _drop(self, name: str) -> None:
        if self.files.pop(name, None) is not None:
            (self.folder / name).unlink(missing_ok=True)
            self.from_own.discard(name)
            self._parents = None

    def _stage(self, name: str, stream: IO[bytes], size: int, at: Position) -> None:
        if size > MAX_FILE:
            raise ImageContentError(
                f"/{name} is {size} bytes in layer {at.layer}: more than patchctl reads of one file ({MAX_FILE})"
            )
        if self.staged + size > MAX_STAGED:
            raise ImageContentError(
                f"/{name} ({size} bytes, layer {at.layer}) would take what patchctl reads out of the image past "
                f"{MAX_STAGED} bytes, the most it stages for one read of an image",
                hint="an image whose engine folder or `.patchctl/` folders hold far more than source and "
                "patchctl's record; rebuild it without the extra files",
            )
        self.staged += size
        _place(self.folder, name, stream, at)

    def _finish(self) -> None:
        problems = [message for _, (_, message) in sorted(self.damage.items())]
        roots = {root for n in self.files if (root := self.want.engine_dist_info(n)) is not None}
        for folder, (_, message) in sorted(self.gone.items()):
            if folder.rpartition("/")[0] + "/" in roots or ("" in roots and "/" not in folder):
                problems.append(message)
        if problems:
            more = f" (and {len(problems) - 1} more: {'; '.join(problems[1:4])})" if len(problems) > 1 else ""
            raise ImageContentError(
                problems[0] + more + ": the image is damaged where the engine's files are expected, and patchctl "
                "patches nothing in it",
                hint="rebuild the image so that the engine's files are regular files",
            )


def _place(folder: Path, name: str, stream: IO[bytes], at: Position) -> None:
    dest = folder / name
    try:
        # An image path's folders become real folders here; a file in the way (a file an upper layer
        # turned into a folder) is replaced.
        here = folder
        for part in PurePosixPath(name).parts[:-1]:
            here = here / part
            if here.is_symlink() or (here.exists() and not here.is_dir()):
                here.unlink()
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.is_dir() and not dest.is_symlink():  # a folder of a lower layer that this file replaces
            shutil.rmtree(dest)
        out = open(dest, "wb", buffering=0)  # unbuffered: a failed write fails here, not again at close
    except OSError as exc:
        raise _staging_error(dest, name, at, exc) from None
    with stream, out:
        while chunk := stream.read(_CHUNK):
            view = memoryview(chunk)
            while view:
                try:
                    written = out.write(view)
                    if not written:
                        raise OSError(errno.EIO, "the file system took no bytes")
                except OSError as exc:
                    raise _staging_error(dest, name, at, exc) from None
                view = view[written:]


def _staging_error(dest: Path, name: str, at: Position, exc: OSError) -> EnvironmentProblem:
    return EnvironmentProblem(
        f"cannot write /{name} (layer {at.layer}) to the staging folder: {dest}: {exc.strerror or exc}",
        hint=f"patchctl stages at most {MAX_STAGED} bytes of an image in the temporary folder "
        f"({tempfile.gettempdir()}); set TMPDIR to a folder with room",
    )
