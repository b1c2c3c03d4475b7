"""Temporary files in the download cache: none is left behind by a Ctrl-C, and those a killed process
left are removed by a later run (issue 36: an interrupted `check --verify` left
`verified/<sha256>/.artifact.<pid>.part`, hundreds of MB, there for good).

A part file (a download, a copied artifact) is made by `part_file`; a small cache file is written
(write_atomic's temp file beside it) inside `writing()`. Either may run on a worker thread, which a
Ctrl-C abandons rather than waits for (cli/interrupt.py): before the process ends, `abandon()`
refuses new temporary files, waits a moment for the writes in progress, and removes every part file
still open. A worker that tries to make one afterwards gets the KeyboardInterrupt the process got.
What a killed process (SIGKILL, a power cut) left, `ArtifactCache.sweep` removes (STALE_AFTER).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

# `.<name>.<pid>.part`: the pid that wrote it, so that a sweep removes only a dead process's.
PART_NAME = re.compile(r"^\..+\.(\d+)\.part$")
WAIT = 1.0  # seconds abandon() waits for a cache write in progress (a small file: milliseconds)
# A part file of a pid not running here is left alone while it is younger than this: a process in
# another pid namespace (a container sharing the cache) may be writing it, and writes every chunk.
STALE_AFTER = 60.0

_cond = threading.Condition()
_parts: set[Path] = set()
_writes = 0
_abandoned = False


def part_name(target: Path) -> Path:
    return target.with_name(f".{target.name}.{os.getpid()}.part")


class Part:
    """A part file open for writing; `publish` renames it over its target."""

    def __init__(self, path: Path, file: BinaryIO):
        self.path = path
        self.file = file
        self.published = False

    def publish(self, target: Path) -> None:
        self.file.close()
        # Not under the lock: a rename is atomic, so abandon() racing it finds the part file renamed
        # whole (its unlink misses) or removes it (the rename misses); a slow disk holds up no exit.
        os.replace(self.path, target)
        self.published = True
        with _cond:
            _parts.discard(self.path)


@contextmanager
def part_file(target: Path) -> Iterator[Part]:
    """A new part file beside `target` (its folder must exist), created O_EXCL | O_NOFOLLOW (a name
    planted there is not written through) and removed on every way out that does not publish it."""
    path = part_name(target)
    with _cond:
        if _abandoned:
            raise KeyboardInterrupt  # the process is ending on a Ctrl-C: this thread is abandoned
        try:
            os.unlink(path)  # a dead process's of the same pid
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        _parts.add(path)
    part = Part(path, os.fdopen(fd, "wb"))
    try:
        yield part
    finally:
        if not part.published:
            part.file.close()
            with _cond:
                _parts.discard(path)
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass


@contextmanager
def writing() -> Iterator[None]:
    """Around a cache write whose temp file lives only while it runs: abandon() waits for it."""
    global _writes
    with _cond:
        if _abandoned:
            raise KeyboardInterrupt
        _writes += 1
    try:
        yield
    finally:
        with _cond:
            _writes -= 1
            _cond.notify_all()


def abandon(wait: float = WAIT) -> None:
    """The process ends on a Ctrl-C: no new temporary file from here on, writes in progress finished
    (at most `wait` seconds), every part file removed."""
    global _abandoned
    if not _cond.acquire(timeout=wait):  # held by a thread frozen mid-way: a later sweep cleans up
        return
    try:
        _abandoned = True
        end = time.monotonic() + wait
        while _writes and time.monotonic() < end:
            _cond.wait(end - time.monotonic())
        for path in list(_parts):
            try:
                os.unlink(path)
            except OSError:
                pass
        _parts.clear()
    finally:
        _cond.release()


def alive(pid: int) -> bool:
    """Whether a process `pid` runs here (another user's counts: it may not be signalled, but it is)."""
    if pid <= 0:  # kill(0) and kill(-1) would name process groups
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
