"""proof.Record finds one row of a RECORD without parsing the rest (a warm read of a few members of
vLLM's ~5800-row RECORD): it must say what a whole parse says, for every name, on generated RECORDs
(duplicates, rows without a hash, names that need csv quoting, a CR, names that are prefixes of others)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io

from hypothesis import given, settings
from hypothesis import strategies as st

from patchctl.sources import proof, zipread

NAMES = st.sampled_from(["a.py", "a.py.bak", "vllm/a.py", "vllm/a,b.py", 'vllm/"q".py', "b.py", "x/a.py"])
ROWS = st.lists(st.tuples(NAMES, st.one_of(st.none(), st.binary(max_size=8))), max_size=12)


def _record(rows: list[tuple[str, bytes | None]], crlf: bool) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n" if crlf else "\n")
    for name, content in rows:
        digest = (
            "" if content is None else "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(content).digest()).decode().rstrip("=")
        )
        writer.writerow([name, digest, "" if content is None else len(content)])
    return out.getvalue().encode()


@settings(max_examples=300, deadline=None)
@given(rows=ROWS, crlf=st.booleans(), probe=NAMES)
def test_lookup_says_what_a_whole_parse_says(rows, crlf, probe):
    raw = _record(rows, crlf)
    listed = {row[0] for row in zipread.record_rows(raw) if row}
    expected = (probe in listed, zipread.record_hashes(raw).get(probe))
    assert proof.Record(raw).lookup(probe) == expected
    parsed = proof.parse(raw)  # parsed whole first: the same answer from the dictionaries
    assert parsed.lookup(probe) == expected


@settings(max_examples=100, deadline=None)
@given(rows=ROWS, probe=NAMES, data=st.one_of(st.none(), st.binary(max_size=8)))
def test_a_member_is_proven_only_by_the_hash_record_lists(rows, probe, data):
    raw = _record(rows, False)
    record = proof.Record(raw)
    listed, digest = record.lookup(probe)
    wrong = proof.problem(record, probe, data)
    if data is None:
        assert (wrong is None) == (not listed)
    elif digest is None:
        assert wrong == proof.UNPROVABLE
    else:
        assert (wrong is None) == (hashlib.sha256(data).hexdigest() == digest)
