"""What patchctl did to a target, kept in the target itself: the state record, pristine backups, a
journal that makes every multi-file write recoverable, and one lock per target.

Layout under <import root>/.patchctl/<engine>/ (in the tree, so that every user, every
PATCHCTL_DATA_DIR and every bind mount of the same tree finds the same record and takes the same lock;
nothing there is importable, and a `.gitignore` keeps it out of a checkout's status):
  state.json    the applied-state record (absent: nothing applied), with the build it was applied
                to (`build`: version, commit, wheel URL or git+URL@SHA; records before 2026-12 lack it)
  blobs/<sha>   file contents by sha256: pristine backups, staged new contents, stashed bytecode
  journal.json  present only while files are being written; its presence after a crash means
                "undo everything in it"
  lock          flock'ed by the one process working on this target, never written (lock.py)

state.json and journal.json carry a sha256 over their content and are validated against their JSON
schemas (patchctl/core/schemas/state.json, journal.json); every path in them must stay inside the target.
A damaged one is an error naming the file and the way out, never trusted. Records written by
patchctl before 2026-12 under <data dir>/targets/<key>/ are moved here on first use.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any, NamedTuple

from patchctl.core.atomic import TEMP_NAME, write_atomic_at
from patchctl.core.errors import EnvironmentProblem, PatchctlError, RollbackPending, StateDamaged, write_hint
from patchctl.core.nofollow import (
    RECORD_LIMIT,
    Planted,
    exists_at,
    folder_beneath,
    lstat_beneath,
    open_dir,
    parent_beneath,
    read_at,
    read_beneath,
    stat_beneath,
    unlink_at,
)
from patchctl.core.paths import outside_packages, resolve_inside
from patchctl.core.yamlio import load_json
from patchctl.tree import folders, lock
from patchctl.tree.folders import crash_point as _crash_point

STATE_SCHEMA = "patchctl-state/3"
# Records this patchctl reads: /2 (before 2026-12-02) lacks each patch's store and fingerprint and
# the selection; read as "store unknown, every patch of the series" and written back as /3.
STATE_SCHEMAS = ("patchctl-state/2", STATE_SCHEMA)
JOURNAL_SCHEMA = "patchctl-journal/2"


def sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


class FileRecord(NamedTuple):
    path: str
    pristine_sha256: str | None  # None: the patch set created the file
    patched_sha256: str | None  # None: the patch set deleted the file
    pristine_mtime_ns: int | None = None  # restored by revert, so the bytecode below is valid again
    bytecode: tuple[tuple[str, str], ...] = ()  # (path, blob sha256) of the pristine file's .pyc files


class StoreRef(NamedTuple):
    """A store a record's patches came from: its folder, and `bundled` (the patch set shipped with
    patchctl, found again wherever patchctl is installed now) or `user` (a folder of the user's)."""

    path: str
    kind: str  # bundled | user

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> StoreRef | None:
        return None if data is None else cls(data["path"], data["kind"])


class PatchRecord(NamedTuple):
    name: str
    outcome: str
    variant: str | None
    store: StoreRef | None = None  # where the patch came from (None: a record before patchctl-state/3)
    sha256: str | None = None  # of the variant applied: its fingerprint

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "outcome": self.outcome, "variant": self.variant,
                "store": self.store._asdict() if self.store else None, "sha256": self.sha256}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PatchRecord:
        return cls(data["name"], data["outcome"], data["variant"], StoreRef.from_json(data.get("store")),
                   data.get("sha256"))


class Selection(NamedTuple):
    """Which patches of the series were chosen: `patches` (apply --patch; None: every patch of the
    series) less `exclude` (apply --exclude). Recorded, so `ensure` keeps the choice."""

    patches: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"patches": None if self.patches is None else list(self.patches), "exclude": list(self.exclude)}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Selection:
        if data is None:
            return cls()
        chosen = data.get("patches")
        return cls(None if chosen is None else tuple(chosen), tuple(data.get("exclude") or ()))

    @property
    def everything(self) -> bool:
        return self.patches is None and not self.exclude


