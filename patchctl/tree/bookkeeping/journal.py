"""The write-ahead journal that makes every multi-file write to a tree recoverable, and the bytecode
stash that lets revert leave a file exactly as pip installed it (its mtime and its .pyc files).

A write (write_files) stages every new content as a blob, writes journal.json (what each file was and
becomes, and the record before), replaces the files one by one, saves the new record, and removes the
journal. A journal found afterwards (recover) means the write was interrupted: every file in it is put
back as it was, the old record restored, and temp files of dead processes swept. Each step of the
undo is idempotent: an undo that stops is started again by the next command. Every step calls
steps.reached(), where tests kill the process to prove it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from patchctl.core.atomic import TEMP_NAME, write_atomic_at
from patchctl.core.errors import EnvironmentProblem, PatchctlError, RollbackPending, StateDamaged, write_hint
from patchctl.core.nofollow import folder_beneath, lstat_beneath, open_dir, parent_beneath, stat_beneath, unlink_at
from patchctl.tree.bookkeeping import steps, upgrade
from patchctl.tree.bookkeeping.place import Place
from patchctl.tree.bookkeeping.record import Change, StateRecord, sha256


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_at(dir_fd: int) -> list[str]:
    removed: list[str] = []
    try:
        names = os.listdir(dir_fd)
    except OSError:
        return removed
    for name in names:
        m = TEMP_NAME.match(name)
        if m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
            try:
                os.unlink(name, dir_fd=dir_fd)  # the temp file (or a link planted under its name), never a target
                removed.append(name)
            except OSError:
                pass
    return removed


def capture(place: Place, rel: str) -> tuple[int | None, tuple[tuple[str, str], ...]]:
    """The file's mtime and its .pyc files (stashed as blobs), to put back when it is restored."""
    place.inside(rel, place.state_file)
    st = lstat_beneath(place.root, rel)
    if st is None:
        return None, ()
    stashed = []
    for pyc in _bytecode_of(place.root, rel):
        data = place.read_tree(pyc, place.state_file)
        if data is not None:
            stashed.append((pyc, place.put_blob(data)))
    return st.st_mtime_ns, tuple(stashed)


def write_files(place: Place, changes: list[Change], new_record: StateRecord | None) -> None:
    """Replace files under the root all-or-nothing, then save new_record."""
    entries: list[dict[str, Any]] = []  # journal.json entries
    for c in changes:
        mtime, bytecode = capture(place, c.path)
        entries.append(
            {
                "path": c.path,
                "before": None if c.before is None else place.put_blob(c.before),
                "after": None if c.after is None else place.put_blob(c.after),
                "before_mtime_ns": mtime,
                "before_bytecode": [list(b) for b in bytecode],
                "after_mtime_ns": c.after_mtime_ns,
                "after_bytecode": [list(b) for b in c.after_bytecode],
            }
        )
    raw = place.read("state.json")
    previous = None if raw is None else raw.decode("utf-8", errors="surrogateescape")
    journal = {"entries": entries, "previous_state": previous, "pid": os.getpid()}
    place.write("journal.json", upgrade.write_journal(journal))
    steps.reached("journal")
    try:
        for n, e in enumerate(entries, start=1):
            replace_file(place, e["path"], e["after"], e["after_mtime_ns"], e["after_bytecode"])
            steps.reached(f"file:{n}")
        place.save(new_record)
        steps.reached("state")
    except OSError as exc:
        _roll_back_after(place, exc)
    place.unlink("journal.json")


def _roll_back_after(place: Place, exc: OSError) -> None:
    cause = exc.strerror or str(exc)
    failed_at = exc.filename or "a file"
    try:
        recover(place)
    except (OSError, PatchctlError) as again:
        files = ", ".join(e["path"] for e in _journal_entries(place))
        why = getattr(again, "strerror", None) or getattr(again, "message", None) or str(again)
        # What stopped the rollback says what to fix (a permission, not space, for EACCES).
        stopped = again.errno if isinstance(again, (OSError, RollbackPending)) else exc.errno
        raise EnvironmentProblem(
            f"cannot write {failed_at}: {cause}; rolling back failed too ({why}). The journal {place.journal_file} "
            f"is kept: {files} may be patched or pristine",
            hint=f"{write_hint(stopped)}, then run `patchctl status` on this target: it finishes the rollback "
            f"to the previous state",
        ) from None
    raise EnvironmentProblem(
        f"cannot write {failed_at}: {cause}; rolled back, nothing was changed", hint=write_hint(exc.errno)
    ) from None


