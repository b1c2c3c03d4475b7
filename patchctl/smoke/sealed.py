"""Seals on the smoke venvs and trees of the download cache, the only cache entries patchctl runs
code from. A `.complete` marker alone can be copied next to anything (issue 33, item 2: root ran a
venv planted in a cache another user owned). So the builder lists every entry it made in the marker
it writes last: type, mode and sha256 of each file, the target of each link. Before an entry is used,
the folders from the cache root down to it must be owned by root or the running user and writable by
no one else (`ArtifactCache.foreign`), and a walk that follows no link must find exactly what the
marker lists, every file owned likewise and writable by no one else. Anything else: rebuild, and the
output says why in one line.

Cost: hashing every file, measured on this project's 2-core CI machine: 2 000 files / 24 MB (a vLLM
tree) 0.10 s; the sglang-cpu smoke venv (55 000 entries, 2.6 GB, torch in it) 8.4 s. Every
`patchctl smoke` process would pay that, so the seal also keeps each file's stamp (device, inode,
ctime, size), and a file whose stamp is unchanged is not hashed again: the kernel sets ctime on every
change of content or metadata and a file's owner cannot set it back, so an unchanged stamp means the
same bytes. A copied env (new inodes) or a touched file is hashed in full. With stamps the sglang-cpu
venv checks in 0.43 s. Each entry is checked once per process."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

from patchctl.core.atomic import write_atomic
from patchctl.core.errors import EnvironmentProblem
from patchctl.core.yamlio import load_json
from patchctl.sources.cache import ArtifactCache, Damaged

MARKER = ".complete"
SEAL = "seal "  # the marker's last line: `seal <JSON of the listing>`
MAX_ENTRIES = 500_000  # a CUDA venv holds ~20 000 entries
_NOFOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_checked: set[tuple[Path, str]] = set()  # (entry, marker sha256): verified in this process


def _listing(root: Path, *, tighten: bool = False, known: dict[str, list] | None = None) -> tuple[dict[str, list], str | None]:
    """Every name under root (the marker aside), walked by descriptor, following no link: {relative
    path: [kind, mode, sha256 or link target]}; and the first entry not owned by root or the running
    user, or writable by others, in words (None: none). tighten (the builder): others' write bits
    are cleared first (a umask of 002 would otherwise make every build untrusted). known: a seal's
    listing, whose sha256 is taken for a file with the same stamp (the module's docstring says why).
    A file's entry is [kind, mode, sha256, stamp]; only the first three are compared."""
    me = os.geteuid()
    out: dict[str, list] = {}
    problem: str | None = None
    for dirpath, dirnames, filenames, dirfd in os.fwalk(root, follow_symlinks=False):
        rel_dir = os.path.relpath(dirpath, root)
        for name in sorted(dirnames + filenames):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if rel == MARKER:
                continue
            if len(out) >= MAX_ENTRIES:
                return out, f"{root} holds more than {MAX_ENTRIES} entries"
            st = os.lstat(name, dir_fd=dirfd)
            if tighten and not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                os.chmod(name, stat.S_IMODE(st.st_mode) & ~(stat.S_IWGRP | stat.S_IWOTH), dir_fd=dirfd)
                st = os.lstat(name, dir_fd=dirfd)
            if problem is None and st.st_uid not in (0, me):
                problem = f"{root / rel} belongs to uid {st.st_uid}"
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ["link", 0, os.readlink(name, dir_fd=dirfd)]
                continue
            if problem is None and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                problem = f"{root / rel} may be written by others (mode {stat.S_IMODE(st.st_mode):o})"
            if stat.S_ISDIR(st.st_mode):
                out[rel] = ["dir", stat.S_IMODE(st.st_mode), ""]
            elif stat.S_ISREG(st.st_mode):
                stamp = f"{st.st_dev}:{st.st_ino}:{st.st_ctime_ns}:{st.st_size}"
                was = (known or {}).get(rel)
                same = isinstance(was, list) and len(was) == 4 and was[0] == "file" and was[3] == stamp
                digest = was[2] if same and was is not None else _sha256_at(dirfd, name)
                out[rel] = ["file", stat.S_IMODE(st.st_mode), digest, stamp]
            else:
                out[rel] = ["other", stat.S_IMODE(st.st_mode), ""]  # a FIFO or a device: never read
    return out, problem


def _sha256_at(dirfd: int, name: str) -> str:
    fd = os.open(name, _NOFOLLOW, dir_fd=dirfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped since lstat: no match
            return ""
        digest = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
        return digest.hexdigest()
    finally:
        os.close(fd)


def seal(root: Path, head: str) -> None:
    """Write root's marker, last: `head` (what callers match on) and the listing of what was built."""
    listing, _ = _listing(root, tighten=True)
    body = head + SEAL + json.dumps(listing, sort_keys=True, separators=(",", ":")) + "\n"
    write_atomic(root / MARKER, body.encode(), mode=0o644)


def untrusted(cache: ArtifactCache, root: Path, head: str = "") -> str | None:
    """None when root may be used: its marker starts with `head` and carries a seal that the folder
    matches, and it and the folders above it are owned by root or the running user, writable by no
    one else. Otherwise why not, in one line ("not built" when there is no marker)."""
    try:
        raw = cache.read_file(root / MARKER)
    except Damaged as exc:
        return str(exc)
    if raw is None:
        return "not built"
    if not raw.startswith(head.encode()):
        return "built by another format"
    key = (root, hashlib.sha256(raw).hexdigest())
    if key in _checked:
        return None
    why = cache.foreign(root)
    if why:
        return why
    st = os.lstat(root / MARKER)
    if st.st_uid not in (0, os.geteuid()) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"its marker {root / MARKER} belongs to uid {st.st_uid} or may be written by others"
    text = raw.decode(errors="replace")
    line = text[text.rfind("\n", 0, len(text) - 1) + 1 :]
    if not line.startswith(SEAL):
        return "its marker lists no content (built before seals were kept, or copied)"
    try:
        sealed = load_json(line[len(SEAL) :])  # bounded: nesting, NUL bytes, numbers (a BoundsError is a ValueError)
    except ValueError:
        return "its marker's listing is damaged"
    if not isinstance(sealed, dict):
        return "its marker's listing is damaged"
    found, problem = _listing(root, known=sealed)
    if problem:
        return problem
    found, sealed = _compared(found), _compared(sealed)
    if found != sealed:
        return _difference(sealed, found)
    _checked.add(key)
    return None


def _compared(listing: dict) -> dict:
    """What must match: kind, mode and sha256 or link target (a stamp may change with no change)."""
    return {k: v[:3] if isinstance(v, list) else v for k, v in listing.items()}


def _difference(sealed: dict, found: dict) -> str:
    extra = sorted(set(found) - set(sealed))
    if extra:
        return f"{extra[0]} is there but was not built" + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
    missing = sorted(set(sealed) - set(found))
    if missing:
        return f"{missing[0]} was built but is gone" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
    changed = sorted(k for k in found if found[k] != sealed.get(k))
    kind, mode, _ = found[changed[0]]
    was = sealed[changed[0]]
    what = "its content" if kind == was[0] == "file" and mode == was[1] else f"{was[0]} {was[1]:o} -> {kind} {mode:o}"
    return f"{changed[0]} changed since it was built ({what})" + (f" (and {len(changed) - 1} more)" if len(changed) > 1 else "")


def usable(cache: ArtifactCache, root: Path, head: str, say: Callable[[str], None]) -> bool:
    """Whether root may be used as built; when it may not but exists, `say` is told why (one line),
    and it is removed for a rebuild. A folder above it that others control cannot be fixed by a
    rebuild: exit 3, naming it."""
    why = untrusted(cache, root, head)
    if why is None:
        return True
    if why != "not built" or os.path.lexists(root):
        above = cache.foreign(root.parent)
        if above:
            raise EnvironmentProblem(
                f"patchctl runs nothing from {root}: {above}",
                hint="set PATCHCTL_CACHE_DIR to a folder of yours (or root's) that others cannot write",
            )
        if why != "not built":
            say(f"rebuilding {root}: {why}")
    return False


def require(cache: ArtifactCache, root: Path, head: str) -> None:
    """After a build: what was just sealed must check (else another writer is at work): exit 3."""
    why = untrusted(cache, root, head)
    if why is not None:
        raise EnvironmentProblem(
            f"patchctl runs nothing from {root}: {why}",
            hint="set PATCHCTL_CACHE_DIR to a folder of yours (or root's) that others cannot write",
        )
