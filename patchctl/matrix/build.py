"""Every patch × every upstream version: compat_matrix.yaml, its diff against a previous run,
shards for CI fan-out, and a Markdown rendering."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from patchctl.core import outcomes as O
from patchctl.core.engines import get_engine
from patchctl.core.errors import PatchctlError, UsageError
from patchctl.core.yamlio import dump_yaml, load_yaml
from patchctl.matrix.course import courses
from patchctl.matrix.course import version_key as _version_key
from patchctl.patching import evaluate
from patchctl.sources import fetch
from patchctl.store.layered import Store
from patchctl.store.series import drop_rule_met

if TYPE_CHECKING:
    from patchctl.sources.spec import EngineRef
    from patchctl.store.series import Patch

SCHEMA = "patchctl-matrix/1"

# (engine, version, ref) -> {patch: smoke result}: the CPU checks of one cell (ref: a nightly's own
# EngineRef, None for a release).
SmokeRunner = Callable[[str, Version, "EngineRef | None"], dict[str, dict]]

# (engine, image reference) -> the `image` section of `status --image` on it: the top manifest's
# digest and, per platform, its state and patch-set fingerprint (handed in by the command, which
# owns status; this module never imports a command).
ImageStatus = Callable[[str, str], dict]


def lowest_claimed(specifiers: Iterable[SpecifierSet]) -> Version | None:
    lows = []
    for spec_set in specifiers:
        for spec in spec_set:
            if spec.operator in (">=", "==", "~=", ">"):
                try:
                    lows.append(Version(spec.version))
                except Exception:
                    continue
    return min(lows) if lows else None


def versions_for(engine: str, store: Store, ctx: fetch.SourceContext, since: Version | None = None) -> list[Version]:
    series = store.series(engine)
    if not series.patches:
        return []
    patches = series.patches
    since = (
        since
        or series.matrix_since
        or lowest_claimed(p.applies_to for p in patches)
        or min(v.base for p in patches for v in p.variants)
    )
    released = ctx.index_for(get_engine(engine)).project(get_engine(engine).dist).versions()
    return [v for v in released if v >= since]


def check_one(
    engine: str,
    version: Version,
    store: Store,
    ctx: fetch.SourceContext,
    smoke: SmokeRunner | None = None,
    upstream: fetch.Upstream | None = None,
    fingerprints: dict | None = None,
) -> dict:
    """smoke(engine, version, ref) -> {patch: result dict}: the CPU checks, when the caller asks for
    them (ref: the nightly's own EngineRef, None for a release). fingerprints: one build's memo of
    checked_fingerprint (a patch's checks are read once per matrix, not once per release)."""
    eng = get_engine(engine)
    fingerprints = {} if fingerprints is None else fingerprints
    start = time.monotonic()
    try:
        source = upstream.source if upstream else fetch.release(eng, version, ctx)
        result = evaluate.evaluate(store.series(engine).patches, version, source)
    except PatchctlError as exc:
        return {"version": str(version), "error": exc.message, "patches": {}}
    smoke_results: dict[str, dict] = {}
    if smoke is not None and result.ok:
        try:
            smoke_results = smoke(engine, version, upstream.ref if upstream else None)
        except PatchctlError as exc:
            smoke_results = {p.name: {"status": "error", "reason": exc.message} for p in store.series(engine).patches}
    seconds = round(time.monotonic() - start, 2)
    patches: dict[str, dict] = {}
    for patch, outcome in zip(store.series(engine).patches, result.outcomes, strict=False):
        entry: dict[str, object] = {"outcome": outcome.outcome, "variant": outcome.variant}
        if outcome.variant:
            key = (str(patch.directory), outcome.variant)
            if key not in fingerprints:
                fingerprints[key] = checked_fingerprint(patch, outcome.variant)
            entry["checked"] = fingerprints[key]
        moved = [h for h in outcome.hunks if h.status in ("offset", "fuzz")]
        if moved:
            entry["hunks_moved"] = len(moved)
        if drop_rule_met(patch, eng.dist, version):
            entry["drop"] = f"drop_when {patch.drop_when} holds"
        entry["evidence"] = _evidence(outcome.outcome, smoke_results.get(patch.name))
        if patch.name in smoke_results:
            r = smoke_results[patch.name]
            entry["smoke"] = {"status": r["status"], "reason": r["reason"]}
        patches[patch.name] = entry
    provenance = source.provenance()
    return {
        "version": str(version),
        "artifact": provenance.description,
        "sha256": provenance.sha256,
        "bytes_fetched": provenance.bytes_fetched,
        "seconds": seconds,
        "patches": patches,
    }


def checked_fingerprint(patch: Patch, variant_name: str) -> str:
    """What a cell's evidence was made with: the variant's bytes, the patch's checks and its smoke
    settings. A merge keeps a committed cell's smoke evidence only while this is unchanged (a
    refreshed variant or a new check must be smoke-tested again)."""
    digest = hashlib.sha256()
    for variant in patch.variants:
        if variant.filename == variant_name:
            digest.update(variant.path.read_bytes())
    checks = patch.directory / "checks"
    for file in sorted(checks.rglob("*")) if checks.is_dir() else ():
        if file.is_file() and "__pycache__" not in file.parts:
            digest.update(file.relative_to(checks).as_posix().encode() + b"\0" + file.read_bytes())
    digest.update(json.dumps(patch.smoke, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def _evidence(outcome: str, smoke: dict | None) -> str:
    """How much a cell proves, in increasing strength."""
    if outcome not in O.WRITES:
        return "outcome only"
    if smoke is None:
        return "applies (smoke not run)"
    if smoke["status"] == "passed":
        return "applies + CPU checks passed"
    return f"applies; CPU checks {smoke['status']}"


def build(
    store: Store,
    ctx: fetch.SourceContext,
    *,
    engines: list[str] | None = None,
    shard: tuple[int, int] | None = None,
    workers: int = 4,
    progress: Callable[[str, Version], None] | None = None,
    smoke: SmokeRunner | None = None,
    nightly: bool = True,
    only_versions: set[str] | None = None,
    images: Iterable[str] = (),
    image_status: ImageStatus | None = None,
) -> dict:
    engines = engines or store.engines()
    jobs = [(e, v) for e in engines for v in versions_for(e, store, ctx) if not only_versions or str(v) in only_versions]
    if shard:
        index, count = shard
        jobs = [job for n, job in enumerate(jobs) if n % count == index - 1]
    rows: dict[tuple[str, str], dict] = {}
    # Smoke runs build trees and venvs: one at a time; the sparse checks run in parallel.
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1 if smoke else workers)
    try:
        fingerprints: dict = {}
        futures = {pool.submit(check_one, e, v, store, ctx, smoke, fingerprints=fingerprints): (e, v) for e, v in jobs}
        for future in concurrent.futures.as_completed(futures):
            e, v = futures[future]
            rows[(e, str(v))] = future.result()
            if progress:
                progress(e, v)
    except BaseException:
        # A Ctrl-C or a failed cell: the jobs not started are dropped, not run while the command unwinds
        # (a `with` block would wait for every queued version; cli/interrupt.py's grace is the bound).
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
    nightly_notes = {}
    if not shard or shard[0] == 1:
        for engine in engines:
            if not nightly or _nightly_disabled(engine):
                nightly_notes[engine] = NIGHTLY_SKIPPED
                continue
            row, note = _nightly_row(engine, store, ctx, smoke)
            nightly_notes[engine] = note
            rows[(engine, "nightly")] = row
    image_rows: dict[str, dict[str, dict]] = {}
    if images and (not shard or shard[0] == 1):
        image_rows = _image_columns(list(images), engines, store, ctx, image_status)
    doc = assemble(store, engines, rows, nightly_notes)
    for engine, columns in image_rows.items():
        doc["engines"][engine]["images"] = columns
    return doc


def _image_columns(
    images: list[str], engines: list[str], store: Store, ctx: fetch.SourceContext, image_status: ImageStatus | None
) -> dict[str, dict[str, dict]]:
    """engine -> {image reference: its column}. Each image is checked as `check ENGINE@image:REF`
    is, for the engine whose tree it holds; an image that holds none of the engines, or cannot be
    read, is a column with `error` under every engine asked for (exit 1: never a silent gap)."""
    from patchctl.core.errors import ImageContentError
    from patchctl.sources import registry
    from patchctl.sources.spec import parse_spec

    out: dict[str, dict[str, dict]] = {}
    for image in images:
        found, missing = False, []
        for engine in engines:
            try:
                upstream = registry.open_upstream(parse_spec(f"{engine}@image:{image}"), ctx)
            except ImageContentError as exc:
                missing.append(exc.message)
                continue
            except PatchctlError as exc:
                missing = [exc.message]
                break
            found = True
            row = check_one(engine, upstream.version, store, ctx, upstream=upstream)
            row["image"] = image
            row["digest"] = f"sha256:{row['sha256']}" if row.get("sha256") else None
            if image_status is not None and not row.get("error"):
                try:
                    section = image_status(engine, image)
                except PatchctlError as exc:
                    row["error"], row["patches"] = f"status --image: {exc.message}", {}
                else:
                    row["digest"] = section.get("digest", row["digest"])
                    row["platforms"] = [
                        {"platform": p.get("platform"), "state": p.get("state"), "patch_set": p.get("patch_set")}
                        for p in section.get("platforms", [])
                    ]
            out.setdefault(engine, {})[image] = row
        if not found:
            why = "; ".join(dict.fromkeys(missing)) or "no engine asked for"
            for engine in engines:
                out.setdefault(engine, {})[image] = {"image": image, "error": why, "patches": {}}
    return out


def images_failed(doc: dict) -> list[str]:
    """`engine image` for every image column that could not be evaluated (exit 1 for `patchctl matrix`)."""
    return [
        f"{engine} {image}"
        for engine, data in doc.get("engines", {}).items()
        for image, row in (data.get("images") or {}).items()
        if row.get("error")
    ]


NIGHTLY_SKIPPED = "skipped: disabled"
NIGHTLY_FAILED = "failed"  # the `outcome` of a nightly row whose build could not be resolved


def _nightly_disabled(engine: str) -> bool:
    """An engine whose nightly kind is `none` (engines.yaml, or the config file) publishes none:
    leaving it out is deliberate, not a failure."""
    from patchctl.sources.kinds.nightly import publishes_nightly

    return not publishes_nightly(get_engine(engine))


def _nightly_row(engine: str, store: Store, ctx: fetch.SourceContext, smoke: SmokeRunner | None = None) -> tuple[dict, str]:
    """The nightly build is part of the matrix whenever it is enabled. One that cannot be resolved
    (no source configured, unreachable, no builds) is a failed row, `outcome: failed` with the
    reason in `error`, and `patchctl matrix` exits 1: a nightly is never a silent gap."""
    from patchctl.sources import registry
    from patchctl.sources.spec import EngineRef

    try:
        upstream = registry.open_upstream(EngineRef(get_engine(engine), "nightly"), ctx)
    except PatchctlError as exc:
        # The row is read by people deciding what to do: the reason, then the way out.
        why = f"{exc.message}; {exc.hint}" if exc.hint else exc.message
        return ({"version": "nightly", "outcome": NIGHTLY_FAILED, "error": why, "patches": {}}, f"failed: {why}")
    row = check_one(engine, upstream.version, store, ctx, smoke, upstream=upstream)
    row["nightly_of"] = upstream.label
    if row.get("error"):
        row["outcome"] = NIGHTLY_FAILED
        return row, f"failed: {row['error']}"
    return row, f"ran on {upstream.label}"


def nightly_failed(doc: dict) -> list[str]:
    """The engines whose nightly row failed (exit 1 for `patchctl matrix`)."""
    return [
        engine
        for engine, data in doc.get("engines", {}).items()
        if (data.get("versions", {}).get("nightly") or {}).get("outcome") == NIGHTLY_FAILED
    ]


def assemble(store: Store, engines: list[str], rows: dict[tuple[str, str], dict], nightly_notes: dict | None = None) -> dict:
    engines_doc: dict[str, dict] = {}
    doc = {"schema": SCHEMA, "engines": engines_doc}
    for engine in engines:
        versions = sorted((v for e, v in rows if e == engine), key=_version_key)
        series = store.series(engine).patches
        engines_doc[engine] = {
            "patches": [p.name for p in series],
            # What a passing cell proves and what it cannot (e.g. "SM120 itself: not available"),
            # from each patch's metadata, so the matrix never claims more than was run.
            "evidence": {
                p.name: {"proven": list(p.evidence.get("proven") or []), "not_proven": list(p.evidence.get("not_proven") or [])}
                for p in series
            },
            "versions": {v: rows[(engine, v)] for v in versions},
        }
        if nightly_notes and engine in nightly_notes:
            engines_doc[engine]["nightly"] = nightly_notes[engine]
    return doc


def merge(documents: list[dict]) -> dict:
    merged_engines: dict[str, dict] = {}
    merged = {"schema": SCHEMA, "engines": merged_engines}
    for doc in documents:
        if doc.get("schema") != SCHEMA:
            raise UsageError(f"not a {SCHEMA} document")
        for engine, data in doc["engines"].items():
            target = merged_engines.setdefault(
                engine, {"patches": data["patches"], "evidence": data.get("evidence", {}), "versions": {}}
            )
            target["versions"].update(data["versions"])
            if "nightly" in data:
                target["nightly"] = data["nightly"]
            if data.get("images"):
                target.setdefault("images", {}).update(data["images"])
    for data in merged_engines.values():
        data["versions"] = dict(sorted(data["versions"].items(), key=lambda kv: _version_key(kv[0])))
    return merged


def dump(doc: dict) -> str:
    header = (
        "# Generated by `patchctl matrix`; do not edit by hand.\n"
        "# Schema: docs/matrix.md. One entry per engine version × patch.\n"
    )
    return header + dump_yaml(doc, sort_keys=False, width=120)


def load(path: Path) -> dict:
    """A matrix document, checked against patchctl/core/schemas/matrix.json: anything else is a UsageError
    naming the file (diff, merge and the renderings then read only well-formed rows)."""
    from patchctl.core.schemas import validate
    from patchctl.core.yamlio import YAMLError

    raw = path.read_bytes()
    try:
        doc = load_yaml(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})") from None
    except YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise UsageError(f"{path}: not a {SCHEMA} document", hint="compare files written by `patchctl matrix`")
    validate("matrix", doc, str(path), error=UsageError, hint="see docs/matrix.md")
    for engine, data in doc["engines"].items():
        for version in data["versions"]:
            try:
                _version_key(version)
            except InvalidVersion:
                raise UsageError(f"{path}: engines.{engine}.versions: {version!r} is not a version or 'nightly'") from None
    return doc


def diff(previous: dict, current: dict) -> dict:
    """Regressions: a patch that worked (any satisfied outcome) and now conflicts; fixes: the reverse."""
    regressions, fixes, changes = [], [], []
    for engine, data in current["engines"].items():
        old_versions = previous.get("engines", {}).get(engine, {}).get("versions", {})
        for version, row in data["versions"].items():
            old_row = old_versions.get(version)
            if not old_row:
                # A release the previous run did not know: compare with the newest one it did, so
                # a new release that breaks a patch is a regression, not a silent new row.
                older = [v for v in old_versions if v != "nightly" and _version_key(v) < _version_key(version)]
                if not older:
                    continue
                old_row = old_versions[max(older, key=_version_key)]
            for patch, entry in row["patches"].items():
                before = old_row["patches"].get(patch, {}).get("outcome")
                after = entry["outcome"]
                if before is None or before == after:
                    continue
                item = {"engine": engine, "version": version, "patch": patch, "before": before, "after": after}
                if after == O.CONFLICT and before in O.SATISFIED:
                    regressions.append(item)
                elif before == O.CONFLICT and after in O.SATISFIED:
                    fixes.append(item)
                else:
                    changes.append(item)
    for item in regressions:
        versions = current["engines"][item["engine"]]["versions"]
        bad = [v for v, r in versions.items() if r["patches"].get(item["patch"], {}).get("outcome") == O.CONFLICT]
        item["first_bad_version"] = min(bad, key=_version_key) if bad else item["version"]
    return {"regressions": regressions, "fixes": fixes, "changes": changes}


SYMBOL = {
    O.CLEAN: "✅ clean",
    O.OFFSET: "✅ offset",
    O.FUZZ: "⚠️ fuzz",
    O.THREE_WAY: "⚠️ 3-way",
    O.ALREADY_APPLIED: "☑️ applied",
    O.UPSTREAMED: "⬆️ upstreamed",
    O.OBSOLETE: "➖ obsolete",
    O.CONFLICT: "❌ conflict",
}


def markdown(doc: dict) -> str:
    out = ["# Compatibility matrix", ""]
    for engine, data in doc["engines"].items():
        out += [f"## {engine}", "", "| version | " + " | ".join(data["patches"]) + " |", "|---|" + "---|" * len(data["patches"])]
        for version, row in data["versions"].items():
            if row.get("error"):
                out.append(f"| {version} | " + " | ".join(["error"] * len(data["patches"])) + " |")
                continue
            out.append(f"| {version} | " + " | ".join(_cell(row["patches"].get(n, {})) for n in data["patches"]) + " |")
        # Images after the releases: each row names the image and the release its engine tree is.
        for image, row in (data.get("images") or {}).items():
            label = f"image `{image}`" + (f" ({row['version']})" if row.get("version") else "")
            if row.get("error"):
                out.append(f"| {label} | " + " | ".join(["error"] * len(data["patches"])) + " |")
                continue
            out.append(f"| {label} | " + " | ".join(_cell(row["patches"].get(n, {})) for n in data["patches"]) + " |")
        out.append("")
    return "\n".join(out)


def _cell(entry: dict) -> str:
    outcome = str(entry.get("outcome", "?"))
    cell = SYMBOL.get(outcome, outcome)
    if entry.get("variant"):
        cell += f" ({entry['variant'].removesuffix('.patch')})"
    return cell


def first_bad(doc: dict) -> dict[str, dict[str, str]]:
    """engine -> {patch: the lowest version (releases before the nightly) where it conflicts}."""
    out: dict[str, dict[str, str]] = {}
    for engine, data in doc.get("engines", {}).items():
        bad = {patch: c.first_bad for patch, c in courses(data).items() if c.first_bad is not None}
        if bad:
            out[engine] = bad
    return out


def changes_since(previous: dict | None, current: dict) -> dict:
    """What a nightly report leads with: releases the previous matrix did not have, cells (and
    rows) that fail now and did not before, cells upstreamed now and not before."""
    new_releases, newly_failing, newly_upstreamed = [], [], []
    for engine, data in current.get("engines", {}).items():
        old = ((previous or {}).get("engines", {}).get(engine) or {}).get("versions", {})
        for version, row in data.get("versions", {}).items():
            before = old.get(version)
            if before is None and version != "nightly":
                new_releases.append({"engine": engine, "version": version})
            if row.get("error"):
                if previous is not None and not (before or {}).get("error"):
                    newly_failing.append(
                        {
                            "engine": engine,
                            "version": version,
                            "patch": None,
                            "before": "ran" if before else None,
                            "after": "error",
                            "error": row["error"],
                        }
                    )
                continue
            for patch, cell in (row.get("patches") or {}).items():
                was = ((before or {}).get("patches") or {}).get(patch, {}).get("outcome")
                now = cell.get("outcome")
                if previous is None or was == now:
                    continue
                item = {"engine": engine, "version": version, "patch": patch, "before": was, "after": now}
                if now == O.CONFLICT:
                    newly_failing.append(item)
                elif now == O.UPSTREAMED:
                    newly_upstreamed.append(item)
    return {
        "new_releases": new_releases,
        "newly_failing": newly_failing,
        "newly_upstreamed": newly_upstreamed,
        "first_bad": first_bad(current),
    }
