"""The download cache: the one module that knows its on-disk layout, its format version and how an
older layout becomes the current one (no other module builds a path under the cache).

Layout (format 3):

    <cache>/
      FORMAT                         "3": the layout below; an older cache is migrated on first use
      index/<index-url-key>/<project>.json      index pages (schema-checked on read; each records its
                                                URL, whose validators count only for that URL, and
                                                only in a file `written_by_us`)
      tails/<project>.json                      how much of a wheel's tail its file list needed
      artifacts/<claimed-sha256>-<url-key>/     what range reads of one artifact URL gave, as the
          central-directory.bin                 index served it (keyed by the URL *and* the hash the
          record.sha256                         index claimed: never served for another URL)
          RECORD                                the wheel's RECORD, which proves the members (proof.py)
          members/<path-key>[.absent]
          artifact, artifact.sha256             (an index without hashes: the whole wheel as fetched,
                                                its members checked against RECORD, never shared)
      verified/<sha256>/                        a whole artifact whose sha256 was checked against the
          artifact, artifact.verified, names.json   index's: content-addressed, shared by every URL
          RECORD, members/<path-key>[.absent]       and members taken from it (verified bytes, each
                                                    checked against RECORD when read)
      trees/<sha256 | git-COMMIT>/pristine, patched-<digest>/   smoke trees
      envs/<profile>-<digest>/                  smoke venvs
      git/<repo-key>/                           partial bare clones

Formats before 3 kept range-read bytes under the claimed hash alone (served later against any index)
and compiled schema validators as code (<cache>/validators/, executed): migrating drops both, and
moves a nightly's URL-keyed folder (`artifacts/url-<sha256 of the URL>`) to its new name.

Every read of a cache file is `read_file`: no symlink followed (neither the file nor a folder between
it and the cache root), a regular file only (a FIFO would hang, a device never end), and a bounded
size. What fails that is `Damaged`: callers fetch again online and say how to refresh offline.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from patchctl.core import nofollow
from patchctl.core.atomic import TEMP_NAME, write_atomic
from patchctl.core.errors import CacheFileDamaged as Damaged
from patchctl.core.errors import EnvironmentProblem
from patchctl.sources import scratch

FORMAT = 3
FORMAT_FILE = "FORMAT"

# The largest small cache file (a member, a file list, a page, a tail estimate) read into memory:
# vLLM's largest Python member is ~1 MB, its central directory ~600 KB.
SMALL_FILE_LIMIT = 64 << 20
# A whole artifact, where the index gives no size (vLLM's wheels: ~300-500 MB).
ARTIFACT_LIMIT = 8 << 30

_NOFOLLOW = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def url_key(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:16]


def member_key(path: str) -> str:
    return hashlib.sha256(path.encode()).hexdigest()[:32]


class ArtifactCache:
    """The cache rooted at `root` (config.cache_dir()), migrated to FORMAT on first use."""

    _migrated: set[Path] = set()
    _migrate_lock = threading.Lock()

    def __init__(self, root: Path):
        self.root = Path(root)
        self._migrate()

    # where each kind of file lives ----------------------------------------------------------
    def index_page(self, index_url: str, project: str) -> Path:
        key = re.sub(r"[^A-Za-z0-9]+", "_", index_url)[-80:]
        return self.root / "index" / key / f"{project}.json"

    def tails(self, project: str) -> Path:
        return self.root / "tails" / f"{project}.json"

    def unverified(self, url: str, claimed_sha256: str | None) -> Path:
        """The folder of what range reads of `url` gave (and an unhashed index's whole artifact)."""
        return self.root / "artifacts" / f"{claimed_sha256 or 'unhashed'}-{url_key(url)}"

    def unverified_of(self, claimed_sha256: str) -> list[Path]:
        """Every URL's range-read folder of an artifact an index claimed to have this sha256 (for
        measurements of the cache; a read goes through `unverified`, by URL)."""
        folder = self.root / "artifacts"
        return sorted(folder.glob(f"{claimed_sha256}-*")) if folder.is_dir() else []

    def verified(self, sha256: str) -> Path:
        """The folder of a whole artifact checked against the index's sha256, and what was taken from it."""
        return self.root / "verified" / sha256

    def tree(self, key: str) -> Path:
        """trees/<key>/: an artifact's sha256, or `git-<commit>`."""
        return self.root / "trees" / key

    def env(self, name: str) -> Path:
        return self.root / "envs" / name

    def git_clone(self, repo: str) -> Path:
        return self.root / "git" / hashlib.sha256(repo.encode()).hexdigest()[:16]

    # reading and writing, without following what someone else planted -----------------------
    def read_file(self, path: Path, limit: int = SMALL_FILE_LIMIT) -> bytes | None:
        """The bytes of a cache file; None when it does not exist. Damaged when it is not a regular
        file reached without a symlink, or is larger than `limit`."""
        with self.open_file(path, limit) as f:
            return None if f is None else f.read(limit + 1)

    def read_owned(self, path: Path, limit: int = SMALL_FILE_LIMIT) -> tuple[bytes | None, bool]:
        """`read_file`, and whether the file is one only the running user (or root) could have
        written (`written_by_us`, asked of the descriptor read, so a name swapped after the check is
        not what was checked)."""
        with self.open_file(path, limit) as f:
            if f is None:
                return None, False
            return f.read(limit + 1), written_by_us(os.fstat(f.fileno()))

    @contextmanager
    def open_file(self, path: Path, limit: int = ARTIFACT_LIMIT) -> Iterator[BinaryIO | None]:
        fd = self._open(path)
        if fd is None:
            yield None
            return
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise Damaged(path, f"is {size} bytes, more than the {limit} patchctl writes there")
            yield f

    def exists(self, path: Path) -> bool:
        """Whether a regular cache file is there (a symlink or a FIFO in its place: Damaged)."""
        fd = self._open(path)
        if fd is None:
            return False
        os.close(fd)
        return True

    def is_dir(self, path: Path) -> bool:
        """Whether `path` is a real folder of the cache (a symlink in its place: Damaged)."""
        fd = self._open_dir(path.relative_to(self.root).parts, create=False)
        if fd is None:
            return False
        os.close(fd)
        return True

    def write(self, path: Path, data: bytes, *, durable: bool = False) -> None:
        """Replace a cache file; its folders are made real folders first (a symlink planted in place
        of one is removed, not written through)."""
        self.make_dirs(path.parent)
        with scratch.writing():  # a Ctrl-C's exit waits for it: its temp file is not left behind
            write_atomic(path, data, durable=durable)

    def sweep(self, folder: Path) -> list[str]:
        """Remove the temporary files a killed patchctl left in `folder` (a part file, write_atomic's
        temp file), returning their names: only regular files with one link, owned by this user,
        named as patchctl names them after a pid that is not running here, untouched for
        scratch.STALE_AFTER seconds. Nothing is followed: the folder is opened as `_open` opens one,
        and a link or another user's file in the cache is left where it is."""
        try:
            fd = self._open_dir(folder.relative_to(self.root).parts, create=False)
        except (Damaged, OSError):
            return []
        if fd is None:
            return []
        removed = []
        try:
            for name in os.listdir(fd):
                m = scratch.PART_NAME.match(name) or TEMP_NAME.match(name)
                if not m or int(m.group(1)) == os.getpid() or scratch.alive(int(m.group(1))):
                    continue
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != os.geteuid():
                        continue
                    if time.time() - st.st_mtime < scratch.STALE_AFTER:
                        continue
                    nofollow.unlink_at(fd, name)  # a link swapped in since is removed itself, never followed
                    removed.append(name)
                except OSError:
                    continue
        finally:
            os.close(fd)
        return removed

    def make_dirs(self, folder: Path) -> None:
        fd = self._open_dir(folder.relative_to(self.root).parts, create=True)
        if fd is not None:
            os.close(fd)

    @contextmanager
    def building(self, entry: Path) -> Iterator[None]:
        """Held while one process builds an entry in place (a venv, an extracted tree): parallel test
        workers and matrix shards share the cache, and a second builder waits for the first instead of
        deleting its half-built tree. The lock file is opened in <cache>/locks/ following no link."""
        folder = self._open_dir(("locks",), create=True)
        if folder is None:
            raise EnvironmentProblem(f"cannot create {self.root / 'locks'}")
        try:
            name = f"{entry.parent.name}-{entry.name}.lock"
            fd = os.open(name, os.O_RDWR | os.O_CREAT | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644, dir_fd=folder)
        finally:
            os.close(folder)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def foreign(self, entry: Path) -> str | None:
        """Why code under `entry` (a smoke venv or tree, which patchctl runs) may not be trusted: None
        when the cache root and every folder down to entry is a real folder (no link) owned by root or
        the running user that no one else may write (sticky folders aside: others cannot rename in
        them), else the first that fails, in words. The data files need no such check: every read of
        one verifies it; code is run before anything could verify it."""
        me = os.geteuid()
        parts = entry.relative_to(self.root).parts
        for folder in [self.root, *(self.root.joinpath(*parts[: i + 1]) for i in range(len(parts)))]:
            try:
                st = os.lstat(folder)
            except FileNotFoundError:
                return None  # nothing there to trust yet: it is built
            if not stat.S_ISDIR(st.st_mode):
                return f"{folder} is not a folder (a link or a file)"
            if st.st_uid not in (0, me):
                return f"{folder} belongs to uid {st.st_uid}, not to root or to you"
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
                return f"{folder} may be written by others (mode {stat.S_IMODE(st.st_mode):o})"
        return None

    def remove(self, path: Path) -> None:
        """Remove a cache file or folder; a symlink is removed itself, never what it points to."""
        try:
            if path.is_symlink() or not path.is_dir():
                path.unlink(missing_ok=True)
            else:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass

    def _open(self, path: Path) -> int | None:
        parts = path.relative_to(self.root).parts
        parent = self._open_dir(parts[:-1], create=False)
        if parent is None:
            return None
        try:
            # O_NONBLOCK: opening a FIFO for reading would wait for a writer.
            fd = os.open(parts[-1], os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK, dir_fd=parent)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise Damaged(path, "is a symlink (patchctl never writes one there)") from None
            if exc.errno in (errno.ENOTDIR, errno.EISDIR):
                raise Damaged(path, "is not a regular file") from None
            raise
        finally:
            os.close(parent)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise Damaged(path, "is not a regular file (a FIFO, a device or a folder)")
        os.set_blocking(fd, True)
        return fd

    def _open_dir(self, parts: tuple[str, ...], *, create: bool) -> int | None:
        """A descriptor of root/parts, each folder opened without following a symlink. None when one
        is missing (create=False); with create, missing ones are made and a planted symlink or file
        in place of one is removed first."""
        self.root.mkdir(parents=True, exist_ok=True) if create else None
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        except (FileNotFoundError, NotADirectoryError):
            return None
        for i, part in enumerate(parts):
            try:
                try:
                    child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        os.close(fd)
                        return None
                    try:
                        os.mkdir(part, 0o755, dir_fd=fd)
                    except FileExistsError:
                        pass  # another process made it
                    child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    where = self.root.joinpath(*parts[: i + 1])
                    if not create:
                        raise Damaged(where, "is not a folder (a symlink or a file in place of one)") from None
                    os.unlink(part, dir_fd=fd)  # planted: removed, never followed
                    os.mkdir(part, 0o755, dir_fd=fd)
                    child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW, dir_fd=fd)
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
            fd = child
        return fd

    # the format and its migrations ------------------------------------------------------------
    def _migrate(self) -> None:
        with ArtifactCache._migrate_lock:
            if self.root in ArtifactCache._migrated:
                return
            try:
                raw = self.read_file(self.root / FORMAT_FILE, limit=64)
            except Damaged:
                raw = None  # as if there were none: migrating is idempotent
            found = _parse_format(raw)
            if found is not None and found > FORMAT:
                raise EnvironmentProblem(
                    f"the cache {self.root} has format {found}, written by a newer patchctl (this one reads format {FORMAT})",
                    hint="upgrade patchctl, or set PATCHCTL_CACHE_DIR to another folder",
                )
            if found != FORMAT and self.root.is_dir():
                for step in _MIGRATIONS:
                    step(self)
            if found != FORMAT:
                try:
                    self.write(self.root / FORMAT_FILE, f"{FORMAT}\n".encode())
                except OSError:
                    pass  # a read-only cache: reads still check everything, the next writer migrates
            ArtifactCache._migrated.add(self.root)


