"""Manifests, indexes and configs: which media types patchctl reads, the platforms of an index, the
layers of an image, and the image that results from appending one layer (its config gains the
layer's diff_id, a history entry naming patchctl and the patch set, and the patch-set label)."""

from __future__ import annotations

import hashlib
import json
import time
from typing import NamedTuple

from patchctl.core.errors import RegistryError
from patchctl.core.yamlio import load_json
from patchctl.image.registry import Manifest, Repository

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFESTS = (OCI_MANIFEST, DOCKER_MANIFEST)
INDEXES = (OCI_INDEX, DOCKER_LIST)
# The layer type patchctl writes, in each manifest family.
LAYER_TYPE = {
    OCI_MANIFEST: "application/vnd.oci.image.layer.v1.tar+gzip",
    DOCKER_MANIFEST: "application/vnd.docker.image.rootfs.diff.tar.gzip",
}
# The label every patched image's config carries (a fleet compares it without pulling a layer) and
# the history entry's author.
PATCH_SET_LABEL = "dev.patchctl.patch-set"
# The patched manifest's annotation naming the manifest it was made from (pushed beside it, by
# digest): `revert --image` pushes that one back, byte for byte.
BASE_ANNOTATION = "dev.patchctl.base.manifest"
AUTHOR = "patchctl"


class Layer(NamedTuple):
    digest: str
    size: int
    media_type: str


class Image(NamedTuple):
    """One platform's image: its manifest document and config document, parsed."""

    manifest: Manifest
    doc: dict
    config: dict
    platform: str  # os/arch[/variant], from the config


def media_type_of(manifest: Manifest) -> str:
    """The type the document says (a registry's Content-Type may be generic), checked to be one
    patchctl reads: anything else (a schema 1 manifest, an artifact) is exit 3 with the type named."""
    try:
        doc = load_json(manifest.data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RegistryError(f"the manifest {manifest.digest[:19]}… is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise RegistryError(f"the manifest {manifest.digest[:19]}… is not a JSON object")
    kind = str(doc.get("mediaType") or manifest.media_type or "")
    if not kind and "manifests" in doc:
        kind = OCI_INDEX
    elif not kind and "layers" in doc:
        kind = OCI_MANIFEST
    if kind not in MANIFESTS + INDEXES:
        raise RegistryError(
            f"the manifest {manifest.digest[:19]}… is of type {kind or 'unknown'!r}: patchctl reads "
            f"OCI and Docker schema 2 images and indexes only"
        )
    return kind


def parse(manifest: Manifest) -> dict:
    return dict(load_json(manifest.data))


def layers_of(doc: dict) -> list[Layer]:
    layers = doc.get("layers")
    if not isinstance(layers, list):
        raise RegistryError("the manifest has no layers list")
    out = []
    for entry in layers:
        if not isinstance(entry, dict) or not isinstance(entry.get("digest"), str) or not isinstance(entry.get("size"), int):
            raise RegistryError(f"the manifest names a layer without digest and size: {str(entry)[:120]}")
        out.append(Layer(entry["digest"], entry["size"], str(entry.get("mediaType") or "")))
    return out


def load_image(repo: Repository, manifest: Manifest) -> Image:
    doc = parse(manifest)
    config_ref = doc.get("config")
    if not isinstance(config_ref, dict) or not isinstance(config_ref.get("digest"), str):
        raise RegistryError(f"the manifest {manifest.digest[:19]}… names no config")
    raw = repo.small_blob(config_ref["digest"])
    try:
        config = load_json(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RegistryError(f"the image config {config_ref['digest'][:19]}… is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise RegistryError("the image config is not a JSON object")
    return Image(manifest, doc, config, platform_of(config))


def platform_of(entry: dict) -> str:
    """os/arch[/variant] of a config or of an index entry's `platform`."""
    parts = [str(entry.get("os") or "?"), str(entry.get("architecture") or "?")]
    if entry.get("variant"):
        parts.append(str(entry["variant"]))
    return "/".join(parts)


def platform_manifests(index: dict) -> list[dict]:
    """The index's image entries; attestation and other non-image entries (BuildKit's
    `unknown/unknown` provenance manifests) are left as they are."""
    entries = index.get("manifests")
    if not isinstance(entries, list):
        raise RegistryError("the index has no manifests list")
    return [e for e in entries if isinstance(e, dict) and isinstance(e.get("digest"), str)]


def is_attestation(entry: dict) -> bool:
    annotations = entry.get("annotations") or {}
    return "vnd.docker.reference.type" in annotations or platform_of(entry.get("platform") or {}) == "unknown/unknown"


def dumps(doc: dict) -> bytes:
    """The bytes a document is pushed as (ASCII: what is hashed is what the registry stores)."""
    return json.dumps(doc, indent=None, separators=(",", ":"), ensure_ascii=True).encode()


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class NewImage(NamedTuple):
    manifest: Manifest
    config: bytes
    config_digest: str


def with_layer(
    image: Image,
    layer_digest: str,
    layer_size: int,
    diff_id: str,
    *,
    fingerprint: str,
    patches: list[str],
    engine: str,
    version: str,
    patchctl_version: str,
) -> NewImage:
    """The image with one more layer on top, as `crane append` makes it: the config's rootfs gains
    the diff_id, its history an entry saying what patchctl did, its labels the patch set."""
    kind = str(image.doc.get("mediaType") or OCI_MANIFEST)
    config = json.loads(json.dumps(image.config))
    rootfs = config.setdefault("rootfs", {"type": "layers", "diff_ids": []})
    rootfs.setdefault("diff_ids", []).append(diff_id)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    config["created"] = created
    config.setdefault("history", []).append(
        {
            "created": created,
            "created_by": f"patchctl apply {engine} (patch set sha256:{fingerprint})",
            "author": AUTHOR,
            "comment": f"patchctl {patchctl_version}: {engine} {version}, patches: {', '.join(patches) or 'none'}",
        }
    )
    inner = config.setdefault("config", {})
    labels = inner.get("Labels") or {}
    labels[PATCH_SET_LABEL] = f"sha256:{fingerprint}"
    inner["Labels"] = labels
    config_bytes = dumps(config)
    config_digest = digest_of(config_bytes)
    doc = json.loads(json.dumps(image.doc))
    doc["mediaType"] = kind
    doc["config"] = dict(doc["config"], digest=config_digest, size=len(config_bytes))
    doc["layers"].append(
        {"mediaType": LAYER_TYPE.get(kind, LAYER_TYPE[OCI_MANIFEST]), "digest": layer_digest, "size": layer_size}
    )
    if kind == OCI_MANIFEST:  # Docker's schema 2 has no annotations
        base = (image.doc.get("annotations") or {}).get(BASE_ANNOTATION) or image.manifest.digest
        doc["annotations"] = dict(doc.get("annotations") or {}, **{BASE_ANNOTATION: base})
    data = dumps(doc)
    return NewImage(Manifest(data, kind, digest_of(data)), config_bytes, config_digest)


def patchctl_layers(config: dict) -> list[int]:
    """Indexes (into the layers list) of the layers patchctl's history entries describe: history
    entries with `empty_layer` make no layer, every other one makes the next."""
    found, at = [], 0
    for entry in config.get("history") or []:
        if not isinstance(entry, dict):
            continue
        if entry.get("empty_layer"):
            continue
        if entry.get("author") == AUTHOR and str(entry.get("created_by", "")).startswith("patchctl "):
            found.append(at)
        at += 1
    return found
