"""Where one engine's bookkeeping lives in a tree, and the reads and writes of it: its files by name,
the record, the blobs, and the tree files a record or journal names.

Layout under <import root>/.patchctl/<engine>/ (in the tree, so that every user, every
PATCHCTL_DATA_DIR and every bind mount of the same tree finds the same record and takes the same lock;
nothing there is importable, and a `.gitignore` keeps it out of a checkout's status):
  state.json    the applied-state record (absent: nothing applied), with the build it was applied to
  blobs/<sha>   file contents by sha256: pristine backups, staged new contents, stashed bytecode
  journal.json  present only while files are being written; its presence after a crash means
                "undo everything in it"
  lock          flock'ed by the one process working on this target, never written (lock.py)

state.json and journal.json are sealed (record.py) and in a format upgrade.py checks; every path in
them must stay inside the target. A damaged one is an error naming the file and the way out, never
trusted. Every file of it is read and written relative to the folder's descriptor, following no
link (nofollow.py): whoever can write the tree cannot make a root `patchctl` read or write anywhere
else. While the lock is held the descriptors are the lock's, opened once (`held`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from patchctl.core.atomic import write_atomic_at
from patchctl.core.errors import PatchctlError, Planted, StateDamaged
from patchctl.core.nofollow import RECORD_LIMIT, exists_at, read_at, read_beneath, unlink_at
from patchctl.core.paths import outside_packages, resolve_inside
from patchctl.tree.bookkeeping import blobs, upgrade
from patchctl.tree.bookkeeping.lock import Folders, opened
from patchctl.tree.bookkeeping.record import StateRecord

# The lock's open folders by (root, engine), while this process holds the lock: every Place of that
# target reads and writes through them (the work layer makes one per Target.state() call, several per
# command), so none reopens the folders by their names under the lock.
_HELD: dict[tuple[Path, str], Folders] = {}


class Place:
    """The bookkeeping of one engine in one tree. packages: the engine's packages (engines.yaml);
    every path a record or journal names must lie in one of them (the outside-package rule)."""

    def __init__(self, root: Path, engine: str, packages: tuple[str, ...] | None = None):
        self.root = root
        self.engine = engine
        self.packages = packages
        self.top = root / ".patchctl"
        self.dir = self.top / engine
        self.state_file = self.dir / "state.json"
        self.journal_file = self.dir / "journal.json"
        self.blobs = self.dir / "blobs"
        self.way_out = (
            f"`patchctl revert {engine} --target {root} --from-release` restores the pristine files "
            f"from the release itself (checked against its RECORD) and clears the record"
        )

    # the folders and their files ---------------------------------------------------------------
    @property
    def held(self) -> Folders | None:
        """The lock's open folders, while this process holds the lock of this target."""
        return _HELD.get((self.root, self.engine))

    @contextmanager
    def holding(self, f: Folders) -> Iterator[None]:
        """`f` (the lock's folders) serve every Place of this target until the block ends."""
        _HELD[self.root, self.engine] = f
        try:
            yield
        finally:
            del _HELD[self.root, self.engine]

    @contextmanager
    def folders(self, create: bool = False) -> Iterator[Folders | None]:
        """The folders open: the lock's while it is held; else opened for this one access (None:
        missing and not created; create: made, with their .gitignore)."""
        if self.held is not None:
            yield self.held
            return
        with opened(self.root, self.engine, create) as f:
            yield f

    def read(self, name: str, limit: int = RECORD_LIMIT) -> bytes | None:
        with self.folders() as f:
            return None if f is None else read_at(f.dir, name, self.dir / name, limit, owners=f.owners)

    def exists(self, name: str) -> bool:
        with self.folders() as f:
            return f is not None and exists_at(f.dir, name)

    def write(self, name: str, data: bytes) -> None:
        with self.folders(create=True) as f:
            assert f is not None  # created
            write_atomic_at(f.dir, name, data, shown=str(self.dir / name))

    def unlink(self, name: str) -> None:
        with self.folders() as f:
            if f is not None:
                unlink_at(f.dir, name)

    # the record --------------------------------------------------------------------------------
    def load(self) -> StateRecord | None:
        raw = self.read("state.json")
        if raw is None:
            return None
        record = upgrade.read_record(raw, self.state_file, self.way_out)
        for f in record.files:
            self.inside(f.path, self.state_file)
            for pyc, _ in f.bytecode:
                self.inside(pyc, self.state_file)
        return record

    def save(self, record: StateRecord | None) -> None:
        if record is None:
            self.unlink("state.json")
        else:
            self.write("state.json", upgrade.write_record(record))

    # blobs -------------------------------------------------------------------------------------
    def put_blob(self, data: bytes) -> str:
        with self.folders(create=True) as f:
            assert f is not None  # created
            return blobs.put(f, data, self.blobs)

    def blob(self, digest: str) -> bytes:
        with self.folders() as f:
            return blobs.get(f, digest, self.blobs, self.way_out)

    # the tree's files a record or journal names -------------------------------------------------
    def inside(self, rel: str, where: Path) -> Path:
        """root/rel, for a path read from a record or journal: relative, inside the engine's packages,
        and resolved inside the target. A path the record names that a symlink now leads out of the
        tree is not a damaged record: it is said as it is (Planted)."""
        if os.path.isabs(rel) or ".." in Path(rel).parts or "\0" in rel:
            raise StateDamaged(f"{where} names {rel!r}, which leaves the tree", hint=self.way_out)
        if self.packages is not None and outside_packages([rel], self.packages):
            raise StateDamaged(
                f"{where} names {rel!r}, outside the {', '.join(p + '/' for p in self.packages)} "
                f"package: patchctl writes nothing else",
                hint=self.way_out,
            )
        try:
            return resolve_inside(self.root, rel)
        except PatchctlError:
            resolved = (self.root / rel).resolve()
            raise Planted(
                f"{self.root / rel} is a symlink (or lies under one) to {resolved}, outside the tree: "
                f"patchctl reads and writes nothing through it",
                hint="replace the link by the file it names (or remove it), then run the command again",
            ) from None

    def read_tree(self, rel: str, where: Path) -> bytes | None:
        """The bytes of a tree file a record or journal (`where`) names: the path checked by inside(),
        then read without resolving it by name (nofollow.read_beneath): a link swapped in meanwhile is
        followed only inside the tree; a FIFO or a device is refused, not read."""
        self.inside(rel, where)
        return read_beneath(self.root, rel)
