"""apply and status on an image. The engine's files are read out of the layers into a staging tree
(only the files the series can touch, their bytecode, the dist-info METADATA and the `.patchctl/`
record), and that tree goes through the service (tree.service) as `apply --target` (or `status
--target`) on a directory does, so the series, the variant choice, all-or-nothing and the refusal
of fuzz are the tree's own; the typed results come back for the command to render. What apply
changed in the staging tree becomes one new layer; every platform of an index that holds the
engine is patched, all of them or none (the push happens only after every platform applied), and
the ones without the engine are named.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from packaging.version import Version

from patchctl.core import outcomes as O
from patchctl.core.errors import EnvironmentProblem, ImageContentError, RegistryError
from patchctl.image import layers as L
from patchctl.image import manifest as M
from patchctl.image.newlayer import Entry, WrittenLayer, new_file_meta, write_layer
from patchctl.image.reference import ImageRef
from patchctl.image.registry import Manifest, Repository
from patchctl.image.repository import open_repository

if TYPE_CHECKING:
    from patchctl.core.engines import Engine
    from patchctl.sources.files import ProgressSink
    from patchctl.sources.spec import EngineRef
    from patchctl.tree.bookkeeping import StateRecord
    from patchctl.tree.service import ApplyRequest, ApplyRun, StatusResult


class PlatformResult(NamedTuple):
    platform: str
    run: ApplyRun  # the service's apply on the staging tree
    code: int
    image: M.Image
    found: L.Found | None
    layer: WrittenLayer | None = None
    new: M.NewImage | None = None
    written: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()


def _platform_images(repo: Repository, manifest: Manifest) -> tuple[list[tuple[dict | None, M.Image]], dict | None]:
    """(index entry or None, image) for every platform; the index document when there is one."""
    kind = M.media_type_of(manifest)
    if kind in M.MANIFESTS:
        return [(None, M.load_image(repo, manifest))], None
    index = M.parse(manifest)
    out: list[tuple[dict | None, M.Image]] = []
    for entry in M.platform_manifests(index):
        if M.is_attestation(entry):
            continue
        child = repo.manifest(entry["digest"])
        if M.media_type_of(child) not in M.MANIFESTS:
            raise RegistryError(f"{repo.name}: the index entry {entry['digest'][:19]}… is not an image manifest")
        out.append((entry, M.load_image(repo, child)))
    return out, index


class ImageApply(NamedTuple):
    section: dict  # the image section of apply's document
    code: int
    runs: tuple[ApplyRun, ...]  # per platform applied, in the section's order


def apply_image(
    source: ImageRef,
    dest: ImageRef,
    ref: EngineRef,
    paths: list[str],
    request: ApplyRequest,
    *,
    insecure: bool = False,
    progress: ProgressSink | None = None,
    patchctl_version: str = "",
) -> ImageApply:
    """The service's apply on every platform's engine tree; nothing is pushed unless every platform applied."""
    from patchctl.core.errors import EXIT_OK, EXIT_PATCH_FAILED
    from patchctl.tree import service
    from patchctl.tree.find import TargetSpec

    engine, dry_run = ref.engine, request.dry_run
    repo = open_repository(source, insecure=insecure, progress=progress)
    top = repo.manifest(source.target)
    images, index = _platform_images(repo, top)
    wanted = L.engine_filter(engine, L.with_bytecode(paths), set(paths).__contains__)
    results: list[PlatformResult] = []
    left_out: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="patchctl-image-") as work:
        for number, (_, image) in enumerate(images):
            folder = Path(work) / f"p{number}"
            staged = L.read_layers(
                repo, M.layers_of(image.doc), wanted, folder / "rootfs", progress, own=M.patchctl_layers(image.config)
            )
            try:
                found = L.find_engine(staged, engine)
            except ImageContentError as exc:
                if index is None:
                    raise
                left_out.append({"platform": image.platform, "reason": exc.message})
                continue
            before = L.snapshot(found.local)
            run = in_image(
                service.apply(ref, TargetSpec(target_dir=str(found.local)), request), staged.folder, source, image.platform
            )
            result = PlatformResult(image.platform, run, EXIT_OK if run.ok else EXIT_PATCH_FAILED, image, found)
            if result.code == EXIT_OK and not dry_run:
                result = _new_layer(result, staged, before, folder, engine, patchctl_version)
            results.append(result)
        if not results:
            raise ImageContentError(
                f"no platform of {source} holds {engine.dist}: " + "; ".join(f"{x['platform']}: {x['reason']}" for x in left_out)
            )
        failed = [r for r in results if r.code != 0]
        pushed = None
        if not failed and not dry_run:
            pushed = _push(repo, dest, results, index, insecure=insecure, progress=progress)
        return ImageApply(
            {
                "from": str(source),
                "to": str(dest),
                "source_digest": top.digest,
                "digest": pushed.digest if pushed else None,
                "pushed": pushed is not None,
                "platforms": [_platform_json(r) for r in results],
                "left_out": left_out,
            },
            max(r.code for r in results),
            tuple(r.run for r in results),
        )


def _platform_json(r: PlatformResult) -> dict:
    return {
        "platform": r.platform,
        "version": str(r.found.version) if r.found else None,
        "root": f"/{r.found.root}" if r.found else None,
        "exit_code": r.code,
        "layer": r.layer.digest if r.layer else None,
        "layer_size": r.layer.size if r.layer else None,
        "manifest": r.new.manifest.digest if r.new else None,
        "written": list(r.written),
        "removed": list(r.removed),
    }


def _new_layer(
    result: PlatformResult, staged: L.Staged, before: dict[str, str], folder: Path, engine: Engine, patchctl_version: str
) -> PlatformResult:
    assert result.found is not None  # a layer is made only for a platform whose tree was found
    found = result.found
    after = L.snapshot(found.local)
    changed = sorted(p for p, digest in after.items() if before.get(p) != digest and not _transient(p))
    removed = sorted(p for p in before if p not in after)
    if not changed and not removed:
        return result  # nothing to write: the image is pushed as it is
    entries = []
    for rel in changed:
        image_path = found.root + rel
        entries.append(Entry(image_path, found.local / rel, staged.files.get(image_path, new_file_meta())))
    for rel in removed:
        image_path = found.root + rel
        entries.append(Entry(image_path, None, staged.files[image_path]))
    try:
        layer = write_layer(entries, staged.dirs, folder / "layer.tar.gz")
    except OSError as exc:  # a full temporary folder: named, not a bare errno
        raise EnvironmentProblem(
            f"cannot write the new layer to {folder / 'layer.tar.gz'}: {exc.strerror or exc}",
            hint="set TMPDIR to a folder with room",
        ) from None
    # What the service just wrote; only a run that wrote nothing new has none, and its tree holds the record.
    record = result.run.results[0].record or _record(found.local, engine)
    fingerprint = (record.store_fingerprint or "") if record else ""
    patches = [p.name for p in record.patches if p.outcome in O.WRITES] if record else []
    new = M.with_layer(
        result.image,
        layer.digest,
        layer.size,
        layer.diff_id,
        fingerprint=fingerprint,
        patches=patches,
        engine=engine.name,
        version=str(found.version),
        patchctl_version=patchctl_version,
    )
    return result._replace(layer=layer, new=new, written=tuple(changed), removed=tuple(removed))


def _transient(rel: str) -> bool:
    """The tree lock patchctl takes while it works is no part of the result."""
    return rel.startswith(".patchctl/") and rel.rsplit("/", 1)[-1] in ("lock", ".lock")


def _record(root: Path, engine: Engine) -> StateRecord | None:
    from patchctl.tree.bookkeeping import TargetState

    return TargetState(root, engine.name, packages=tuple(engine.packages)).load()


def _push(
    repo: Repository,
    dest: ImageRef,
    results: list[PlatformResult],
    index: dict | None,
    *,
    insecure: bool,
    progress: ProgressSink | None,
) -> Manifest:
    target = open_repository(dest, insecure=insecure, progress=progress, create=True)
    tag = dest.tag or "latest"
    manifests: dict[str, Manifest] = {}
    for r in results:
        for layer in M.layers_of(r.image.doc):
            target.put_blob(repo.blob(layer.digest, layer.size), layer.digest, layer.size, source=repo)
        if r.new is None or r.layer is None:
            config_digest = r.image.doc["config"]["digest"]
            target.put_bytes(repo.small_blob(config_digest), config_digest)
            manifests[r.image.manifest.digest] = r.image.manifest
            continue
        target.put_blob(r.layer.path, r.layer.digest, r.layer.size)
        target.put_bytes(r.new.config, r.new.config_digest)
        # The image it was made from, by digest, for `revert --image` (its layers are there already).
        config_digest = r.image.doc["config"]["digest"]
        target.put_bytes(repo.small_blob(config_digest), config_digest)
        target.put_manifest(r.image.manifest.digest, r.image.manifest)
        manifests[r.image.manifest.digest] = r.new.manifest
    if index is None:
        (only,) = manifests.values()
        target.put_manifest(tag, only)
        return only
    entries = []
    for entry in M.platform_manifests(index):
        new = manifests.get(entry["digest"])
        if new is None:
            continue  # an attestation of the unpatched image, or a platform without the engine
        target.put_manifest(new.digest, new)
        entries.append(dict(entry, digest=new.digest, size=len(new.data), mediaType=new.media_type))
    new_index = dict(index, manifests=entries)
    new_index.setdefault("mediaType", M.OCI_INDEX)
    data = M.dumps(new_index)
    pushed = Manifest(data, str(new_index["mediaType"]), M.digest_of(data))
    target.put_manifest(tag, pushed)
    return pushed


class PlatformStatus(NamedTuple):
    platform: str
    patch_set: str | None  # the image's patch-set label
    layers_read: int
    root: str | None  # the engine's import root in the image; None: no patchctl layer, nothing read
    result: StatusResult | None


def status_image(
    source: ImageRef, ref: EngineRef, *, wait: float = 30.0, insecure: bool = False, progress: ProgressSink | None = None
) -> tuple[str, list[PlatformStatus]]:
    """Per platform: the service's status of the files read from the first patchctl layer upward (the
    layers below it are never pulled); an image without a patchctl layer is `not-applied` without
    reading any layer. Returns the image's digest and the platforms."""
    from patchctl.tree import service
    from patchctl.tree.find import TargetSpec, find_target

    engine = ref.engine
    repo = open_repository(source, insecure=insecure, progress=progress)
    top = repo.manifest(source.target)
    images, _ = _platform_images(repo, top)
    wanted = L.engine_filter(engine, lambda rel: True)
    platforms = []
    with tempfile.TemporaryDirectory(prefix="patchctl-image-") as work:
        for number, (_, image) in enumerate(images):
            ours = M.patchctl_layers(image.config)
            label = ((image.config.get("config") or {}).get("Labels") or {}).get(M.PATCH_SET_LABEL)
            if not ours:
                platforms.append(PlatformStatus(image.platform, None, 0, None, None))
                continue
            layers = M.layers_of(image.doc)[ours[0] :]
            staged = L.read_layers(repo, layers, wanted, Path(work) / f"p{number}", progress, own=[i - ours[0] for i in ours])
            found = L.find_engine(staged, engine) if any(n.endswith("/METADATA") for n in staged.files) else None
            root = found.local if found else _record_root(staged, engine)
            recorded = _record(root, engine)
            version = None if found or recorded is None else Version(recorded.version)
            target = find_target(ref, TargetSpec(target_dir=str(root), as_version=version))
            platforms.append(
                PlatformStatus(
                    image.platform,
                    label,
                    len(layers),
                    "/" + str(root.relative_to(staged.folder)),
                    status_in_image(service.status(target, wait=wait), staged.folder, source, image.platform),
                )
            )
    return top.digest, platforms