def _journal_entries(place: Place) -> list[dict[str, Any]]:
    try:
        return _read_journal(place)["entries"]
    except (PatchctlError, OSError):
        return []


def _read_journal(place: Place) -> dict[str, Any]:
    raw = place.read("journal.json")
    if raw is None:
        raise StateDamaged(f"{place.journal_file} vanished while being read", hint=place.way_out)
    body = upgrade.read_journal(raw, place.journal_file, place.way_out)
    for e in body["entries"]:
        place.inside(e["path"], place.journal_file)
        for pyc, _ in list(e["before_bytecode"]) + list(e["after_bytecode"]):
            place.inside(pyc, place.journal_file)
    return body


def _sweep(place: Place) -> None:
    """Temp files of dead processes in every bookkeeping folder patchctl writes into."""
    with place.folders() as f:
        if f is None:
            return
        _sweep_at(f.top)  # .gitignore's
        _sweep_at(f.dir)  # state.json's, journal.json's
        blobs = open_dir(f.dir, "blobs", place.blobs, owners=f.owners)
        if blobs is not None:
            try:
                _sweep_at(blobs)
            finally:
                os.close(blobs)


def recover(place: Place) -> bool:
    """Undo an interrupted write and sweep temp files of dead processes; True when there was one."""
    _sweep(place)
    if not place.exists("journal.json"):
        return False
    journal = _read_journal(place)
    # Every folder the interrupted write can have written into: the files' and their bytecode's.
    written: set[str] = set()
    for e in journal["entries"]:
        place.inside(e["path"], place.journal_file)
        parent = os.path.dirname(e["path"])
        written |= {parent, f"{parent}/__pycache__"}
        for pyc, _ in list(e["before_bytecode"]) + list(e["after_bytecode"]):
            place.inside(pyc, place.journal_file)
            written.add(os.path.dirname(pyc))
    for folder in sorted(written):
        with folder_beneath(place.root, folder) as fd:
            if fd is not None:
                _sweep_at(fd)
    try:
        for e in reversed(journal["entries"]):
            if _current_digest(place, e["path"]) == e["before"]:
                # The bytes are back (or were never replaced); a rollback stopped before the end
                # may still owe the mtime or the bytecode: without them the .pyc beside it is stale.
                _finish(place, e["path"], e["before"], e["before_mtime_ns"], e["before_bytecode"])
                continue
            replace_file(place, e["path"], e["before"], e["before_mtime_ns"], e["before_bytecode"])
        if journal["previous_state"] is None:
            place.unlink("state.json")
        else:
            place.write("state.json", journal["previous_state"].encode("utf-8", errors="surrogateescape"))
    except OSError as exc:
        # Every step above is idempotent: the next command's recovery starts it again.
        raise RollbackPending(
            f"an interrupted write to {place.root} cannot be rolled back yet: {exc}; the journal "
            f"{place.journal_file} is kept ({', '.join(e['path'] for e in journal['entries'])})",
            errno=exc.errno,
            hint=f"{write_hint(exc.errno)}, then run `patchctl status` on this target",
        ) from None
    place.unlink("journal.json")
    return True


def _current_digest(place: Place, rel: str) -> str | None:
    return sha256(place.read_tree(rel, place.journal_file))


