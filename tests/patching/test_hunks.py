import pytest
from support.builders import make_variant
from support.fixtures import PRISTINE, loader_with

from patchctl.core.errors import StoreError
from patchctl.patching.hunks import apply_hunks, parse_variant


def variant(tmp_path, pristine, patched):
    return parse_variant(make_variant(tmp_path / "repo", pristine, patched, "subject line"), "test")


def test_subject_and_paths(tmp_path):
    parsed = variant(tmp_path, PRISTINE, {"vllm/loader.py": loader_with({20: "changed 20\n"})})
    assert parsed.subject == "subject line"
    assert parsed.paths == ("vllm/loader.py",)


def test_clean_offset_and_fuzz(tmp_path):
    parsed = variant(tmp_path, PRISTINE, {"vllm/loader.py": loader_with({20: "changed 20\n"})})
    fp = parsed.files[0]
    clean = apply_hunks(PRISTINE["vllm/loader.py"], fp)
    assert clean.ok and clean.hunks[0].status == "clean"
    assert "changed 20\n" in clean.text and "line 20\n" not in clean.text

    shifted = "extra\nextra\nextra\n" + PRISTINE["vllm/loader.py"]
    moved = apply_hunks(shifted, fp)
    assert moved.ok and moved.hunks[0].status == "offset" and moved.hunks[0].offset == 3

    # The first context line differs: only applies with reduced context, and says so.
    fuzzy_base = loader_with({17: "line seventeen\n"})
    fuzzy = apply_hunks(fuzzy_base, fp)
    assert fuzzy.ok and fuzzy.hunks[0].status == "fuzz" and fuzzy.hunks[0].fuzz == 1
    strict = apply_hunks(fuzzy_base, fp, max_fuzz=0)
    assert not strict.ok


def test_reverse_apply_recognises_applied_change(tmp_path):
    patched = loader_with({20: "changed 20\n"})
    fp = variant(tmp_path, PRISTINE, {"vllm/loader.py": patched}).files[0]
    assert not apply_hunks(patched, fp).ok
    back = apply_hunks(patched, fp, reverse=True)
    assert back.ok and back.text == PRISTINE["vllm/loader.py"]


def test_no_newline_at_end_of_file(tmp_path):
    pristine = {"vllm/x.py": "a\nb"}
    fp = variant(tmp_path, pristine, {"vllm/x.py": "a\nc"}).files[0]
    result = apply_hunks("a\nb", fp)
    assert result.ok and result.text == "a\nc"


def test_new_and_deleted_files(tmp_path):
    parsed = variant(tmp_path, PRISTINE, {"vllm/new.py": "x = 1\n", "vllm/utils.py": None})
    by_path = {f.path: f for f in parsed.files}
    assert by_path["vllm/new.py"].is_new and apply_hunks(None, by_path["vllm/new.py"]).text == "x = 1\n"
    gone = apply_hunks(PRISTINE["vllm/utils.py"], by_path["vllm/utils.py"])
    assert gone.ok and gone.text is None


def test_crlf_binary_and_escaping_paths_are_refused(tmp_path):
    data = make_variant(tmp_path / "r", PRISTINE, {"vllm/loader.py": loader_with({3: "x\n"})}, "s")
    with pytest.raises(StoreError, match="CRLF"):
        parse_variant(data.replace(b"\n", b"\r\n"), "v")
    with pytest.raises(StoreError, match="binary"):
        parse_variant(data + b"\ndiff --git a/b.bin b/b.bin\nGIT binary patch\nliteral 1\n", "v")
    escaping = data.replace(b"a/vllm/loader.py", b"a/../etc/passwd").replace(b"b/vllm/loader.py", b"b/../etc/passwd")
    with pytest.raises(StoreError, match="leaves the engine root"):
        parse_variant(escaping, "v")
    absolute = data.replace(b"--- a/vllm/loader.py", b"--- /etc/passwd").replace(b"+++ b/vllm/loader.py", b"+++ /etc/passwd")
    with pytest.raises(StoreError):
        parse_variant(absolute, "v")
    with pytest.raises(StoreError, match="no file diffs|not a parseable"):
        parse_variant(b"From x\nSubject: nothing\n\njust text\n", "v")