# The staging folder is gone when the command returns, and its name says nothing about the image: a
# result names each tree by its path inside the image, described by the image's reference.


def _image_path(folder: Path, path: Path) -> Path:
    return Path("/") / path.relative_to(folder)


def _strip(folder: Path, text: str) -> str:
    """A message naming a staged file: `<staging>/usr/lib/...` → `/usr/lib/...`."""
    return text.replace(str(folder).rstrip("/"), "")


def in_image(run: ApplyRun, folder: Path, source: ImageRef, platform: str) -> ApplyRun:
    import dataclasses

    from patchctl.tree.service import Failure

    results = []
    for r in run.results:
        root = _image_path(folder, r.target.root)
        failure = r.failure and Failure(
            r.failure.kind, _strip(folder, r.failure.message), r.failure.hint and _strip(folder, r.failure.hint), r.failure.state
        )
        results.append(
            dataclasses.replace(
                r,
                target=r.target._replace(root=root, how=f"image {source} ({platform}): {root}"),
                note=_strip(folder, r.note),
                warnings=tuple(_strip(folder, w) for w in r.warnings),
                failure=failure,
            )
        )
    return dataclasses.replace(run, results=tuple(results))


def status_in_image(result: StatusResult, folder: Path, source: ImageRef, platform: str) -> StatusResult:
    import dataclasses

    root = _image_path(folder, result.target.root)
    return dataclasses.replace(
        result,
        target=result.target._replace(root=root, how=f"image {source} ({platform}): {root}"),
        status=result.status._replace(message=_strip(folder, result.status.message)),
        warnings=tuple(_strip(folder, w) for w in result.warnings),
    )


