"""What patchctl did to a target, kept outside the target: the state record, pristine backups, a
journal that makes every multi-file write recoverable, and one lock per target.

Layout under <data dir>/targets/<key>/:
  state.json    the applied-state record (absent: nothing applied)
  blobs/<sha>   file contents by sha256 (pristine backups and staged new contents)
  journal.json  present only while files are being written; its presence after a crash means
                "undo everything in it"
  lock          flock'ed by the one process working on this target
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from patchctl.atomic import write_atomic
from patchctl.errors import EnvironmentProblem

SCHEMA = "patchctl-state/1"


def sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


class FileRecord(NamedTuple):
    path: str
    pristine_sha256: str | None  # None: the patch set created the file
    patched_sha256: str | None  # None: the patch set deleted the file


class PatchRecord(NamedTuple):
    name: str
    outcome: str
    variant: str | None


class StateRecord(NamedTuple):
    engine: str
    root: str
    version: str
    applied_at: float
    patches: tuple[PatchRecord, ...]
    files: tuple[FileRecord, ...]

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA,
            "engine": self.engine,
            "root": self.root,
            "version": self.version,
            "applied_at": self.applied_at,
            "patches": [p._asdict() for p in self.patches],
            "files": [f._asdict() for f in self.files],
        }

    @classmethod
    def from_json(cls, data: dict) -> StateRecord:
        return cls(
            engine=data["engine"],
            root=data["root"],
            version=data["version"],
            applied_at=data["applied_at"],
            patches=tuple(PatchRecord(**p) for p in data["patches"]),
            files=tuple(FileRecord(**f) for f in data["files"]),
        )


def _crash_point(step: str) -> None:
    """Tests kill a real apply at each write step: PATCHCTL_CRASH_AT=<step> sends SIGKILL to self."""
    if os.environ.get("PATCHCTL_CRASH_AT") == step:
        os.kill(os.getpid(), signal.SIGKILL)


class TargetState:
    def __init__(self, directory: Path):
        self.dir = directory
        self.state_file = directory / "state.json"
        self.journal_file = directory / "journal.json"
        self.blobs = directory / "blobs"

    # records ---------------------------------------------------------------------------------
    def load(self) -> StateRecord | None:
        if not self.state_file.is_file():
            return None
        return StateRecord.from_json(json.loads(self.state_file.read_text()))

    def save(self, record: StateRecord | None) -> None:
        if record is None:
            self.state_file.unlink(missing_ok=True)
        else:
            write_atomic(self.state_file, json.dumps(record.to_json(), indent=2).encode())

    def put_blob(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        path = self.blobs / digest
        if not path.is_file() or sha256(path.read_bytes()) != digest:
            write_atomic(path, data)
        return digest

    def blob(self, digest: str) -> bytes:
        data = (self.blobs / digest).read_bytes()
        if sha256(data) != digest:
            raise EnvironmentProblem(f"backup {digest[:12]}… in {self.blobs} is corrupt")
        return data

    # the lock --------------------------------------------------------------------------------
    @contextmanager
    def locked(self, wait_seconds: float = 0.0) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait_seconds
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
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
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    # journaled writes ------------------------------------------------------------------------
    def write_files(self, root: Path, changes: list[tuple[str, bytes | None, bytes | None]],
                    new_record: StateRecord | None) -> None:
        """Replace files under root all-or-nothing. changes: (path, before, after); None = absent."""
        entries: list[dict[str, Any]] = []
        for path, before, after in changes:
            entries.append({
                "path": path,
                "before": None if before is None else self.put_blob(before),
                "after": None if after is None else self.put_blob(after),
            })
        previous = self.state_file.read_text() if self.state_file.is_file() else None
        journal = {"entries": entries, "previous_state": previous, "pid": os.getpid()}
        write_atomic(self.journal_file, json.dumps(journal).encode())
        _crash_point("journal")
        try:
            for n, entry in enumerate(entries, start=1):
                _put(root, entry["path"], None if entry["after"] is None else self.blob(entry["after"]))
                _crash_point(f"file:{n}")
        except OSError as exc:
            self.recover(root)
            raise EnvironmentProblem(f"cannot write {exc.filename}: {exc.strerror}; nothing was changed") from None
        self.save(new_record)
        _crash_point("state")
        self.journal_file.unlink()

    def recover(self, root: Path) -> bool:
        """Undo an interrupted write; True when there was one."""
        if not self.journal_file.is_file():
            return False
        try:
            journal = json.loads(self.journal_file.read_text())
        except json.JSONDecodeError:
            # Killed while writing the journal itself: no target file was touched yet.
            self.journal_file.unlink()
            return True
        for entry in reversed(journal["entries"]):
            _put(root, entry["path"], None if entry["before"] is None else self.blob(entry["before"]))
        if journal["previous_state"] is None:
            self.state_file.unlink(missing_ok=True)
        else:
            write_atomic(self.state_file, journal["previous_state"].encode())
        self.journal_file.unlink()
        return True


def _put(root: Path, rel: str, data: bytes | None) -> None:
    target = root / rel
    if data is None:
        target.unlink(missing_ok=True)
    else:
        mode = target.stat().st_mode & 0o7777 if target.exists() else 0o644
        write_atomic(target, data, mode=mode)  # a new inode: hardlinks are never written through
    _remove_bytecode(target)


def _remove_bytecode(source: Path) -> None:
    if source.suffix != ".py":
        return
    cache = source.parent / "__pycache__"
    if cache.is_dir():
        for pyc in cache.glob(f"{source.stem}.*.pyc"):
            pyc.unlink(missing_ok=True)
