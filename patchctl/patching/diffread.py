"""A strict reader of git diffs: the bytes of a variant → one record per file diff, with its hunks.

It follows `git apply`'s own reading (apply.c: find_header, parse_git_diff_header,
parse_traditional_patch, parse_single_patch, parse_fragment), so that a variant means here what it
means to git, and it refuses, with a StoreError naming the line, what git would refuse and what
patchctl cannot do as git does: renames, copies, mode changes, symlinks, submodules, binary diffs,
quoted or odd file names, a file diffed twice, hunk lines beyond the header's counts, hunk headers
that disagree with each other, and a hunk with no context that git would place at the end of the
file. tests/patching/test_differential_git.py holds it to `git apply --check` and docs/patch-format.md
lists the refusals.

The reader works on the variant's lines as bytes (a line ends at b"\\n" only, as git's do); memory is
a small multiple of the variant's size, which the caller bounds (store.PATCH_MAX_BYTES).
"""

from __future__ import annotations

from typing import NamedTuple

from patchctl.core.errors import StoreError

# Hunk header numbers past this are refused: git keeps them in an unsigned long and converts the start
# to an int, so two readers of one header could disagree about where it points.
MAX_LINE_NUMBER = 2**31 - 1


class RawHunk(NamedTuple):
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: tuple[bytes, ...]  # the body: b" x\n", b"-x\n", b"+x\n", b"\n", b"\\ No newline..."
    leading: int  # context lines before the first change (git's frag->leading)
    trailing: int  # context lines after the last change (frag->trailing)
    header: bytes
    line_number: int  # 1-based line of the header in the variant


class RawFile(NamedTuple):
    old_path: str | None  # None: the file is created
    new_path: str | None  # None: the file is deleted
    hunks: tuple[RawHunk, ...]
    line_number: int  # 1-based line where this file's diff starts


_MODE_LINES = (b"old mode ", b"new mode ")
_RENAME_LINES = (b"copy from ", b"copy to ", b"rename old ", b"rename new ", b"rename from ", b"rename to ")
_KNOWN_HEADER_LINES = (
    b"--- ",
    b"+++ ",
    b"old mode ",
    b"new mode ",
    b"deleted file mode ",
    b"new file mode ",
    *_RENAME_LINES,
    b"similarity index ",
    b"dissimilarity index ",
    b"index ",
)


def split_lines(data: bytes) -> list[bytes]:
    """Lines ending at b"\\n" only (bytes.splitlines also splits at \\r, \\x0b, \\x0c, \\x1c..., which
    git does not); the last one may lack its newline."""
    lines = data.split(b"\n")
    last = lines.pop()
    out = [line + b"\n" for line in lines]
    if last:
        out.append(last)
    return out