def _record_root(staged: L.Staged, engine: Engine) -> Path:
    marker = f".patchctl/{engine.name}/"
    for name in staged.files:
        at = name.find(marker)
        if at >= 0 and (at == 0 or name[at - 1] == "/"):
            root = staged.folder / name[:at]
            for package in engine.packages:
                (root / package).mkdir(parents=True, exist_ok=True)
            return root
    raise ImageContentError(f"the image's patchctl layer holds no {engine.name} record")


def revert_image(
    source: ImageRef, dest: ImageRef, *, insecure: bool = False, progress: ProgressSink | None = None
) -> tuple[dict, int]:
    """The image each platform's patched manifest was made from (its BASE_ANNOTATION), pushed to
    dest byte for byte: reverting an image is dropping patchctl's layer, not writing another."""
    repo = open_repository(source, insecure=insecure, progress=progress)
    top = repo.manifest(source.target)
    images, index = _platform_images(repo, top)
    bases: dict[str, Manifest] = {}
    platforms = []
    for _, image in images:
        base_digest = (image.doc.get("annotations") or {}).get(M.BASE_ANNOTATION)
        if not base_digest:
            if M.patchctl_layers(image.config):
                raise ImageContentError(
                    f"{source} ({image.platform}) has a patchctl layer but no "
                    f"{M.BASE_ANNOTATION} annotation (a Docker schema 2 manifest): "
                    f"revert it by pushing the image it was made from"
                )
            bases[image.manifest.digest] = image.manifest
            platforms.append({"platform": image.platform, "state": "not-applied", "manifest": image.manifest.digest})
            continue
        base = repo.manifest(str(base_digest))
        bases[image.manifest.digest] = base
        platforms.append({"platform": image.platform, "state": "reverted", "manifest": base.digest})
    target = open_repository(dest, insecure=insecure, progress=progress, create=True)
    tag = dest.tag or "latest"
    for _, image in images:
        base = bases[image.manifest.digest]
        doc = M.parse(base)
        for layer in M.layers_of(doc):
            target.put_blob(repo.blob(layer.digest, layer.size), layer.digest, layer.size, source=repo)
        config_digest = doc["config"]["digest"]
        target.put_bytes(repo.small_blob(config_digest), config_digest)
    if index is None:
        (pushed,) = bases.values()
        target.put_manifest(tag, pushed)
    else:
        entries = []
        for entry in M.platform_manifests(index):
            platform_base = bases.get(entry["digest"])
            if platform_base is None:
                continue
            target.put_manifest(platform_base.digest, platform_base)
            entries.append(
                dict(entry, digest=platform_base.digest, size=len(platform_base.data), mediaType=platform_base.media_type)
            )
        data = M.dumps(dict(index, manifests=entries))
        new_index = Manifest(data, str(index.get("mediaType") or M.OCI_INDEX), M.digest_of(data))
        target.put_manifest(tag, new_index)
        pushed = new_index
    return {"from": str(source), "to": str(dest), "digest": pushed.digest, "pushed": True, "platforms": platforms}, 0