def _parse_format(raw: bytes | None) -> int | None:
    try:
        return int(raw.decode().strip()) if raw else None
    except (UnicodeDecodeError, ValueError):
        return None


def _drop_validators(cache: ArtifactCache) -> None:
    """Formats 1-2: compiled validators kept as code in the cache, executed. Now in the package."""
    cache.remove(cache.root / "validators")


def _rekey_artifacts(cache: ArtifactCache) -> None:
    """Formats 1-2: artifacts/<claimed sha256>/ held range-read bytes under the hash alone (no URL):
    they cannot be attributed, so they go (read again by range, at a wheel's sparse cost). A whole
    artifact there is moved to verified/<sha256>/, where it is hashed again before its first use.
    artifacts/url-<sha256 of the URL>/ (an index without hashes) becomes unhashed-<its first 16>."""
    folder = cache.root / "artifacts"
    if folder.is_symlink() or not folder.is_dir():
        return
    for entry in list(folder.iterdir()):
        name = entry.name
        if entry.is_symlink() or not entry.is_dir():
            cache.remove(entry)
        elif re.fullmatch(r"[0-9a-f]{64}", name):
            whole = entry / "artifact"
            target = cache.verified(name)
            if whole.is_file() and not whole.is_symlink() and not target.exists():
                cache.make_dirs(target)
                os.replace(whole, target / "artifact")  # not marked: the first use hashes it
            cache.remove(entry)
        elif m := re.fullmatch(r"url-([0-9a-f]{64})", name):
            for stale in ("members", "central-directory.bin", "central-directory.json"):
                cache.remove(entry / stale)  # range reads: read again (RECORD checks them either way)
            target = folder / f"unhashed-{m.group(1)[:16]}"
            if target.exists():
                cache.remove(entry)
            else:
                os.replace(entry, target)


_MIGRATIONS = (_drop_validators, _rekey_artifacts)


def written_by_us(st: os.stat_result) -> bool:
    """Whether a cache file can only have been written by the user running patchctl or by root:
    owned by one of them, and neither its group nor others may write it. Another user of a shared
    cache can plant a file (or rewrite one they own, sha256 header and all) but cannot make one with
    this owner; a file that passes this is trusted as far as what it says about itself, whereas a
    file that does not is only data to be checked against something proven (issue 33)."""
    return st.st_uid in (os.geteuid(), 0) and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def framed(data: bytes) -> bytes:
    """A cache file that vouches for itself against damage: the sha256 of `data`, a newline, `data`
    (written through `write`, so that its folders are checked)."""
    return hashlib.sha256(data).hexdigest().encode() + b"\n" + data


def unframe(raw: bytes | None) -> bytes | None:
    """The data of a `framed` file; None when it is not what was written (truncated, damaged)."""
    if raw is None or raw[64:65] != b"\n":
        return None
    data = raw[65:]
    return data if hashlib.sha256(data).hexdigest().encode() == raw[:64] else None
