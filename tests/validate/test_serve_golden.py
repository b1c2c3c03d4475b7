import json

import pytest

from patchctl.core.errors import UsageError
from patchctl.validate import golden
from patchctl.validate.client import OpenAIClient
from patchctl.validate.golden import GoldenEntry, GoldenRecord, diff_entry


def test_token_diff_reports_first_divergence():
    a = GoldenEntry("p", "abcd", ("a", "b", "c", "d"))
    b = GoldenEntry("p", "abxd", ("a", "b", "x", "d"))
    d = diff_entry(a, b)
    assert (d.matched, d.unit, d.position) == (False, "token", 2)
    assert (d.context, d.expected, d.got) == ("['a', 'b']", "['c', 'd']", "['x', 'd']")


def test_prefix_is_a_divergence_at_the_shorter_length():
    d = diff_entry(GoldenEntry("p", "", ("a", "b")), GoldenEntry("p", "", ("a",)))
    assert (d.matched, d.position, d.expected_len, d.got_len) == (False, 1, 2, 1)


def test_text_fallback_when_either_side_lacks_tokens():
    d = diff_entry(GoldenEntry("p", "hello world", None), GoldenEntry("p", "hello there", ("hello", " there")))
    assert (d.unit, d.position) == ("char", 6)
    assert (d.context, d.expected, d.got) == ("'hello '", "'world'", "'there'")
    assert diff_entry(GoldenEntry("p", "same", None), GoldenEntry("p", "same", None)).matched


def test_record_roundtrip(tmp_path):
    rec = GoldenRecord("m", "1.0", "completions", 4, (GoldenEntry("p", "t", ("t",)), GoldenEntry("q", "u", None)))
    path = rec.save(tmp_path / "g" / "golden.json")
    assert GoldenRecord.load(path) == rec


def test_record_then_compare_against_a_real_server(shape_server):
    client = OpenAIClient(shape_server.base_url)
    rec = golden.record(client, "v", prompts=("a", "bb"), max_tokens=8)
    assert all(e.tokens is not None and len(e.tokens) == 8 for e in rec.entries)
    assert all(d.matched for d in golden.compare(client, rec))

    shape_server.settings["shift_at"] = 5  # the patched engine drifts at token 5
    diffs = golden.compare(client, rec)
    assert [(d.matched, d.unit, d.position) for d in diffs] == [(False, "token", 5)] * 2
    assert diffs[0].got.startswith("[' DRIFT'")


@pytest.mark.parametrize(
    "text, why",
    [
        ("{not json", "Expecting property name"),
        ("[]", "JSON object, not list"),
        (json.dumps({"format": 2}), "format 2, expected 1"),
        (json.dumps({"format": 1, "model": "m"}), "no 'entries' key"),
        (
            json.dumps(
                {"format": 1, "model": "m", "engine_version": "1", "api": "completions", "max_tokens": 4, "entries": ["p"]}
            ),
            "not a list of objects",
        ),
        (
            json.dumps(
                {
                    "format": 1,
                    "model": "m",
                    "engine_version": "1",
                    "api": "completions",
                    "max_tokens": 4,
                    "entries": [{"prompt": 1, "text": "t"}],
                }
            ),
            "must be strings",
        ),
        (
            json.dumps({"format": 1, "model": "m", "engine_version": "1", "api": "chat?", "max_tokens": 4, "entries": []}),
            "api 'chat?'",
        ),
    ],
)
def test_a_file_that_is_not_a_golden_file_is_bad_input(tmp_path, text, why):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(UsageError, match="is not a golden file") as info:
        GoldenRecord.load(path)
    assert why in info.value.message and info.value.exit_code == 2
