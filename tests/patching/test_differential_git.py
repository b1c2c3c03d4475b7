"""The strict diff reader and the matcher against `git apply`: generated variants (made by git from a
random base and a random edit of it) and hypothesis-fuzzed ones (those, mutated) are applied to their
own base with exact context. patchctl must never accept what `git apply --check` refuses; where both
accept, the resulting files must be byte for byte git's; where git accepts and patchctl refuses, the
refusal must be one of the deliberate ones listed in docs/patch-format.md (CARVE_OUTS), each a
StoreError. Any other exception fails the test.

`pytest --hypothesis-show-statistics` prints how many examples fell in each class."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from patchctl.core.errors import StoreError
from patchctl.patching.hunks import apply_hunks, parse_variant

# What patchctl refuses although git may accept it (docs/patch-format.md, "What the reader refuses").
CARVE_OUTS = {
    "past the header's counts": ("more lines than its header counts",),
    "inconsistent hunk headers": ("line numbers disagree", "hunk header number too large"),
    "context-free insertion": ("only adds lines and has no context",),
    "a file twice": ("diffed twice",),
    "header structure": (
        "the --- / +++ lines name",
        "inconsistent file names",
        "names two different files",
        "without its header",
        "lacks a file name",
        "/dev/null",
        "renames are not supported",
        "no file name after",
        "both created and deleted",
        "epoch timestamp",
    ),
    "modes": ("mode changes are not supported", "unsupported file mode", "executable files", "symlinks", "submodules"),
    "names": ("refusing file name", "refusing path", "refusing absolute", "quoted file names", "a file name that is not UTF-8"),
    "encoding": ("CRLF", "not UTF-8"),
}

GIT_ENV = {
    **os.environ,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "HOME": tempfile.gettempdir(),
    "LC_ALL": "C",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@localhost",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@localhost",
}
LINES = ["a\n", "b\n", "c\n", "", "\n", "    pass\n", "x = 1\n", "\x0cpage\n", "tab\there\n", "a\rb\n", "é\n", "return x\n"]


def git(cwd: Path, *args: str, data: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, input=data, capture_output=True, env=GIT_ENV, timeout=60)


def write(root: Path, files: dict[str, bytes]) -> None:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)


def read(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and ".git" not in p.parts
    }


file_text = (
    st.lists(st.sampled_from(LINES), min_size=0, max_size=14)
    .map("".join)
    .flatmap(lambda text: st.sampled_from([text, text.rstrip("\n")]) if text else st.just(text))
)


@st.composite
def base_and_edit(draw) -> tuple[dict[str, bytes], dict[str, bytes | None]]:
    names = draw(st.lists(st.sampled_from(["vllm/f0.py", "vllm/f1.py", "vllm/sub/f2.py"]), min_size=1, max_size=3, unique=True))
    base = {name: draw(file_text).encode() for name in names}
    edit: dict[str, bytes | None] = {}
    for name in names:
        how = draw(st.sampled_from(["edit", "edit", "edit", "keep", "delete"]))
        if how == "delete":
            edit[name] = None
        elif how == "edit":
            lines = base[name].decode().split("\n")
            for _ in range(draw(st.integers(1, 3))):
                pos = draw(st.integers(0, len(lines)))
                op = draw(st.sampled_from(["insert", "replace", "remove"]))
                new = draw(st.sampled_from(LINES)).rstrip("\n")
                if op == "insert" or not lines:
                    lines.insert(pos, new)
                elif op == "replace":
                    lines[min(pos, len(lines) - 1)] = new
                else:
                    del lines[min(pos, len(lines) - 1)]
            edit[name] = "\n".join(lines).encode()
    if draw(st.booleans()):
        edit["vllm/new.py"] = draw(file_text).encode()
    return base, edit


def make_diff(work: Path, base: dict[str, bytes], edit: dict[str, bytes | None]) -> bytes:
    """The diff git writes from base to base+edit (the format-patch body), behind a mail header."""
    repo = work / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    write(repo, base)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", "base")
    for rel, content in edit.items():
        if content is None:
            (repo / rel).unlink()
        else:
            write(repo, {rel: content})
    git(repo, "add", "-A")
    diff = git(repo, "diff", "--cached", "--full-index", "--no-renames", "--no-color").stdout
    return b"From 0 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] generated\n\n---\n" + diff


def git_result(work: Path, base: dict[str, bytes], data: bytes) -> dict[str, bytes] | None:
    """The tree `git apply` makes (outside any repository, as a patch tool), None when
    `git apply --check` refuses the variant."""
    tree = work / "git-tree"
    tree.mkdir()
    write(tree, base)
    (work / "v.patch").write_bytes(data)
    if git(tree, "apply", "--check", str(work / "v.patch")).returncode != 0:
        return None
    applied = git(tree, "apply", str(work / "v.patch"))
    assert applied.returncode == 0, applied.stderr
    return read(tree)


def patchctl_result(base: dict[str, bytes], data: bytes) -> dict[str, bytes] | StoreError | None:
    """The tree patchctl makes: parse, then every file's hunks with exact context (max_fuzz=0);
    None when a hunk does not apply (or a created file exists, a changed one is missing)."""
    try:
        parsed = parse_variant(data, "v")
    except StoreError as exc:
        return exc
    tree = dict(base)
    for fp in parsed.files:
        before = tree.get(fp.path)
        if fp.is_new and before is not None:
            return None
        text = None if before is None else before.decode("utf-8", errors="surrogateescape")
        result = apply_hunks(text, fp, max_fuzz=0)
        if not result.ok:
            return None
        if result.text is None:
            tree.pop(fp.path, None)
        else:
            tree[fp.path] = result.text.encode("utf-8", errors="surrogateescape")
    return tree


def compare(base: dict[str, bytes], data: bytes, label: str) -> None:
    with tempfile.TemporaryDirectory(prefix="patchctl-diff-") as tmp:
        theirs = git_result(Path(tmp), base, data)
    ours = patchctl_result(base, data)
    if isinstance(ours, StoreError):
        if theirs is None:
            event(f"{label}: both refuse")
            return
        kind = next((name for name, words in CARVE_OUTS.items() if any(w in ours.message for w in words)), None)
        assert kind is not None, f"git accepts, patchctl refuses outside the documented refusals: {ours.message}"
        event(f"{label}: git accepts, patchctl refuses ({kind})")
        return
    if theirs is None:
        assert ours is None, "patchctl accepts what git apply --check refuses"
        event(f"{label}: both refuse")
        return
    assert ours is not None, "git apply accepts, patchctl's exact apply fails"
    assert ours == theirs, "patchctl's bytes differ from git's"
    event(f"{label}: both accept, same bytes")


def fast(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@fast(40)
@given(base_and_edit())
def test_generated_variants_apply_as_git_applies_them(case):
    base, edit = case
    with tempfile.TemporaryDirectory(prefix="patchctl-gen-") as tmp:
        data = make_diff(Path(tmp), base, edit)
    if b"diff --git" not in data:
        event("generated: no change")
        return
    # A variant git itself wrote is never refused, and applies to its own base as git applies it.
    parsed = parse_variant(data, "v")
    assert parsed.files
    compare(base, data, "generated")


MUTATION_LINES = [
    b"+x\n",
    b"-a\n",
    b" a\n",
    b"\n",
    b"\\ No newline at end of file\n",
    b"@@ -1 +1 @@\n",
    b"@@ -1,2 +1,2 @@\n",
    b"--- a/vllm/f0.py\n",
    b"+++ b/vllm/f0.py\n",
    b"diff --git a/vllm/f0.py b/vllm/f0.py\n",
    b"old mode 100644\n",
    b"new file mode 100644\n",
    b"deleted file mode 100644\n",
    b"index 0000000..1111111 100644\n",
    b"garbage\n",
    b"-- \n",
    b"rename from vllm/f0.py\n",
    b"new file mode 120000\n",
]


@st.composite
def mutated(draw) -> tuple[dict[str, bytes], bytes]:
    base, edit = draw(base_and_edit())
    with tempfile.TemporaryDirectory(prefix="patchctl-mut-") as tmp:
        data = make_diff(Path(tmp), base, edit)
    lines = data.split(b"\n")
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, max(len(lines) - 1, 0)))
        op = draw(st.sampled_from(["number", "number", "delete", "duplicate", "insert", "insert", "prefix", "byte", "truncate"]))
        line = lines[i] if lines else b""
        if op == "number" and line.startswith(b"@@"):
            digits = [k for k, c in enumerate(line) if 0x30 <= c <= 0x39]
            if digits:
                k = draw(st.sampled_from(digits))
                line = line[:k] + draw(st.sampled_from([b"0", b"1", b"2", b"5", b"9", b"12", b""])) + line[k + 1 :]
                lines[i] = line
        elif op == "delete" and lines:
            del lines[i]
        elif op == "duplicate" and lines:
            lines.insert(i, line)
        elif op == "insert":
            lines.insert(i, draw(st.sampled_from(MUTATION_LINES)).rstrip(b"\n"))
        elif op == "prefix" and line:
            lines[i] = draw(st.sampled_from([b" ", b"+", b"-", b"\\", b"@"])) + line[1:]
        elif op == "byte" and line:
            k = draw(st.integers(0, len(line) - 1))
            lines[i] = line[:k] + draw(st.sampled_from([b"a", b" ", b"/", b"\t", b"\x00", b"0", b"."])) + line[k + 1 :]
        elif op == "truncate":
            lines = lines[: i + 1]
    return base, b"\n".join(lines)


@fast(90)
@given(mutated())
def test_fuzzed_variants_never_mean_more_to_patchctl_than_to_git(case):
    base, data = case
    compare(base, data, "fuzzed")
