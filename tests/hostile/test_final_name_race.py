"""Item 1 of issue 23, the tree's own files: a name checked inside the tree and then swapped for a
link out of it before patchctl reads, writes, renames or removes it (the tree's owner racing a root
`patchctl`). swap_hook.py makes the swap at the seam itself: right after the Nth check of the path
(TargetState.inside), for N over every check a command makes. Swapped are the file itself (a link
to a file outside holding the patched bytes, so a read through it looks right), its __pycache__ (a
link to a folder holding the same .pyc names) and its package folder (a link to a copy of it
outside). Every case: nothing outside changes, no traceback, no hang, and nothing is read, listed or
written through the link (every file and folder outside keeps its atime, set to 0 before the
command); a command that still uses the name after the swap stops with exit 3 naming the link out
of the tree, one whose last use came before it finishes (exit 0).
On the code before the fix the reads followed the link (`status` said intact, exit 0), bytecode was
removed through the swapped folder (outside .pyc files deleted) and a swapped package folder was a
traceback."""

import os
import shutil

import pytest
from hostile_cli import PATCHED_LOADER, contents, run_cli

PYC = ("loader.cpython-311.pyc", "loader.cpython-312.pyc", "loader.cpython-311.opt-1.pyc")
# (command, how many times it checks vllm/loader.py (measured on this code and on the code before the
# fix: each check is a case), whether patches are applied first)
COMMANDS = [("status", 3, True), ("revert", 5, True), ("apply", 3, False)]
CASES = [
    (what, command, at, applied)
    for what in ("file", "pycache", "folder")
    for command, checks, applied in COMMANDS
    for at in range(1, checks + 1)
]


def _bytecode(folder):
    folder.mkdir(exist_ok=True)
    for name in PYC:
        (folder / name).write_bytes(b"\x00bytecode of " + name.encode())


def _mark_unread(outside):
    """Every file and folder outside with atime 0, older than its mtime: the next read (or listing)
    of it sets its atime (relatime), so a read through the link shows."""
    marked = [outside, *outside.rglob("*")]
    for path in marked:
        st = os.stat(path)
        os.utime(path, ns=(0, st.st_mtime_ns))
    return marked


@pytest.mark.parametrize("what,command,at,applied", CASES, ids=[f"{w}-{c}-{n}" for w, c, n, _ in CASES])
def test_a_name_swapped_for_a_link_out_between_check_and_use_is_never_followed(
    case, site, store, tmp_path, what, command, at, applied
):
    c = case("tree: final name swapped (race)")
    _bytecode(site / "vllm/__pycache__")
    if applied:
        assert run_cli("apply", "vllm", "--target", str(site), "--store", str(store)).code == 0
        _bytecode(site / "vllm/__pycache__")  # apply removed the stale bytecode: put some back
    outside = c.outside
    (outside / "patched.py").write_text(PATCHED_LOADER)
    os.chmod(outside / "patched.py", 0o4751)  # a mode no tree file should ever take from it
    _bytecode(outside / "pycache")
    shutil.copytree(site / "vllm", outside / "package", symlinks=True)
    c.before = contents(outside)
    marker = tmp_path / "swapped"
    swap = {"site": str(site), "outside": str(outside), "rel": "vllm/loader.py", "at": at, "what": what, "marker": str(marker)}
    extra = ["--store", str(store)] if command == "apply" else []
    unread = _mark_unread(outside)
    out = run_cli(command, "vllm", "--target", str(site), *extra, swap=swap)
    read = sorted(str(p.relative_to(outside)) for p in unread if not p.exists() or os.stat(p).st_atime_ns != 0)
    out = c.record(out)  # (reads outside itself: after the atimes were looked at)
    assert not read, f"read (or removed) through the link: {read}"
    assert marker.exists(), "the command never checked the path that often: the case tests nothing"
    # Exit 3 naming the link when the command still had to use the name; exit 0 when the swap came
    # after its last use (status's last check, a record's re-read). Never read or written through.
    assert out.code in (0, 3), out
    assert out.code == 0 or "outside the tree" in out.message, out
    for path in site.rglob("*"):  # nothing of outside's was copied in, nor its mode
        if path.is_file() and not path.is_symlink():
            assert path.stat().st_mode & 0o7000 == 0, path