def replace_file(place: Place, rel: str, blob: str | None, mtime_ns: int | None, bytecode: Iterable[Iterable[str]]) -> None:
    """The file `rel` made `blob`'s bytes (None: removed), with its bytecode and mtime. Every step is
    relative to the descriptor of the file's folder (nofollow.parent_beneath: reached from the
    tree's root, following no link out of it), and the last name itself is never followed: the
    new file is renamed over whatever is there (a link is replaced, not written through)."""
    place.inside(rel, place.journal_file)
    target = place.root / rel
    data = None if blob is None else place.blob(blob)
    with ExitStack() as opened:
        try:
            folder, name = opened.enter_context(parent_beneath(place.root, rel, create=data is not None))
        except FileNotFoundError:
            if data is None:
                return  # its folder is gone: nothing to remove, no bytecode beside it
            raise
        if data is None:
            unlink_at(folder, name)
        else:
            try:
                st = os.stat(name, dir_fd=folder, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    # A link inside the tree: the file it names gives the mode, not the link's own
                    # 0777 (followed only inside the tree; one that leads out gives nothing).
                    st = stat_beneath(place.root, rel) or st
                if stat.S_ISREG(st.st_mode):
                    mode, owner = st.st_mode & 0o7777, (st.st_uid, st.st_gid)
                else:
                    mode, owner = 0o644, None
            except FileNotFoundError:
                mode, owner = 0o644, None
            # A new inode (rename over): hardlinked installs (uv's cache) are never written through.
            write_atomic_at(folder, name, data, mode=mode, owner=owner, shown=str(target))
            # The mtime at once, before the bytecode: a .pyc is valid only beside the mtime it was
            # compiled from, and a write stopped in __pycache__ (EACCES, a full disk) must not
            # leave the source with a new one.
            if mtime_ns is not None:
                os.utime(name, ns=(mtime_ns, mtime_ns), dir_fd=folder, follow_symlinks=False)
    _put_bytecode(place, rel, bytecode)


def _put_bytecode(place: Place, rel: str, bytecode: Iterable[Iterable[str]]) -> None:
    """The module's .pyc files removed, and `bytecode` ((path, blob) pairs) put in their place."""
    for pyc in _bytecode_of(place.root, rel):
        place.inside(pyc, place.journal_file)
        with parent_beneath(place.root, pyc) as (cache, pyc_name):
            unlink_at(cache, pyc_name)
    for pyc, digest in bytecode:
        place.inside(pyc, place.journal_file)
        with parent_beneath(place.root, pyc, create=True) as (cache, pyc_name):
            write_atomic_at(cache, pyc_name, place.blob(digest), shown=str(place.root / pyc))
        steps.reached("bytecode")


def _finish(place: Place, rel: str, blob: str | None, mtime_ns: int | None, bytecode: Iterable[Iterable[str]]) -> None:
    """For a file that already holds `blob`'s bytes: the mtime and the bytecode _put would have left
    beside it, where they differ (a rollback that stopped after the source was written). Reads
    only, when nothing differs: recovery of an entry the interrupted write never reached."""
    place.inside(rel, place.journal_file)
    if blob is not None and mtime_ns is not None:
        try:
            with parent_beneath(place.root, rel) as (folder, name):
                st = os.stat(name, dir_fd=folder, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_mtime_ns != mtime_ns:
                    os.utime(name, ns=(mtime_ns, mtime_ns), dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            pass
    wanted = {pyc: digest for pyc, digest in bytecode}
    now = {pyc: sha256(place.read_tree(pyc, place.journal_file)) for pyc in _bytecode_of(place.root, rel)}
    if now != wanted:
        _put_bytecode(place, rel, wanted.items())


def _bytecode_of(root: Path, rel: str) -> list[str]:
    """The .pyc files of a module (every interpreter and optimisation level), relative to root; its
    __pycache__ listed through its descriptor (reached as every tree file is: nofollow.folder_beneath)."""
    if not rel.endswith(".py"):
        return []
    folder, name = os.path.split(rel)
    cache = f"{folder}/__pycache__" if folder else "__pycache__"
    stem = name[: -len(".py")]
    with folder_beneath(root, cache) as fd:
        names = [] if fd is None else os.listdir(fd)
    return sorted(
        f"{cache}/{n}"
        for n in names
        if n.startswith(stem + ".") and n.endswith(".pyc") and "/" not in n and not TEMP_NAME.match(n)
    )
