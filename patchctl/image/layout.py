"""An OCI image layout directory (`oci:DIR[:TAG]`, what `skopeo copy … oci:DIR:TAG`, umoci and
buildah write): `oci-layout`, `index.json` (tags are the `org.opencontainers.image.ref.name`
annotation of its entries) and `blobs/sha256/<hex>`. The same interface as a registry's repository."""
from __future__ import annotations

import json
from pathlib import Path

from patchctl.atomic import write_atomic
from patchctl.errors import RegistryError
from patchctl.image.registry import MAX_CONFIG, MAX_MANIFEST, Manifest, Repository, check_digest, streamed_into
from patchctl.yamlio import load_json

REF_NAME = "org.opencontainers.image.ref.name"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"


class LayoutRepository:
    def __init__(self, root: Path, *, create: bool = False):
        self.root = Path(root)
        if not (self.root / "oci-layout").is_file():
            if not create:
                raise RegistryError(f"{self.root} is not an OCI image layout (no oci-layout file)",
                                    hint="skopeo copy docker://IMAGE oci:DIR:TAG writes one")
            (self.root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
            write_atomic(self.root / "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
            write_atomic(self.root / "index.json", json.dumps(
                {"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": []}).encode())

    @property
    def name(self) -> str:
        return f"oci:{self.root}"

    def _path(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / check_digest(digest)

    def _index(self) -> dict:
        raw = self._read(self.root / "index.json", MAX_MANIFEST)
        try:
            doc = load_json(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RegistryError(f"{self.root}/index.json is not JSON: {exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("manifests"), list):
            raise RegistryError(f"{self.root}/index.json has no manifests list")
        return doc

    def _read(self, path: Path, limit: int) -> bytes:
        try:
            if path.is_symlink():
                raise RegistryError(f"{path} is a symlink: refusing to follow it out of the layout")
            with open(path, "rb") as f:
                data = f.read(limit + 1)
        except FileNotFoundError:
            raise RegistryError(f"{path} is missing from the layout") from None
        if len(data) > limit:
            raise RegistryError(f"{path} is larger than {limit} bytes")
        return data

    def manifest(self, reference: str) -> Manifest:
        if reference.startswith("sha256:"):
            descriptor: dict | None = {"digest": reference}
        else:
            entries = [m for m in self._index()["manifests"]
                       if isinstance(m, dict) and (m.get("annotations") or {}).get(REF_NAME) == reference]
            if not entries and reference == "latest":
                entries = [m for m in self._index()["manifests"] if isinstance(m, dict)][:1]
            descriptor = entries[-1] if entries else None
        if descriptor is None:
            raise RegistryError(f"{self.name}: no image tagged {reference!r}")
        digest = str(descriptor.get("digest"))
        data = self._read(self._path(digest), MAX_MANIFEST)
        import hashlib

        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise RegistryError(f"{self.name}: blob {digest[:19]}… does not have that digest")
        media_type = str(descriptor.get("mediaType") or "")
        if not media_type:
            try:
                media_type = str(load_json(data).get("mediaType") or "")
            except (json.JSONDecodeError, AttributeError, UnicodeDecodeError):
                media_type = ""
        return Manifest(data, media_type, digest)

    def blob(self, digest: str, size: int | None) -> Path:
        path = self._path(digest)
        if not path.is_file() or path.is_symlink():
            raise RegistryError(f"{self.name}: blob {digest[:19]}… is missing")
        if size is not None and path.stat().st_size != size:
            raise RegistryError(f"{self.name}: blob {digest[:19]}… is {path.stat().st_size} bytes, the manifest "
                                f"says {size}")
        return path

    def small_blob(self, digest: str, limit: int = MAX_CONFIG) -> bytes:
        import hashlib

        data = self._read(self.blob(digest, None), limit)
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise RegistryError(f"{self.name}: blob {digest[:19]}… does not have that digest")
        return data

    def has_blob(self, digest: str) -> bool:
        return self._path(digest).is_file()

    def put_blob(self, path: Path, digest: str, size: int, source: Repository | None = None) -> None:
        final = self._path(digest)
        if final.is_file():
            return
        with streamed_into(final, digest, size) as write, open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                write(chunk)

    def put_bytes(self, data: bytes, digest: str) -> None:
        final = self._path(digest)
        if not final.is_file():
            write_atomic(final, data)

    def put_manifest(self, tag: str, manifest: Manifest) -> None:
        self.put_bytes(manifest.data, manifest.digest)
        index = self._index()
        kept = [m for m in index["manifests"]
                if not (isinstance(m, dict) and (m.get("annotations") or {}).get(REF_NAME) == tag)]
        kept.append({"mediaType": manifest.media_type, "digest": manifest.digest, "size": len(manifest.data),
                     "annotations": {REF_NAME: tag}})
        index["manifests"] = kept
        write_atomic(self.root / "index.json", json.dumps(index, indent=1).encode())

