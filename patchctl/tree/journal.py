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
  lock          flock'ed by the one process working on this target

state.json and journal.json carry a sha256 over their content and are validated against their JSON
schemas (patchctl/schemas/state.json, journal.json); every path in them must stay inside the target.
A damaged one is an error naming the file and the way out, never trusted. Records written by
patchctl before 2026-12 under <data dir>/targets/<key>/ are moved here on first use.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from patchctl.atomic import write_atomic
from patchctl.errors import EnvironmentProblem, PatchctlError, StateDamaged
from patchctl.paths import resolve_inside

STATE_SCHEMA = "patchctl-state/2"
JOURNAL_SCHEMA = "patchctl-journal/2"
_TEMP = re.compile(r"^\..+\.patchctl-(\d+)(?:-\d+)?\.tmp$")


def sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


class FileRecord(NamedTuple):
    path: str
    pristine_sha256: str | None  # None: the patch set created the file
    patched_sha256: str | None  # None: the patch set deleted the file
    pristine_mtime_ns: int | None = None  # restored by revert, so the bytecode below is valid again
    bytecode: tuple[tuple[str, str], ...] = ()  # (path, blob sha256) of the pristine file's .pyc files


class PatchRecord(NamedTuple):
    name: str
    outcome: str
    variant: str | None


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

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": STATE_SCHEMA,
            "engine": self.engine,
            "root": self.root,
            "version": self.version,
            "applied_at": self.applied_at,
            "store_fingerprint": self.store_fingerprint,
            "patches": [p._asdict() for p in self.patches],
            "files": [dict(f._asdict(), bytecode=[list(b) for b in f.bytecode]) for f in self.files],
            "build": self.build._asdict() if self.build else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StateRecord:
        return cls(
            engine=data["engine"],
            root=data["root"],
            version=data["version"],
            applied_at=data["applied_at"],
            store_fingerprint=data.get("store_fingerprint"),
            patches=tuple(PatchRecord(**p) for p in data["patches"]),
            files=tuple(FileRecord(f["path"], f["pristine_sha256"], f["patched_sha256"], f.get("pristine_mtime_ns"),
                                   tuple((b[0], b[1]) for b in f.get("bytecode") or ()))
                        for f in data["files"]),
            build=BuildRecord.from_json(data.get("build")),
        )


class Change(NamedTuple):
    """One file to replace: its bytes before and after (None: absent), and what to leave beside it
    after: the source's mtime (None: now) and the .pyc files to put back (revert restores them)."""

    path: str
    before: bytes | None
    after: bytes | None
    after_mtime_ns: int | None = None
    after_bytecode: tuple[tuple[str, str], ...] = ()


def _crash_point(step: str) -> None:
    """Tests kill a real apply at each write step: PATCHCTL_CRASH_AT=<step> sends SIGKILL to self."""
    if os.environ.get("PATCHCTL_CRASH_AT") == step:
        os.kill(os.getpid(), signal.SIGKILL)


def _sealed(kind: str, body: dict[str, Any]) -> bytes:
    """A document with a sha256 over its canonical content: truncation or an edit is detected."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return json.dumps({"sha256": hashlib.sha256(canonical.encode()).hexdigest(), kind: body}, indent=1).encode()


def _unseal(kind: str, raw: bytes, where: Path, schema: str, hint: str) -> dict[str, Any]:
    from patchctl.schemas import problem

    def damaged(what: str) -> StateDamaged:
        return StateDamaged(f"{where} is damaged ({what}); patchctl will not guess what it did", hint=hint)

    try:
        outer = json.loads(raw.decode("utf-8"))
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


def sweep_temp_files(directories: Iterable[Path]) -> list[Path]:
    """Remove write_atomic's temp files left by processes that died (kill -9) in these directories."""
    removed = []
    for directory in directories:
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            m = _TEMP.match(name)
            if m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
                try:
                    (directory / name).unlink()
                    removed.append(directory / name)
                except OSError:
                    pass
    return removed


