"""Issue 33 item 4 (the bytecode half): a write stopped by a permission error in `__pycache__` (the
service user may write the package folder but not its bytecode folder, root's) is rolled back, and
the restored source gets its original mtime back, so the .pyc beside it stays valid (Python checks
the mtime and size in its header: importlib's own check is used here). Before the fix the rollback
rewrote the source, stopped at the bytecode, and left the new mtime; the next recovery saw the right
bytes and skipped the file, so the bytecode stayed stale for good; and the hint said "free space"
for a permission error.

Real permissions: the command runs as uid 65534 (support.invoke.as_nobody), root only."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from importlib._bootstrap_external import _code_to_timestamp_pyc, _validate_timestamp_pyc  # type: ignore
from pathlib import Path

import pytest
from support.builders import StoreBuilder, write_tree
from support.fixtures import PRISTINE, loader_with
from support.invoke import as_nobody, run_json

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a switch to another user")

PATCHED = {
    "vllm/loader.py": loader_with({10: "ten\n"}),
    "vllm/utils.py": PRISTINE["vllm/utils.py"].replace("return 2", "return 3"),
}
OLD_MTIME = 1_600_000_000  # the sources' mtime before the command: any rewrite gives a new one
# (the modules that have bytecode, its optimisation levels)
BYTECODE = {
    "loader": (("vllm/loader.py",), ("",)),
    "loader+utils": (("vllm/loader.py", "vllm/utils.py"), ("",)),
    "loader+utils,opt-1": (("vllm/loader.py", "vllm/utils.py"), ("", 1)),
}
CASES = [(command, which) for command in ("apply", "revert") for which in BYTECODE]


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder uid 65534 can reach (pytest's tmp_path is root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="patchctl-pyc-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base)


def compile_beside(tree: Path, rel: str, optimization) -> Path:
    """A .pyc of `rel` as Python writes one: valid for the source's mtime and size now."""
    source = tree / rel
    pyc = Path(importlib.util.cache_from_source(str(source), optimization=optimization))
    pyc.parent.mkdir(exist_ok=True)
    st = source.stat()
    pyc.write_bytes(bytes(_code_to_timestamp_pyc(compile("", str(source), "exec"), int(st.st_mtime), st.st_size)))
    return pyc


def stale(pyc: Path, source: Path) -> str | None:
    """Why Python would not use `pyc` for `source` (None: it would)."""
    st = source.stat()
    try:
        _validate_timestamp_pyc(pyc.read_bytes(), int(st.st_mtime), st.st_size, source.name, {})
    except ImportError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("command,which", CASES, ids=[f"{c}-{w}" for c, w in CASES])
def test_a_permission_error_in_pycache_leaves_the_source_with_its_mtime(shared, command, which):
    store = shared / "store"
    b = StoreBuilder(store)
    b.add("vllm", "loader", variants={"1.0": b.variant(PRISTINE, {"vllm/loader.py": PATCHED["vllm/loader.py"]})})
    b.add("vllm", "utils", variants={"1.0": b.variant(PRISTINE, {"vllm/utils.py": PATCHED["vllm/utils.py"]})})
    home = shared / "home"
    home.mkdir(mode=0o777)
    home.chmod(0o777)
    # Every module the commands import, loaded as root before the switch (as_nobody forks this process).
    scratch = write_tree(shared / "scratch", PRISTINE)
    for args in (["apply", "--store", str(store)], ["status"], ["revert"]):
        run_json(args[0], "vllm@1.0", "--target", str(scratch), *args[1:], expect=0)

    tree = write_tree(shared / "tree", PRISTINE)
    if command == "revert":
        run_json("apply", "vllm@1.0", "--target", str(tree), "--store", str(store), expect=0)
    modules, levels = BYTECODE[which]
    for rel in modules:
        os.utime(tree / rel, (OLD_MTIME, OLD_MTIME))
    pycs = {rel: [compile_beside(tree, rel, level) for level in levels] for rel in modules}
    before = {rel: ((tree / rel).read_bytes(), (tree / rel).stat().st_mtime_ns) for rel in modules}
    bytecode = {pyc: pyc.read_bytes() for found in pycs.values() for pyc in found}
    for rel in modules:
        assert all(stale(pyc, tree / rel) is None for pyc in pycs[rel])
    subprocess.run(["chown", "-R", "65534:65534", str(tree)], check=True)
    os.chown(tree / "vllm/__pycache__", 0, 0)  # root's, 0755: the service user cannot change it

    code, doc = as_nobody(
        command,
        "vllm@1.0",
        "--target",
        str(tree),
        *(["--store", str(store)] if command == "apply" else []),
        home=home,
        warm=False,
    )
    assert code == 3 and "Permission denied" in doc["error"]["message"], doc
    hint = doc["error"]["hint"] or ""
    assert "permission" in hint and "free space" not in hint, hint

    # The next command (the permission still wrong) finishes what the rollback left.
    code, doc = as_nobody("status", "vllm", "--target", str(tree), "--as-version", "1.0", home=home, warm=False)
    assert code == 0 and not (tree / ".patchctl/vllm/journal.json").exists(), doc
    for rel in modules:
        source = tree / rel
        assert (source.read_bytes(), source.stat().st_mtime_ns) == before[rel], f"{rel}: not as it was"
        for pyc in pycs[rel]:
            assert pyc.read_bytes() == bytecode[pyc], f"{pyc.name} changed"
            assert stale(pyc, source) is None, f"{pyc.name}: {stale(pyc, source)}"