class BuildRecord(NamedTuple):
    """Which build of the engine the patches were applied to: enough to tell one nightly from another.
    kind: `wheel` (a wheel URL from a wheel index: vLLM's nightlies), `git` (a commit built from its
    repository: SGLang's main), `release` (ENGINE==VERSION from the package index), `file` (a wheel or
    sdist on disk, ENGINE@file:PATH), `installed` (found installed, not installed by patchctl: what its
    dist-info says). The kinds of upstream
    (sources/kinds/) say which, in PinnedBuild.kind."""

    kind: str
    version: str
    commit: str | None = None  # from the local version (+g<sha>) or the git commit installed
    url: str | None = None  # what was installed from: the wheel's URL, git+URL@SHA, or direct_url.json's url
    artifact: str | None = None  # the wheel's file name
    sha256: str | None = None  # of the artifact, where patchctl fetched it whole (an index without hashes)
    record_sha256: str | None = None  # of the wheel's RECORD, where patchctl read it (the files it vouches for)
    index_url: str | None = None  # the index page the build was resolved from
    spec: str | None = None  # what was asked for: vllm@nightly, vllm@commit:SHA, sglang@git:main
    installer: str | None = None  # uv or pip, when patchctl installed it

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> BuildRecord | None:
        if data is None:
            return None
        return cls(data["kind"], data["version"], *(data.get(k) for k in cls._fields[2:]))


class StateRecord(NamedTuple):
    engine: str
    root: str
    version: str
    applied_at: float
    patches: tuple[PatchRecord, ...]
    files: tuple[FileRecord, ...]
    store_fingerprint: str | None = None  # series + patch metadata applied: ensure's no-op test
    build: BuildRecord | None = None  # which build was patched (absent in records before 2026-12)
    stores: tuple[StoreRef, ...] = ()  # the stores applied from, highest priority first (empty: before /3)
    selection: Selection = Selection()

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": STATE_SCHEMA,
            "engine": self.engine,
            "root": self.root,
            "version": self.version,
            "applied_at": self.applied_at,
            "store_fingerprint": self.store_fingerprint,
            "patches": [p.to_json() for p in self.patches],
            "files": [dict(f._asdict(), bytecode=[list(b) for b in f.bytecode]) for f in self.files],
            "build": self.build._asdict() if self.build else None,
            "stores": [s._asdict() for s in self.stores],
            "selection": self.selection.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StateRecord:
        return cls(
            engine=data["engine"],
            root=data["root"],
            version=data["version"],
            applied_at=data["applied_at"],
            store_fingerprint=data.get("store_fingerprint"),
            patches=tuple(PatchRecord.from_json(p) for p in data["patches"]),
            files=tuple(FileRecord(f["path"], f["pristine_sha256"], f["patched_sha256"], f.get("pristine_mtime_ns"),
                                   tuple((b[0], b[1]) for b in f.get("bytecode") or ()))
                        for f in data["files"]),
            build=BuildRecord.from_json(data.get("build")),
            stores=tuple(StoreRef(s["path"], s["kind"]) for s in data.get("stores") or ()),
            selection=Selection.from_json(data.get("selection")),
        )


class Change(NamedTuple):
    """One file to replace: its bytes before and after (None: absent), and what to leave beside it
    after: the source's mtime (None: now) and the .pyc files to put back (revert restores them)."""

    path: str
    before: bytes | None
    after: bytes | None
    after_mtime_ns: int | None = None
    after_bytecode: tuple[tuple[str, str], ...] = ()