class TargetState:
    def __init__(self, root: Path, engine: str, legacy_dir: Path | None = None):
        self.root = root
        self.dir = root / ".patchctl" / engine
        self.state_file = self.dir / "state.json"
        self.journal_file = self.dir / "journal.json"
        self.blobs = self.dir / "blobs"
        self.legacy_dir = legacy_dir
        self._way_out = (f"`patchctl revert {engine} --target {root} --from-release` restores the pristine files "
                         f"from the release itself (checked against its RECORD) and clears the record")

    # records ---------------------------------------------------------------------------------
    def load(self) -> StateRecord | None:
        self._migrate_legacy()
        try:
            raw = self.state_file.read_bytes()
        except FileNotFoundError:
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
            self.state_file.unlink(missing_ok=True)
        else:
            self._prepare_dir()
            write_atomic(self.state_file, _sealed("record", record.to_json()))

    def inside(self, rel: str, where: Path) -> Path:
        """root/rel, for a path read from a record or journal: relative and resolved inside the target."""
        try:
            return resolve_inside(self.root, rel)
        except PatchctlError as exc:
            raise StateDamaged(f"{where} names {rel!r}: {exc.message}", hint=self._way_out) from None

    def put_blob(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        path = self.blobs / digest
        if not path.is_file() or sha256(path.read_bytes()) != digest:
            self._prepare_dir()
            write_atomic(path, data)
        return digest

    def blob(self, digest: str) -> bytes:
        try:
            data = (self.blobs / digest).read_bytes()
        except FileNotFoundError:
            raise StateDamaged(f"backup {digest[:12]}… is missing from {self.blobs}", hint=self._way_out) from None
        if sha256(data) != digest:
            raise StateDamaged(f"backup {digest[:12]}… in {self.blobs} is corrupt", hint=self._way_out)
        return data

    def _prepare_dir(self) -> None:
        if self.dir.is_dir():
            return
        made = not self.dir.parent.exists()
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            ignore = self.dir.parent / ".gitignore"
            if not ignore.exists():
                write_atomic(ignore, b"# patchctl's record of what it changed in this tree\n*\n")
        except OSError:
            # A full disk: leave no empty folder behind in the tree.
            self.dir.rmdir()
            if made:
                self.dir.parent.rmdir()
            raise

    # the lock --------------------------------------------------------------------------------
    @contextmanager
    def locked(self, wait_seconds: float = 0.0, *, read_only_ok: bool = False) -> Iterator[None]:
        """The target's lock. read_only_ok: a tree this user cannot write (status as another user) is
        read without it, as long as no interrupted write waits to be undone. When nothing is applied
        any more, the bookkeeping folder is removed on the way out: revert leaves the tree as it was."""
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                self._prepare_dir()
                fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                if read_only_ok and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT) \
                        and not self.journal_file.exists():
                    yield
                    return
                raise EnvironmentProblem(f"cannot lock {self.dir}: {exc.strerror}",
                                         hint="run as the owner of the environment") from None
            try:
                self._flock(fd, deadline)
                # The holder before us may have removed the folder (nothing applied): a lock on a
                # deleted file locks nothing, so take the lock again on the file that is there now.
                try:
                    same = os.fstat(fd).st_ino == os.stat(self.dir / "lock").st_ino
                except FileNotFoundError:
                    same = False
                if not same:
                    os.close(fd)
                    continue
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
                try:
                    yield
                finally:
                    self._forget_if_unused()
                return
            finally:
                try:
                    os.close(fd)  # closing releases the flock
                except OSError:
                    pass

    def _flock(self, fd: int, deadline: float) -> None:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                    raise EnvironmentProblem(
                        f"another patchctl (pid {holder}) is working on this target",
                        hint="wait for it, or pass --wait SECONDS",
                    ) from None
                time.sleep(0.2)

    def _forget_if_unused(self) -> None:
        """No record and no journal: remove the folder (under the lock), and .patchctl/ if it is empty."""
        if self.state_file.exists() or self.journal_file.exists():
            return
        shutil.rmtree(self.blobs, ignore_errors=True)
        for name in os.listdir(self.dir) if self.dir.is_dir() else ():
            if name != "lock" and not _TEMP.match(name):
                return  # something else (a damaged record set aside): leave it for a person
        shutil.rmtree(self.dir, ignore_errors=True)
        parent = self.dir.parent
        try:
            if sorted(os.listdir(parent)) in ([], [".gitignore"]):
                shutil.rmtree(parent, ignore_errors=True)
        except OSError:
            pass

    # journaled writes ------------------------------------------------------------------------
    def capture(self, rel: str) -> tuple[int | None, tuple[tuple[str, str], ...]]:
        """The file's mtime and its .pyc files (stashed as blobs), to put back when it is restored."""
        path = self.inside(rel, self.state_file)
        try:
            mtime = path.lstat().st_mtime_ns
        except FileNotFoundError:
            return None, ()
        return mtime, tuple((pyc, self.put_blob((self.root / pyc).read_bytes())) for pyc in _bytecode_of(self.root, rel))

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
        previous = self.state_file.read_text() if self.state_file.is_file() else None
        journal = {"schema": JOURNAL_SCHEMA, "entries": entries, "previous_state": previous, "pid": os.getpid()}
        self._prepare_dir()
        write_atomic(self.journal_file, _sealed("journal", journal))
        _crash_point("journal")
        try:
            for n, e in enumerate(entries, start=1):
                self._put(e["path"], e["after"], e["after_mtime_ns"], e["after_bytecode"])
                _crash_point(f"file:{n}")
            self.save(new_record)
            _crash_point("state")
        except OSError as exc:
            self._roll_back_after(exc)
        self.journal_file.unlink()

    def _roll_back_after(self, exc: OSError) -> None:
        cause = exc.strerror or str(exc)
        failed_at = exc.filename or "a file"
        try:
            self.recover()
        except (OSError, PatchctlError) as again:
            files = ", ".join(e["path"] for e in self._journal_entries())
            why = getattr(again, "strerror", None) or getattr(again, "message", None) or str(again)
            raise EnvironmentProblem(
                f"cannot write {failed_at}: {cause}; rolling back failed too ({why}). The journal {self.journal_file} "
                f"is kept: {files} may be patched or pristine",
                hint="free space (or fix the disk), then run `patchctl status` on this target: it finishes the "
                     "rollback to the previous state",
            ) from None
        raise EnvironmentProblem(f"cannot write {failed_at}: {cause}; rolled back, nothing was changed") from None

    def _journal_entries(self) -> list[dict[str, Any]]:
        try:
            return self._read_journal()["entries"]
        except PatchctlError:
            return []

    def _read_journal(self) -> dict[str, Any]:
        body = _unseal("journal", self.journal_file.read_bytes(), self.journal_file, "journal", self._way_out)
        for e in body["entries"]:
            self.inside(e["path"], self.journal_file)
            for pyc, _ in list(e["before_bytecode"]) + list(e["after_bytecode"]):
                self.inside(pyc, self.journal_file)
        return body

    def recover(self) -> bool:
        """Undo an interrupted write and sweep temp files of dead processes; True when there was one."""
        self._migrate_legacy()
        sweep_temp_files([self.dir, self.blobs])
        if not self.journal_file.is_file():
            return False
        journal = self._read_journal()
        sweep_temp_files({(self.root / e["path"]).parent for e in journal["entries"]})
        try:
            for e in reversed(journal["entries"]):
                if self._current_digest(e["path"]) == e["before"]:
                    continue  # never reached by the interrupted write: nothing to undo (and no space needed)
                self._put(e["path"], e["before"], e["before_mtime_ns"], e["before_bytecode"])
            if journal["previous_state"] is None:
                self.state_file.unlink(missing_ok=True)
            else:
                write_atomic(self.state_file, journal["previous_state"].encode())
        except OSError as exc:
            # Every step above is idempotent: the next command's recovery starts it again.
            raise EnvironmentProblem(
                f"an interrupted write to {self.root} cannot be rolled back yet: {exc}; the journal "
                f"{self.journal_file} is kept ({', '.join(e['path'] for e in journal['entries'])})",
                hint="free space (or fix the disk), then run `patchctl status` on this target",
            ) from None
        self.journal_file.unlink()
        return True

    def _current_digest(self, rel: str) -> str | None:
        path = self.inside(rel, self.journal_file)
        return sha256(path.read_bytes()) if path.is_file() else None

    def _put(self, rel: str, blob: str | None, mtime_ns: int | None, bytecode: Iterable[Iterable[str]]) -> None:
        target = self.inside(rel, self.journal_file)
        data = None if blob is None else self.blob(blob)
        if data is None:
            target.unlink(missing_ok=True)
        else:
            try:
                st = target.lstat()
                mode, owner = st.st_mode & 0o7777, (st.st_uid, st.st_gid)
            except FileNotFoundError:
                mode, owner = 0o644, None
            # A new inode (rename over): hardlinked installs (uv's cache) are never written through.
            write_atomic(target, data, mode=mode, owner=owner)
        for pyc in _bytecode_of(self.root, rel):
            (self.root / pyc).unlink(missing_ok=True)
        for pyc, digest in bytecode:
            write_atomic(self.inside(pyc, self.journal_file), self.blob(digest))
        if data is not None and mtime_ns is not None:
            os.utime(target, ns=(mtime_ns, mtime_ns))

    # records of patchctl before 2026-12 ------------------------------------------------------
    def _migrate_legacy(self) -> None:
        """Move a record kept under the data dir (keyed by path) into the tree, once."""
        legacy = self.legacy_dir
        if legacy is None or not (legacy / "state.json").is_file() or self.state_file.exists():
            return
        if (legacy / "journal.json").exists():
            raise StateDamaged(f"an interrupted write by an older patchctl is recorded in {legacy / 'journal.json'}",
                               hint=self._way_out)
        try:
            old = json.loads((legacy / "state.json").read_text())
            record = StateRecord.from_json(old)
        except (ValueError, KeyError, TypeError) as exc:
            raise StateDamaged(f"{legacy / 'state.json'} is damaged ({exc})", hint=self._way_out) from None
        self._prepare_dir()
        if (legacy / "blobs").is_dir():
            for blob in (legacy / "blobs").iterdir():
                if not (self.blobs / blob.name).exists():
                    write_atomic(self.blobs / blob.name, blob.read_bytes())
        self.save(record)
        shutil.rmtree(legacy, ignore_errors=True)


def _bytecode_of(root: Path, rel: str) -> list[str]:
    """The .pyc files of a module (every interpreter and optimisation level), relative to root."""
    if not rel.endswith(".py"):
        return []
    source = root / rel
    cache = source.parent / "__pycache__"
    if not cache.is_dir():
        return []
    return sorted(str(p.relative_to(root)) for p in cache.glob(f"{source.stem}.*.pyc"))
