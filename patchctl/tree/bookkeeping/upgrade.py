"""The on-disk formats of a target's bookkeeping, and the one place that knows their versions (as
stgit's stack/upgrade.rs does for its stack metadata).

state.json and journal.json each carry a `schema` tag, `<name>/<version>`. Reading one:
- its version is read first, before anything else of it is trusted;
- a version newer than this patchctl's is refused (exit 3) naming the file: a newer patchctl wrote it,
  and this one would misread it (that is not damage: the file is left as it is);
- an older version with an upgrade step is brought forward one version at a time, in memory (the
  next write stores today's version); an older one without a step is one no release wrote;
- the body, now in today's format, is then validated against its JSON schema
  (patchctl/core/schemas/state.json, journal.json).
Writing always stamps today's version. No upgrade step exists yet: 0.1.0, the first release, writes
patchctl-state/3 and patchctl-journal/2, and what came before it was never released.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from patchctl.core.errors import EnvironmentProblem
from patchctl.tree.bookkeeping.record import StateRecord, damaged, seal, unseal

Body = dict[str, Any]


class Format(NamedTuple):
    """One on-disk document: its sealed kind (the key its body sits under), its tag's name, today's
    version, the JSON schema (patchctl/core/schemas/) of today's version, and the upgrade steps:
    version N -> a function turning a body of version N into one of version N+1."""

    kind: str
    name: str
    version: int
    schema: str
    steps: Mapping[int, Callable[[Body], Body]] = MappingProxyType({})

    @property
    def tag(self) -> str:
        return f"{self.name}/{self.version}"


RECORD = Format("record", "patchctl-state", 3, "state")
JOURNAL = Format("journal", "patchctl-journal", 2, "journal")


def current(fmt: Format, body: Body, where: Path, hint: str) -> Body:
    """`body` (a document of `fmt`'s, read from `where`) in today's version and validated; refused
    when a newer patchctl wrote it, damaged when its tag is no version of `fmt`'s."""
    from patchctl.core.schemas import problem

    tag = body.get("schema")
    name, _, number = tag.rpartition("/") if isinstance(tag, str) else ("", "", "")
    if name != fmt.name or not number.isdigit() or number != str(int(number)):
        raise damaged(where, f"its format {tag!r} is not {fmt.name}/N", hint)
    version = int(number)
    if version > fmt.version:
        raise EnvironmentProblem(
            f"{where} is in format {tag}, written by a newer patchctl; this one reads {fmt.tag} and older, and "
            f"will not guess at what the newer one recorded",
            hint="run the patchctl that wrote it (or a newer one): `pip install -U patchctl`",
        )
    while version < fmt.version:
        step = fmt.steps.get(version)
        if step is None:
            raise damaged(where, f"its format {tag} is older than any release of patchctl wrote", hint)
        body = step(body)
        version += 1
        body["schema"] = f"{fmt.name}/{version}"
    wrong = problem(fmt.schema, body)
    if wrong is not None:
        raise damaged(where, wrong, hint)
    return body


def read_record(raw: bytes, where: Path, hint: str) -> StateRecord:
    """A state.json's bytes as today's record (`where`: the file, for messages; `hint`: the way out
    of a damaged one)."""
    return StateRecord.from_json(current(RECORD, unseal(RECORD.kind, raw, where, hint), where, hint))


def write_record(record: StateRecord) -> bytes:
    return seal(RECORD.kind, {"schema": RECORD.tag, **record.to_json()})


def read_journal(raw: bytes, where: Path, hint: str) -> Body:
    """A journal.json's bytes as today's journal body."""
    return current(JOURNAL, unseal(JOURNAL.kind, raw, where, hint), where, hint)


def write_journal(body: Body) -> bytes:
    return seal(JOURNAL.kind, {"schema": JOURNAL.tag, **body})