def _sealed(kind: str, body: dict[str, Any]) -> bytes:
    """A document with a sha256 over its canonical content: truncation or an edit is detected."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return json.dumps({"sha256": hashlib.sha256(canonical.encode()).hexdigest(), kind: body}, indent=1).encode()


def _unseal(kind: str, raw: bytes, where: Path, schema: str, hint: str) -> dict[str, Any]:
    from patchctl.core.schemas import problem

    def damaged(what: str) -> StateDamaged:
        return StateDamaged(f"{where} is damaged ({what}); patchctl will not guess what it did", hint=hint)

    try:
        outer = load_json(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise damaged(f"not JSON: {exc}") from None
    if not isinstance(outer, dict) or not isinstance(outer.get(kind), dict) or not isinstance(outer.get("sha256"), str):
        raise damaged("not a patchctl document")
    body = outer[kind]
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    if hashlib.sha256(canonical.encode()).hexdigest() != outer["sha256"]:
        raise damaged("its checksum does not match its content")
    wrong = problem(schema, body)
    if wrong is not None:
        raise damaged(wrong)
    return body


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


class TargetState:
    """The bookkeeping of one engine in one tree. Every file of it is read and written relative to the
    folder's descriptor, following no link (nofollow.py): whoever can write the tree cannot make a
    root `patchctl` read or write anywhere else. packages: the engine's packages (engines.yaml);
    every path a record or journal names must lie in one of them (the outside-package rule)."""

    def __init__(self, root: Path, engine: str, legacy_dir: Path | None = None,
                 packages: tuple[str, ...] | None = None):
        self.root = root
        self.engine = engine
        self.packages = packages
        self.top = root / ".patchctl"
        self.dir = self.top / engine
        self.state_file = self.dir / "state.json"
        self.journal_file = self.dir / "journal.json"
        self.blobs = self.dir / "blobs"
        self.legacy_dir = legacy_dir
        self._way_out = (f"`patchctl revert {engine} --target {root} --from-release` restores the pristine files "
                         f"from the release itself (checked against its RECORD) and clears the record")

    # the folders -----------------------------------------------------------------------------
    def _folders(self, create: bool = False) -> AbstractContextManager[folders.Folders | None]:
        """The folders open (None: missing and not created; create: made, with their .gitignore)."""
        return folders.opened(self.root, self.engine, create)

    def _read(self, name: str, limit: int = RECORD_LIMIT) -> bytes | None:
        with self._folders() as f:
            return None if f is None else read_at(f.dir, name, self.dir / name, limit, owners=f.owners)

    def _exists(self, name: str) -> bool:
        with self._folders() as f:
            return f is not None and exists_at(f.dir, name)

    def _exists_quietly(self, name: str) -> bool:
        """_exists, False where the folder cannot be read at all."""
        try:
            return self._exists(name)
        except OSError:
            return False

    def _write(self, name: str, data: bytes) -> None:
        with self._folders(create=True) as f:
            assert f is not None  # created
            write_atomic_at(f.dir, name, data, shown=str(self.dir / name))

    def _unlink(self, name: str) -> None:
        with self._folders() as f:
            if f is not None:
                unlink_at(f.dir, name)

    # records ---------------------------------------------------------------------------------
    def load(self) -> StateRecord | None:
        self._migrate_legacy()
        raw = self._read("state.json")
        if raw is None:
            return None
        body = _unseal("record", raw, self.state_file, "state", self._way_out)
        record = StateRecord.from_json(body)
        for f in record.files:
            self.inside(f.path, self.state_file)
            for pyc, _ in f.bytecode:
                self.inside(pyc, self.state_file)
        return record

    def save(self, record: StateRecord | None) -> None:
        if record is None:
            self._unlink("state.json")
        else:
            self._write("state.json", _sealed("record", record.to_json()))

    def set_aside_damaged(self) -> None:
        """The record and the journal renamed out of the way (kept for a person to read), not replayed."""
        with self._folders() as f:
            if f is None:
                return
            for name in ("journal.json", "state.json"):
                if exists_at(f.dir, name):
                    os.rename(name, f"{name}.damaged-{int(time.time())}", src_dir_fd=f.dir, dst_dir_fd=f.dir)

    def inside(self, rel: str, where: Path) -> Path:
        """root/rel, for a path read from a record or journal: relative, inside the engine's packages,
        and resolved inside the target. A path the record names that a symlink now leads out of the
        tree is not a damaged record: it is said as it is (Planted)."""
        if os.path.isabs(rel) or ".." in Path(rel).parts or "\0" in rel:
            raise StateDamaged(f"{where} names {rel!r}, which leaves the tree", hint=self._way_out)
        if self.packages is not None and outside_packages([rel], self.packages):
            raise StateDamaged(f"{where} names {rel!r}, outside the {', '.join(p + '/' for p in self.packages)} "
                               f"package: patchctl writes nothing else", hint=self._way_out)
        try:
            return resolve_inside(self.root, rel)
        except PatchctlError:
            resolved = (self.root / rel).resolve()
            raise Planted(f"{self.root / rel} is a symlink (or lies under one) to {resolved}, outside the tree: "
                          f"patchctl reads and writes nothing through it",
                          hint="replace the link by the file it names (or remove it), then run the command "
                               "again") from None

    def put_blob(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        with self._folders(create=True) as f:
            assert f is not None  # created
            blobs = open_dir(f.dir, "blobs", self.blobs, create=True, owners=f.owners)
            assert blobs is not None  # created
            try:
                if sha256(read_at(blobs, digest, self.blobs / digest, owners=f.owners)) != digest:
                    write_atomic_at(blobs, digest, data, shown=str(self.blobs / digest))
            finally:
                os.close(blobs)
        return digest

    def blob(self, digest: str) -> bytes:
        with self._folders() as f:
            blobs = None if f is None else open_dir(f.dir, "blobs", self.blobs, owners=f.owners)
            if f is None or blobs is None:
                data = None
            else:
                try:
                    data = read_at(blobs, digest, self.blobs / digest, owners=f.owners)
                finally:
                    os.close(blobs)
        if data is None:
            raise StateDamaged(f"backup {digest[:12]}… is missing from {self.blobs}", hint=self._way_out)
        if sha256(data) != digest:
            raise StateDamaged(f"backup {digest[:12]}… in {self.blobs} is corrupt", hint=self._way_out)
        return data

    # the lock --------------------------------------------------------------------------------
    def locked(self, wait_seconds: float = 0.0, *, read_only_ok: bool = False) -> AbstractContextManager[str | None]:
        """The target's lock (lock.py); yields None when it is held. read_only_ok: a tree nothing may be
        written into (a read-only mount, a user without write permission: status as another user, ensure
        as a service user under ProtectSystem=) is read without it, as long as no interrupted write
        waits to be undone: it then yields why the lock could not be taken ("Read-only file system"),
        and the caller must write nothing. When nothing is applied any more, the bookkeeping folder is
        removed on the way out (revert leaves the tree as it was), never what the next holder made.
        Taking it writes nothing: the lock file is never written."""
        return lock.hold(self, wait_seconds, read_only_ok=read_only_ok)

    # journaled writes ------------------------------------------------------------------------
    def capture(self, rel: str) -> tuple[int | None, tuple[tuple[str, str], ...]]:
        """The file's mtime and its .pyc files (stashed as blobs), to put back when it is restored."""
        self.inside(rel, self.state_file)
        st = lstat_beneath(self.root, rel)
        if st is None:
            return None, ()
        stashed = []
        for pyc in _bytecode_of(self.root, rel):
            data = self.read_tree(pyc, self.state_file)
            if data is not None:
                stashed.append((pyc, self.put_blob(data)))
        return st.st_mtime_ns, tuple(stashed)

    def read_tree(self, rel: str, where: Path) -> bytes | None:
        """The bytes of a tree file a record or journal (`where`) names: the path checked by inside(),
        then read without resolving it by name (nofollow.read_beneath): a link swapped in meanwhile is
        followed only inside the tree; a FIFO or a device is refused, not read."""
        self.inside(rel, where)
        return read_beneath(self.root, rel)

    def write_files(self, changes: list[Change], new_record: StateRecord | None) -> None:
        """Replace files under the root all-or-nothing, then save new_record."""
        entries: list[dict[str, Any]] = []  # journal.json entries
        for c in changes:
            mtime, bytecode = self.capture(c.path)
            entries.append({
                "path": c.path,
                "before": None if c.before is None else self.put_blob(c.before),
                "after": None if c.after is None else self.put_blob(c.after),
                "before_mtime_ns": mtime, "before_bytecode": [list(b) for b in bytecode],
                "after_mtime_ns": c.after_mtime_ns, "after_bytecode": [list(b) for b in c.after_bytecode],
            })
        raw = self._read("state.json")
        previous = None if raw is None else raw.decode("utf-8", errors="surrogateescape")
        journal = {"schema": JOURNAL_SCHEMA, "entries": entries, "previous_state": previous, "pid": os.getpid()}
        self._write("journal.json", _sealed("journal", journal))
        _crash_point("journal")
        try:
            for n, e in enumerate(entries, start=1):
                self._put(e["path"], e["after"], e["after_mtime_ns"], e["after_bytecode"])
                _crash_point(f"file:{n}")
            self.save(new_record)
            _crash_point("state")
        except OSError as exc:
            self._roll_back_after(exc)
        self._unlink("journal.json")

    def _roll_back_after(self, exc: OSError) -> None:
        cause = exc.strerror or str(exc)
        failed_at = exc.filename or "a file"
        try:
            self.recover()
        except (OSError, PatchctlError) as again:
            files = ", ".join(e["path"] for e in self._journal_entries())
            why = getattr(again, "strerror", None) or getattr(again, "message", None) or str(again)
            # What stopped the rollback says what to fix (a permission, not space, for EACCES).
            stopped = again.errno if isinstance(again, (OSError, RollbackPending)) else exc.errno
            raise EnvironmentProblem(
                f"cannot write {failed_at}: {cause}; rolling back failed too ({why}). The journal {self.journal_file} "
                f"is kept: {files} may be patched or pristine",
                hint=f"{write_hint(stopped)}, then run `patchctl status` on this target: it finishes the rollback "
                     f"to the previous state",
            ) from None
        raise EnvironmentProblem(f"cannot write {failed_at}: {cause}; rolled back, nothing was changed",
                                 hint=write_hint(exc.errno)) from None

    def _journal_entries(self) -> list[dict[str, Any]]:
        try:
            return self._read_journal()["entries"]
        except (PatchctlError, OSError):
            return []

    def _read_journal(self) -> dict[str, Any]:
        raw = self._read("journal.json")
        if raw is None:
            raise StateDamaged(f"{self.journal_file} vanished while being read", hint=self._way_out)
        body = _unseal("journal", raw, self.journal_file, "journal", self._way_out)
        for e in body["entries"]:
            self.inside(e["path"], self.journal_file)
            for pyc, _ in list(e["before_bytecode"]) + list(e["after_bytecode"]):
                self.inside(pyc, self.journal_file)
        return body

    def _sweep(self) -> None:
        """Temp files of dead processes in every bookkeeping folder patchctl writes into."""
        with self._folders() as f:
            if f is None:
                return
            _sweep_at(f.top)  # .gitignore's
            _sweep_at(f.dir)  # state.json's, journal.json's
            blobs = open_dir(f.dir, "blobs", self.blobs, owners=f.owners)
            if blobs is not None:
                try:
                    _sweep_at(blobs)
                finally:
                    os.close(blobs)

    def recover(self) -> bool:
        """Undo an interrupted write and sweep temp files of dead processes; True when there was one."""
        self._migrate_legacy()
        self._sweep()
        if not self._exists("journal.json"):
            return False
        journal = self._read_journal()
        # Every folder the interrupted write can have written into: the files' and their bytecode's.
        written: set[str] = set()
        for e in journal["entries"]:
            self.inside(e["path"], self.journal_file)
            parent = os.path.dirname(e["path"])
            written |= {parent, f"{parent}/__pycache__"}
            for pyc, _ in list(e["before_bytecode"]) + list(e["after_bytecode"]):
                self.inside(pyc, self.journal_file)
                written.add(os.path.dirname(pyc))
        for folder in sorted(written):
            with folder_beneath(self.root, folder) as fd:
                if fd is not None:
                    _sweep_at(fd)
        try:
            for e in reversed(journal["entries"]):
                if self._current_digest(e["path"]) == e["before"]:
                    # The bytes are back (or were never replaced); a rollback stopped before the end
                    # may still owe the mtime or the bytecode: without them the .pyc beside it is stale.
                    self._finish(e["path"], e["before"], e["before_mtime_ns"], e["before_bytecode"])
                    continue
                self._put(e["path"], e["before"], e["before_mtime_ns"], e["before_bytecode"])
            if journal["previous_state"] is None:
                self._unlink("state.json")
            else:
                self._write("state.json", journal["previous_state"].encode("utf-8", errors="surrogateescape"))
        except OSError as exc:
            # Every step above is idempotent: the next command's recovery starts it again.
            raise RollbackPending(
                f"an interrupted write to {self.root} cannot be rolled back yet: {exc}; the journal "
                f"{self.journal_file} is kept ({', '.join(e['path'] for e in journal['entries'])})",
                errno=exc.errno, hint=f"{write_hint(exc.errno)}, then run `patchctl status` on this target",
            ) from None
        self._unlink("journal.json")
        return True

    def _current_digest(self, rel: str) -> str | None:
        return sha256(self.read_tree(rel, self.journal_file))

    def _put(self, rel: str, blob: str | None, mtime_ns: int | None, bytecode: Iterable[Iterable[str]]) -> None:
        """The file `rel` made `blob`'s bytes (None: removed), with its bytecode and mtime. Every step is
        relative to the descriptor of the file's folder (nofollow.parent_beneath: reached from the
        tree's root, following no link out of it), and the last name itself is never followed: the
        new file is renamed over whatever is there (a link is replaced, not written through)."""
        self.inside(rel, self.journal_file)
        target = self.root / rel
        data = None if blob is None else self.blob(blob)
        with ExitStack() as opened:
            try:
                folder, name = opened.enter_context(parent_beneath(self.root, rel, create=data is not None))
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
                        st = stat_beneath(self.root, rel) or st
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
        self._put_bytecode(rel, bytecode)

    def _put_bytecode(self, rel: str, bytecode: Iterable[Iterable[str]]) -> None:
        """The module's .pyc files removed, and `bytecode` ((path, blob) pairs) put in their place."""
        for pyc in _bytecode_of(self.root, rel):
            self.inside(pyc, self.journal_file)
            with parent_beneath(self.root, pyc) as (cache, pyc_name):
                unlink_at(cache, pyc_name)
        for pyc, digest in bytecode:
            self.inside(pyc, self.journal_file)
            with parent_beneath(self.root, pyc, create=True) as (cache, pyc_name):
                write_atomic_at(cache, pyc_name, self.blob(digest), shown=str(self.root / pyc))
            _crash_point("bytecode")

    def _finish(self, rel: str, blob: str | None, mtime_ns: int | None, bytecode: Iterable[Iterable[str]]) -> None:
        """For a file that already holds `blob`'s bytes: the mtime and the bytecode _put would have left
        beside it, where they differ (a rollback that stopped after the source was written). Reads
        only, when nothing differs: recovery of an entry the interrupted write never reached."""
        self.inside(rel, self.journal_file)
        if blob is not None and mtime_ns is not None:
            try:
                with parent_beneath(self.root, rel) as (folder, name):
                    st = os.stat(name, dir_fd=folder, follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode) and st.st_mtime_ns != mtime_ns:
                        os.utime(name, ns=(mtime_ns, mtime_ns), dir_fd=folder, follow_symlinks=False)
            except FileNotFoundError:
                pass
        wanted = {pyc: digest for pyc, digest in bytecode}
        now = {pyc: sha256(self.read_tree(pyc, self.journal_file)) for pyc in _bytecode_of(self.root, rel)}
        if now != wanted:
            self._put_bytecode(rel, wanted.items())

    # records of patchctl before 2026-12 ------------------------------------------------------
    def _migrate_legacy(self) -> None:
        """Move a record kept under the data dir (keyed by path) into the tree, once."""
        legacy = self.legacy_dir
        if legacy is None or not (legacy / "state.json").is_file() or self._exists("state.json"):
            return
        if (legacy / "journal.json").exists():
            raise StateDamaged(f"an interrupted write by an older patchctl is recorded in {legacy / 'journal.json'}",
                               hint=self._way_out)
        try:
            old = load_json((legacy / "state.json").read_text())
            record = StateRecord.from_json(old)
        except (ValueError, KeyError, TypeError) as exc:
            raise StateDamaged(f"{legacy / 'state.json'} is damaged ({exc})", hint=self._way_out) from None
        if (legacy / "blobs").is_dir():
            for blob in (legacy / "blobs").iterdir():
                data = read_beneath(legacy / "blobs", blob.name)
                if data is not None:
                    self.put_blob(data)
        self.save(record)
        shutil.rmtree(legacy, ignore_errors=True)


def _bytecode_of(root: Path, rel: str) -> list[str]:
    """The .pyc files of a module (every interpreter and optimisation level), relative to root; its
    __pycache__ listed through its descriptor (reached as every tree file is: nofollow.folder_beneath)."""
    if not rel.endswith(".py"):
        return []
    folder, name = os.path.split(rel)
    cache = f"{folder}/__pycache__" if folder else "__pycache__"
    stem = name[:-len(".py")]
    with folder_beneath(root, cache) as fd:
        names = [] if fd is None else os.listdir(fd)
    return sorted(f"{cache}/{n}" for n in names
                  if n.startswith(stem + ".") and n.endswith(".pyc") and "/" not in n and not TEMP_NAME.match(n))
