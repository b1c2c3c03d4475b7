"""A fresh matrix merged into the committed one, keeping its evidence.

A fresh check-only matrix goes into the committed compat_matrix.yaml without losing evidence
(ci/merge_matrix.py is its command line; the nightly workflow runs it).

For every fresh row whose artifact sha256 equals the committed row's, each cell whose outcome,
variant and `checked` fingerprint (the variant's bytes and the patch's checks) are unchanged keeps
the committed `evidence` and `smoke` (a fresh cell that carries its own `smoke` wins); a refreshed
variant or a changed check is smoke-tested again. Rows of new or changed artifacts take the fresh
result and go to the smoke to-do list (each engine's nightly first). Smoke parts (`patchctl matrix
--version V --smoke` runs) add their cells' smoke evidence to the rows the fresh run wrote, where
outcome, variant and fingerprint agree. Rows only in the committed file are kept. Per-run noise
(`seconds`, `bytes_fetched`) goes to the run log, never into the merged document: merging the same
inputs twice gives the same document.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import Path

from patchctl.matrix import build as matrix

NOISE = ("seconds", "bytes_fetched")
KEPT = ("evidence", "smoke")
SAME = ("outcome", "variant", "checked")  # what the kept evidence was made with


def merge_keeping_evidence(committed: dict | None, fresh: dict, part: bool = False) -> tuple[dict, list[dict], list[dict]]:
    """(merged document, smoke to-do list, run log entries). part: a smoke run of a few rows (the
    --smoke-dir files), whose nightly note counts only where it carries the nightly row."""
    merged: dict = copy.deepcopy(committed) if committed else {"schema": matrix.SCHEMA, "engines": {}}
    todo: list[dict] = []
    log: list[dict] = []
    for engine, data in fresh["engines"].items():
        target = merged["engines"].setdefault(engine, {"patches": [], "evidence": {}, "versions": {}})
        target["patches"] = list(data["patches"])
        target["evidence"] = copy.deepcopy(data.get("evidence", {}))
        # A part made with --no-nightly (a smoke run of a few releases) says "skipped: disabled": that
        # must not replace what the full run found.
        if "nightly" in data and (not part or "nightly" in data["versions"]):
            target["nightly"] = data["nightly"]
        for version, row in data["versions"].items():
            row = copy.deepcopy(row)
            log.append({"engine": engine, "version": version, **{k: row.pop(k) for k in NOISE if k in row}})
            old = target["versions"].get(version)
            if part and old is not None and not row.get("error"):
                # A smoke part adds evidence to the row the full run wrote (its artifact stays: the
                # smoke's trees come from the release's sdist whatever artifact the check read).
                for patch, cell in (row.get("patches") or {}).items():
                    into = (old.get("patches") or {}).get(patch)
                    if "smoke" in cell and into and all(into.get(k) == cell.get(k) for k in SAME):
                        into.update({key: cell[key] for key in KEPT if key in cell})
                continue
            same_artifact = bool(old and row.get("sha256") and old.get("sha256") == row.get("sha256"))
            stale = not same_artifact or bool(row.get("error"))
            for patch, cell in (row.get("patches") or {}).items():
                old_cell = ((old or {}).get("patches") or {}).get(patch) if same_artifact else None
                if "smoke" in cell:
                    continue  # a fresh smoke result
                if old_cell and all(old_cell.get(k) == cell.get(k) for k in SAME):
                    for key in KEPT:
                        if key in old_cell:
                            cell[key] = old_cell[key]
                else:
                    stale = True
            if stale and not row.get("error"):
                todo.append({"engine": engine, "version": version})
            target["versions"][version] = row
        for row in target["versions"].values():
            for key in NOISE:
                row.pop(key, None)
        target["versions"] = dict(sorted(target["versions"].items(), key=lambda kv: matrix._version_key(kv[0])))
    todo.sort(key=lambda j: (j["engine"], j["version"] != "nightly"))
    return merged, todo, log


def merge_files(
    committed: dict | None, fresh: Iterable[Path], parts: Iterable[Path] = ()
) -> tuple[dict | None, list[dict], list[dict]]:
    """The committed document with each fresh file, then each smoke part, merged in, in order:
    (document, smoke to-do list without repeats, run log)."""
    doc, todo, log = committed, [], []
    fresh, parts = list(fresh), list(parts)
    for path in [*fresh, *parts]:
        doc, more, entries = merge_keeping_evidence(doc, matrix.load(path), part=path in parts)
        todo += [job for job in more if job not in todo]
        log += entries
    return doc, todo, log
