"""Item 8 of issue 23, in the tree itself (the bookkeeping's FIFOs are test_bookkeeping.py's): a FIFO
where patchctl reads a file of the tree — a patched file, a file of the package RECORD lists, the
dist-info's METADATA, RECORD, direct_url.json — under `status`, `new`, `apply` and `revert`. Every
case ends within its timeout with a clean exit code (no hang, no traceback, nothing outside
written), and a command that reads that file says it is not a regular file (exit 3). Before the
fix a FIFO METADATA hung every command (read by version_of_tree), a FIFO RECORD or direct_url.json
was skipped as absent (`status` then lists nothing, exit 0), and `new` took a FIFO patched file for
a deleted one."""

import os

import pytest
from hostile_cli import run_cli
from support.builders import write_tree

INFO = "vllm-1.0.dist-info"
# The file replaced by a FIFO, and the commands that must read it (the others may not need it).
FILES = {
    "patched file": ("vllm/loader.py", {"status", "new", "apply", "revert"}),
    "unpatched file RECORD lists": ("vllm/plain.py", {"status", "new"}),
    "METADATA": (f"{INFO}/METADATA", {"status", "new", "apply", "revert"}),
    "RECORD": (f"{INFO}/RECORD", {"status", "new"}),
    "direct_url.json": (f"{INFO}/direct_url.json", {"status", "new", "apply", "revert"}),
}
COMMANDS = ["status", "new", "apply", "revert"]


def args(command, site, store, new_store):
    if command == "apply":
        return ["apply", "vllm", "--target", str(site), "--store", str(store)]
    if command == "new":
        return ["new", "vllm", "by-hand", "--target", str(site), "--store", str(new_store)]
    return [command, "vllm", "--target", str(site)]


@pytest.fixture
def fifo_site(site, store):
    """The hostile fixtures' tree with one more module RECORD lists, a direct_url.json, the store's
    patches applied (so there is a record and patched files) and one hand edit for `new`."""
    from support.builders import install_fake_dist
    from support.fixtures import PRISTINE

    files = dict(PRISTINE, **{"vllm/plain.py": "PLAIN = 1\n"})
    install_fake_dist(site, "vllm", "1.0", files)
    write_tree(site, {f"{INFO}/direct_url.json": '{"url": "file:///wheels/vllm-1.0.whl", "archive_info": {}}'})
    assert run_cli("apply", "vllm", "--target", str(site), "--store", str(store)).code == 0
    (site / "vllm/__init__.py").write_text("# a hand edit\n")
    return site


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("klass", list(FILES))
def test_a_fifo_in_place_of_a_tree_file_is_refused_not_read(case, fifo_site, store, tmp_path, klass, command):
    rel, readers = FILES[klass]
    c = case("tree: FIFO in place of a file")
    os.replace(fifo_site / rel, tmp_path / "kept") if (fifo_site / rel).exists() else None
    os.mkfifo(fifo_site / rel)
    out = c.record(run_cli(*args(command, fifo_site, store, tmp_path / "new-store"), timeout=30))
    if command in readers:
        assert out.code == 3 and "not a regular file" in out.message and rel in out.message, out
    else:
        assert out.code in (0, 1, 3), out
        if out.code == 3:
            assert "not a regular file" in out.message, out


@pytest.mark.parametrize("klass", ["patched file", "METADATA"])
def test_a_fifo_in_a_directory_upstream_is_refused_not_read(case, site, store, klass):
    """`check vllm@DIR` reads the directory as an upstream (sources.files.DirectorySource and
    installed.version_of_tree): before, both read by path, so a FIFO there hung `check`."""
    from support.builders import install_fake_dist
    from support.fixtures import PRISTINE

    install_fake_dist(site, "vllm", "1.0", PRISTINE)
    rel = FILES[klass][0]
    c = case("directory upstream: FIFO in place of a file")
    os.unlink(site / rel)
    os.mkfifo(site / rel)
    out = c.record(run_cli("check", f"vllm@{site}", "--store", str(store), timeout=30))
    assert out.code == 3 and "not a regular file" in out.message and rel in out.message, out