class _Reader:
    def __init__(self, data: bytes, where: str):
        self.where = where
        self.lines = split_lines(data)
        # rest[i]: bytes from the start of line i to the end of the input (git's `size`)
        rest = [0] * (len(self.lines) + 1)
        for i in range(len(self.lines) - 1, -1, -1):
            rest[i] = rest[i + 1] + len(self.lines[i])
        self.rest = rest

    def fail(self, line: int, message: str) -> StoreError:
        return StoreError(f"{self.where}: line {line + 1}: {message}")

    def read(self) -> list[RawFile]:
        files: list[RawFile] = []
        i = 0
        while True:
            found = self._find_header(i)
            if found is None:
                break
            start, body, old_path, new_path, is_new, is_delete, metadata = found
            hunks, i = self._hunks(body, is_new, is_delete, old_path or new_path or "")
            if not hunks:
                if i < len(self.lines):
                    line = self.lines[i]
                    if _binary_marker(line):
                        raise self.fail(i, f"binary diffs are not supported ({old_path or new_path})")
                if not metadata:
                    raise self.fail(start, f"a diff of {old_path or new_path} with no hunk (only garbage after its header)")
            self._after_hunks(i, bool(hunks))
            files.append(RawFile(None if is_new else old_path, None if is_delete else new_path, tuple(hunks), start + 1))
        if not files:
            raise StoreError(f"{self.where}: contains no file diffs")
        return files

    # -- finding the next file diff (git's find_header) ------------------------------------------
    def _find_header(self, i: int) -> tuple[int, int, str | None, str | None, bool, bool, bool] | None:
        lines, n = self.lines, len(self.lines)
        while i < n:
            line = lines[i]
            if len(line) < 6:
                i += 1
                continue
            if line.startswith(b"@@ -"):
                if _fragment_header(line) is not None:
                    raise self.fail(i, "a hunk outside any file diff (its diff --git / --- / +++ header is missing)")
                i += 1
                continue
            if self.rest[i] < len(line) + 6:
                return None
            if line.startswith(b"diff --git "):
                return self._git_header(i)
            if (
                line.startswith(b"--- ")
                and i + 1 < n
                and lines[i + 1].startswith(b"+++ ")
                and not self.rest[i] < len(lines[i + 1]) + 14
                and i + 2 < n
                and lines[i + 2].startswith(b"@@ -")
            ):
                return self._traditional_header(i)
            i += 1
        return None

    def _git_header(self, start: int) -> tuple[int, int, str | None, str | None, bool, bool, bool]:
        lines = self.lines
        first = lines[start]
        def_name = self._git_header_name(start, first[len(b"diff --git ") :])
        old_name: str | None = None
        new_name: str | None = None
        is_new = is_delete = False
        i = start + 1
        while i < len(lines):
            line = lines[i]
            if not line.endswith(b"\n"):
                break
            if line.startswith(b"@@ -"):
                break
            if not line.startswith(_KNOWN_HEADER_LINES):
                break  # git: an unrecognized line ends the header
            if line.startswith(_RENAME_LINES):
                raise self.fail(
                    i,
                    f"renames and copies are not supported ({line.decode(errors='replace').strip()}); "
                    "make the change as a deletion and a new file",
                )
            if line.startswith(_MODE_LINES):
                raise self.fail(i, f"mode changes are not supported ({line.decode(errors='replace').strip()})")
            if line.startswith(b"deleted file mode "):
                self._mode(i, line[len(b"deleted file mode ") :], allow_exec=True)
                is_delete = True
                old_name = def_name
            elif line.startswith(b"new file mode "):
                self._mode(i, line[len(b"new file mode ") :], allow_exec=False)
                is_new = True
                new_name = def_name
            elif line.startswith(b"index "):
                self._index_line(i, line[len(b"index ") :])
            elif line.startswith(b"--- "):
                old_name = self._verify_name(i, line[4:], is_new, old_name)
            elif line.startswith(b"+++ "):
                new_name = self._verify_name(i, line[4:], is_delete, new_name)
            if is_new and is_delete:
                raise self.fail(i, "inconsistent header lines: a file both created and deleted")
            i += 1
        if i == start + 1:
            if i < len(lines) and _binary_marker(lines[i]):
                raise self.fail(i, f"binary diffs are not supported ({def_name or 'a file'})")
            raise self.fail(start, "a diff --git line without its header (--- / +++ or new/deleted file mode)")
        if old_name is None and new_name is None:
            if def_name is None:
                raise self.fail(start, "the diff --git line names two different files and nothing else names the file")
            old_name = new_name = def_name
        if (new_name is None and not is_delete) or (old_name is None and not is_new):
            raise self.fail(start, "the diff header lacks a file name")
        if old_name is not None and new_name is not None and old_name != new_name:
            raise self.fail(start, f"renames are not supported ({old_name} -> {new_name})")
        name = old_name or new_name
        if def_name is not None and name != def_name or def_name is None:
            raise self.fail(start, f"the --- / +++ lines name {name}, the diff --git line does not")
        metadata = is_new or is_delete
        return start, i, old_name, new_name, is_new, is_delete, metadata

    def _git_header_name(self, at: int, rest: bytes) -> str | None:
        """git's git_header_name for `a/P b/P` (one leading component stripped); None when the two
        names differ. Quoted names are refused."""
        if rest.startswith(b'"'):
            raise self.fail(at, "quoted file names are not supported (a name with unusual characters)")
        if not rest.endswith(b"\n"):
            return None
        name = _skip_component(rest[:-1])
        if name is None:
            return None
        for length in range(len(name)):
            if name[length] in b" \t":
                second = _skip_component(name[length + 1 :])
                if second is not None and second == name[:length]:
                    return self._path(at, name[:length])
        return None

    def _verify_name(self, at: int, rest: bytes, is_null: bool, current: str | None) -> str | None:
        """git's gitdiff_verify_name for a --- / +++ line inside a git header."""
        if rest.startswith(b'"'):
            raise self.fail(at, "quoted file names are not supported (a name with unusual characters)")
        token = _name_token(rest)
        dev_null = token == b"/dev/null"
        if current is None and not is_null:
            if dev_null:
                raise self.fail(at, "/dev/null without a new file mode / deleted file mode line")
            return self._token_path(at, token)
        if current is not None:
            if is_null:
                raise self.fail(at, f"expected /dev/null, got {current}")
            if dev_null or self._token_path(at, token) != current:
                raise self.fail(at, "inconsistent file names in the diff header")
            return current
        if not dev_null:
            raise self.fail(at, "expected /dev/null")
        return None

    def _traditional_header(self, start: int) -> tuple[int, int, str | None, str | None, bool, bool, bool]:
        old, new = self.lines[start][4:], self.lines[start + 1][4:]
        for at, rest in ((start, old), (start + 1, new)):
            if rest.startswith(b'"'):
                raise self.fail(at, "quoted file names are not supported (a name with unusual characters)")
            tail = rest[len(_name_token(rest)) :]
            if b"1970-01-01" in tail or b"1969-12-31" in tail:
                raise self.fail(at, "an epoch timestamp meaning create or delete: say --- /dev/null or +++ /dev/null instead")
        old_token, new_token = _name_token(old), _name_token(new)
        if old_token == b"/dev/null" and new_token == b"/dev/null":
            raise self.fail(start, "both names are /dev/null")
        if old_token == b"/dev/null":
            return start, start + 2, None, self._token_path(start + 1, new_token), True, False, True
        if new_token == b"/dev/null":
            return start, start + 2, self._token_path(start, old_token), None, False, True, True
        old_path, new_path = self._token_path(start, old_token), self._token_path(start + 1, new_token)
        if old_path != new_path:
            raise self.fail(start, f"renames are not supported ({old_path} -> {new_path})")
        return start, start + 2, old_path, new_path, False, False, False

    def _token_path(self, at: int, token: bytes) -> str:
        name = _skip_component(token)
        if name is None or not name:
            raise self.fail(at, f"no file name after the leading a/ or b/ in {token.decode(errors='replace')!r}")
        return self._path(at, name)

    def _path(self, at: int, name: bytes) -> str:
        if any(c < 0x20 or c == 0x7F for c in name) or b" " in name:
            raise self.fail(at, f"refusing file name {name!r}: control characters or spaces")
        try:
            return name.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(at, "a file name that is not UTF-8") from None

    def _mode(self, at: int, text: bytes, *, allow_exec: bool) -> None:
        mode = text.strip()
        if mode == b"120000":
            raise self.fail(at, "symlinks are not supported (mode 120000)")
        if mode == b"160000":
            raise self.fail(at, "submodules are not supported (mode 160000)")
        if mode == b"100755" and not allow_exec:
            raise self.fail(at, "executable files are not supported (new file mode 100755)")
        if mode not in (b"100644", b"100755"):
            raise self.fail(at, f"unsupported file mode {mode.decode(errors='replace')!r}")

    def _index_line(self, at: int, text: bytes) -> None:
        """`index OLD..NEW [MODE]`: the hashes are not needed for text; a mode is checked."""
        body = text.rstrip(b"\n")
        if b" " in body:
            self._mode(at, body.split(b" ", 1)[1], allow_exec=True)

    # -- hunks (git's parse_single_patch / parse_fragment) ---------------------------------------
    def _hunks(self, i: int, is_new: bool, is_delete: bool, name: str) -> tuple[list[RawHunk], int]:
        lines, n = self.lines, len(self.lines)
        hunks: list[RawHunk] = []
        old_total = new_total = 0
        growth = 0
        old_end = 0
        while i < n and self.rest[i] > 4 and lines[i].startswith(b"@@ -"):
            header = lines[i]
            numbers = _fragment_header(header)
            if numbers is None:
                raise self.fail(i, f"corrupt hunk header {header.decode(errors='replace').strip()!r}")
            old_start, old_count, new_start, new_count = numbers
            if max(numbers) > MAX_LINE_NUMBER:
                raise self.fail(i, "a hunk header number too large")
            at = i
            i += 1
            old_left, new_left = old_count, new_count
            added = deleted = leading = trailing = 0
            body_start = i
            while i < n and (old_left or new_left):
                line = lines[i]
                if not line.endswith(b"\n"):
                    raise self.fail(i, "the variant ends inside a hunk (a line without its newline)")
                kind = line[:1]
                if kind in (b" ", b"\n"):
                    old_left -= 1
                    new_left -= 1
                    if not added and not deleted:
                        leading += 1
                    trailing += 1
                elif kind == b"-":
                    deleted += 1
                    old_left -= 1
                    trailing = 0
                elif kind == b"+":
                    added += 1
                    new_left -= 1
                    trailing = 0
                elif kind == b"\\":
                    if len(line) < 12 or not line.startswith(b"\\ "):
                        raise self.fail(i, "corrupt line in a hunk")
                else:
                    raise self.fail(
                        i,
                        f"a line in hunk {len(hunks) + 1} of {name} that is not context, - or + "
                        "(the hunk is shorter than its header says)",
                    )
                if old_left < 0 or new_left < 0:
                    raise self.fail(i, f"hunk {len(hunks) + 1} of {name} has more lines than its header counts")
                i += 1
            if old_left or new_left:
                raise self.fail(at, f"hunk {len(hunks) + 1} of {name} is shorter than its header counts")
            if not added and not deleted:
                raise self.fail(at, f"hunk {len(hunks) + 1} of {name} changes nothing")
            if i < n and self.rest[i] > 12 and lines[i].startswith(b"\\ "):
                i += 1
            # Where each range starts, 0-based (an empty range names the line before it).
            old_at = old_start - 1 if old_count else old_start
            new_at = new_start - 1 if new_count else new_start
            if new_at - old_at != growth or old_at < old_end:
                raise self.fail(
                    at, f"hunk {len(hunks) + 1} of {name}: its header's line numbers disagree with the hunks before it"
                )
            if not old_count and old_start and not is_new:
                raise self.fail(
                    at,
                    f"hunk {len(hunks) + 1} of {name} only adds lines and has no context: git "
                    "would put them at the end of the file (a diff made with -U0?)",
                )
            growth += new_count - old_count
            old_end = old_at + old_count
            old_total += old_count
            new_total += new_count
            hunks.append(
                RawHunk(old_start, old_count, new_start, new_count, tuple(lines[body_start:i]), leading, trailing, header, at + 1)
            )
        if is_new and old_total:
            raise self.fail(i - 1, f"new file {name} depends on old contents")
        if is_delete and new_total:
            raise self.fail(i - 1, f"deleted file {name} still has contents")
        return hunks, i

    def _after_hunks(self, i: int, had_hunks: bool) -> None:
        """What follows a file's last hunk must not look like more of it: git would drop such lines
        silently (they are past the header's counts); a signature (`-- `) and blank lines are fine."""
        if not had_hunks:
            return
        lines, n = self.lines, len(self.lines)
        while i < n and lines[i] == b"\n":
            i += 1
        if i >= n:
            return
        line = lines[i]
        if line in (b"-- \n", b"-- "):
            return
        if line.startswith(b"--- ") and i + 1 < n and lines[i + 1].startswith(b"+++ "):
            return
        if line[:1] in (b" ", b"+", b"-", b"\\") or line.startswith(b"@@"):
            raise self.fail(i, "a hunk has more lines than its header counts (or a corrupt hunk header follows)")


