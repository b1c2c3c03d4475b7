"""patchctl.core.atomic.write_atomic: whole files or the old ones, never a part, never a stray temp file."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from patchctl.core import atomic
from patchctl.core.atomic import write_atomic


def leftovers(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_writes_a_new_file_and_its_directory(tmp_path):
    path = tmp_path / "sub" / "dir" / "file.json"
    write_atomic(path, b"{}\n")
    assert path.read_bytes() == b"{}\n"
    assert leftovers(path.parent) == []


def test_short_writes_still_write_the_whole_file(tmp_path, monkeypatch):
    calls = []

    def short_write(fd, data):
        calls.append(len(data))
        return os.write(fd, bytes(data[:3]))  # the kernel may take fewer bytes than offered

    monkeypatch.setattr(atomic, "_os_write", short_write)
    path = tmp_path / "f"
    path.write_bytes(b"old")
    data = bytes(range(256)) * 4
    write_atomic(path, data)
    assert path.read_bytes() == data
    assert len(calls) == -(-len(data) // 3) and calls[0] == len(data)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("failure", ["zero", "enospc"])
def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch, failure):
    def broken_write(fd, data):
        if failure == "zero":
            return 0
        os.write(fd, bytes(data[:5]))  # part of it reached the temp file first
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic, "_os_write", broken_write)
    path = tmp_path / "state.json"
    path.write_bytes(b"the old content")
    with pytest.raises(OSError) as info:
        write_atomic(path, b"the new content, longer than the old")
    assert path.read_bytes() == b"the old content"
    assert leftovers(tmp_path) == []
    assert str(path) in str(info.value) and info.value.filename == str(path)
    assert info.value.errno == errno.ENOSPC


def test_a_failed_write_of_a_new_file_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "_os_write", lambda fd, data: 0)
    with pytest.raises(OSError):
        write_atomic(tmp_path / "new", b"data")
    assert list(tmp_path.iterdir()) == []


def test_the_file_and_then_its_directory_are_fsynced(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    write_atomic(tmp_path / "f", b"data")
    assert synced == ["file", "dir"]


def test_a_new_inode_so_hardlinks_are_not_written_through(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"pristine")
    os.link(path, tmp_path / "cache-copy")
    write_atomic(path, b"patched")
    assert (tmp_path / "cache-copy").read_bytes() == b"pristine"
    assert path.read_bytes() == b"patched"


def test_modes(tmp_path):
    path = tmp_path / "script.py"
    write_atomic(path, b"#!/bin/sh\n", mode=0o755)
    assert stat.S_IMODE(path.stat().st_mode) == 0o755  # exact, whatever the umask
    os.chmod(path, 0o700)
    write_atomic(path, b"#!/bin/sh\necho\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o700  # kept, as an in-place write keeps it


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to tell the files apart")
def test_journal_turns_a_full_disk_into_a_clean_failure(tmp_path, monkeypatch):
    """The target's journaled writes go through the same helper: ENOSPC midway is undone."""
    from patchctl.core.errors import EnvironmentProblem
    from patchctl.tree.bookkeeping import Change, TargetState

    root = tmp_path / "tree"
    root.mkdir()
    (root / "a.py").write_bytes(b"a = 1\n")
    (root / "b.py").write_bytes(b"b = 1\n")
    state = TargetState(root, "vllm")
    real = atomic._os_write

    failed = []

    def full_disk_for_b(fd, data):
        # The backups and the journal fit; the disk is full (once) while b.py, the 2nd file, is written.
        if not failed and os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(".b.py."):
            failed.append(fd)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data)

    monkeypatch.setattr(atomic, "_os_write", full_disk_for_b)
    with pytest.raises(EnvironmentProblem) as info:
        state.write_files([Change("a.py", b"a = 1\n", b"a = 2\n"), Change("b.py", b"b = 1\n", b"b = 2\n")], None)
    assert "b.py" in str(info.value) and "nothing was changed" in str(info.value)
    assert (root / "a.py").read_bytes() == b"a = 1\n" and (root / "b.py").read_bytes() == b"b = 1\n"
    assert failed and leftovers(root) == [] and not state.journal_file.exists()


def _dir_fd(path):
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def test_write_atomic_at_replaces_a_planted_link_and_never_writes_through_it(tmp_path):
    from patchctl.core.atomic import write_atomic_at

    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "state.json").symlink_to(outside)
    fd = _dir_fd(folder)
    try:
        write_atomic_at(fd, "state.json", b"new")
    finally:
        os.close(fd)
    assert outside.read_bytes() == b"precious"
    assert not (folder / "state.json").is_symlink() and (folder / "state.json").read_bytes() == b"new"
    assert stat.S_IMODE((folder / "state.json").stat().st_mode) == 0o644 & ~_umask()


def test_write_atomic_at_a_link_planted_at_the_temp_name_is_not_followed(tmp_path):
    from patchctl.core.atomic import temp_path, write_atomic_at

    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    folder = tmp_path / "folder"
    folder.mkdir()
    temp_path(folder / "f").symlink_to(outside)  # guessed: the name holds only the pid
    fd = _dir_fd(folder)
    try:
        write_atomic_at(fd, "f", b"new")
    finally:
        os.close(fd)
    assert outside.read_bytes() == b"precious" and (folder / "f").read_bytes() == b"new"
    assert sorted(p.name for p in folder.iterdir()) == ["f"]


def test_write_atomic_at_writes_into_the_folder_it_was_given_even_if_renamed(tmp_path):
    from patchctl.core.atomic import write_atomic_at

    folder = tmp_path / "folder"
    folder.mkdir()
    fd = _dir_fd(folder)
    try:
        folder.rename(tmp_path / "moved")
        (tmp_path / "folder").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
        write_atomic_at(fd, "f", b"new")
    finally:
        os.close(fd)
    assert (tmp_path / "moved" / "f").read_bytes() == b"new" and not (tmp_path / "elsewhere").exists()


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old