def _binary_marker(line: bytes) -> bool:
    return line == b"GIT binary patch\n" or line.endswith(b" differ\n")


def _skip_component(name: bytes) -> bytes | None:
    """Strip one leading path component (`a/`, `b/`), as git's -p1; None when there is none."""
    slash = name.find(b"/")
    if slash <= 0:
        return None
    return name[slash + 1 :]


def _name_token(rest: bytes) -> bytes:
    """The name on a --- / +++ line: up to a tab (or other whitespace but the space) or the end."""
    end = len(rest)
    for stop in (b"\t", b"\n", b"\r", b"\x0b", b"\x0c"):
        found = rest.find(stop)
        if found != -1:
            end = min(end, found)
    return rest[:end]


def _number(text: bytes, pos: int) -> tuple[int, int] | None:
    end = pos
    while end < len(text) and 0x30 <= text[end] <= 0x39:
        end += 1
    if end == pos or end - pos > 18:
        return None if end == pos else (MAX_LINE_NUMBER + 1, end)
    return int(text[pos:end]), end


def _range(text: bytes, pos: int, expect: bytes) -> tuple[int, int, int] | None:
    first = _number(text, pos)
    if first is None:
        return None
    start, pos = first
    count = 1
    if text[pos : pos + 1] == b",":
        second = _number(text, pos + 1)
        if second is None:
            return None
        count, pos = second
    if text[pos : pos + len(expect)] != expect:
        return None
    return start, count, pos + len(expect)


def _fragment_header(line: bytes) -> tuple[int, int, int, int] | None:
    """`@@ -a[,b] +c[,d] @@...` as git's parse_fragment_header reads it; None when it is not one."""
    if not line.endswith(b"\n") or not line.startswith(b"@@ -"):
        return None
    old = _range(line, 4, b" +")
    if old is None:
        return None
    new = _range(line, old[2], b" @@")
    if new is None:
        return None
    return old[0], old[1], new[0], new[1]


def read_diff(data: bytes, where: str) -> list[RawFile]:
    """Every file diff of a variant, in order; StoreError for anything git would refuse or that
    patchctl cannot apply as git does."""
    return _Reader(data, where).read()
