"""OCI image layouts built entry by entry, for the image tests: a layer may hold what no build tool
makes on purpose (a FIFO or a device where a module belongs, a whiteout of the engine's package, a
file of GiB of zeros, many large files under a `.patchctl/` folder), and a layout on disk needs no
registry and no tool. Layers are written to their blob file as they are made (a file of zeros is
never held in memory), with the digest of the blob and the diff_id of the tar."""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import tarfile
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from patchctl.core.atomic import write_atomic

LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"
_ZERO_CHUNK = 1 << 20


@dataclass(frozen=True)
class TarEntry:
    name: str
    kind: str = "file"  # file, dir, fifo, chr, blk, symlink, hardlink
    data: bytes = b""
    link: str = ""  # what a symlink or hard link names
    zeros: int = 0  # a regular file of this many zero bytes (streamed, never held)


def file(name: str, data: bytes | str) -> TarEntry:
    return TarEntry(name, "file", data.encode() if isinstance(data, str) else data)


def whiteout(path: str) -> TarEntry:
    """`.wh.NAME` beside NAME: a later layer deleting NAME (a file or a whole folder)."""
    parent, _, base = path.rstrip("/").rpartition("/")
    return TarEntry(f"{parent}/.wh.{base}" if parent else f".wh.{base}")


def opaque(folder: str) -> TarEntry:
    """`.wh..wh..opq` in folder: what lower layers put in it is hidden."""
    return TarEntry(f"{folder.rstrip('/')}/.wh..wh..opq")


def engine_files(site: str, dist: str, version: str, files: Mapping[str, str | bytes]) -> list[TarEntry]:
    """What pip leaves under an import root `site`: the package's files and the dist-info METADATA."""
    site = site.rstrip("/") + "/"
    info = f"{site}{dist.replace('-', '_')}-{version}.dist-info/METADATA"
    return [file(info, f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")] + [
        file(site + rel, data) for rel, data in files.items()
    ]


@dataclass(frozen=True)
class BuiltLayer:
    digest: str
    size: int
    diff_id: str
    media_type: str

    def descriptor(self) -> dict:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


class _Sink:
    """The blob as it is written: raw tar bytes in, (gzip-compressed) blob bytes out to a file,
    the tar's sha256 (diff_id) and the blob's sha256 (digest) kept."""

    def __init__(self, out: io.BufferedWriter, compress: bool):
        self.out = out
        self.compress = compress
        self.tar_hash = hashlib.sha256()
        self.blob_hash = hashlib.sha256()
        self.size = 0
        self.crc = 0
        self.length = 0
        self._z = zlib.compressobj(9, zlib.DEFLATED, -15) if compress else None
        if compress:
            self._emit(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff")

    def _emit(self, data: bytes) -> None:
        if data:
            self.blob_hash.update(data)
            self.size += len(data)
            self.out.write(data)

    def write(self, data: bytes) -> int:
        self.tar_hash.update(data)
        self.crc = zlib.crc32(data, self.crc)
        self.length += len(data)
        self._emit(self._z.compress(data) if self._z is not None else data)
        return len(data)

    def zeros(self, count: int) -> None:
        """count zero bytes, fast: after a full flush deflate starts afresh, so every 1 MiB of zeros
        compresses to the same bytes, computed once."""
        zero = bytes(_ZERO_CHUNK)
        block = zero
        if self._z is not None:
            self._emit(self._z.flush(zlib.Z_FULL_FLUSH))
            block = self._z.compress(zero) + self._z.flush(zlib.Z_FULL_FLUSH)
        whole, rest = divmod(count, _ZERO_CHUNK)
        for _ in range(whole):
            self.tar_hash.update(zero)
            self.crc = zlib.crc32(zero, self.crc)
            self.length += _ZERO_CHUNK
            self._emit(block)
        if rest:
            self.write(bytes(rest))

    def close(self) -> None:
        if self._z is not None:
            self._emit(self._z.flush())
            self._emit(struct.pack("<II", self.crc & 0xFFFFFFFF, self.length & 0xFFFFFFFF))


def _info(entry: TarEntry) -> tarfile.TarInfo:
    info = tarfile.TarInfo(entry.name)
    info.mode = 0o755 if entry.kind == "dir" else 0o644
    info.mtime = 1_700_000_000
    info.type = {
        "file": tarfile.REGTYPE,
        "dir": tarfile.DIRTYPE,
        "fifo": tarfile.FIFOTYPE,
        "chr": tarfile.CHRTYPE,
        "blk": tarfile.BLKTYPE,
        "symlink": tarfile.SYMTYPE,
        "hardlink": tarfile.LNKTYPE,
    }[entry.kind]
    info.linkname = entry.link
    if entry.kind == "file":
        info.size = entry.zeros or len(entry.data)
    return info


def write_layer(root: Path, entries: Iterable[TarEntry], *, compress: bool = True) -> BuiltLayer:
    """The layer as a blob of the layout at root."""
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    tmp = blobs / ".building"
    with open(tmp, "wb") as out:
        sink = _Sink(out, compress)
        for entry in entries:
            info = _info(entry)
            sink.write(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
            if entry.kind != "file":
                continue
            if entry.zeros:
                sink.zeros(entry.zeros)
            else:
                sink.write(entry.data)
            pad = -info.size % tarfile.BLOCKSIZE
            if pad:
                sink.write(bytes(pad))
        sink.write(bytes(2 * tarfile.BLOCKSIZE))  # the end-of-archive marker
        sink.close()
    digest = "sha256:" + sink.blob_hash.hexdigest()
    tmp.rename(blobs / digest[7:])
    return BuiltLayer(digest, sink.size, "sha256:" + sink.tar_hash.hexdigest(), LAYER_GZIP if compress else LAYER_TAR)


def put_json(root: Path, doc: dict) -> tuple[str, int]:
    data = json.dumps(doc).encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    (root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    write_atomic(root / "blobs" / "sha256" / digest[7:], data)
    return digest, len(data)


def write_image(
    root: Path, layers: Sequence[BuiltLayer], *, tag: str = "base", history: list[dict] | None = None, arch: str = "amd64"
) -> dict:
    """Config, manifest and the index.json entry tagging it (index.json made or extended);
    returns the manifest's descriptor."""
    root.mkdir(parents=True, exist_ok=True)
    write_atomic(root / "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
    config = {
        "architecture": arch,
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": history if history is not None else [{"created_by": f"layer {i}"} for i in range(len(layers))],
    }
    config_digest, config_size = put_json(root, config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "digest": config_digest, "size": config_size},
        "layers": [layer.descriptor() for layer in layers],
    }
    digest, size = put_json(root, manifest)
    index_path = root / "index.json"
    index: dict = (
        json.loads(index_path.read_text()) if index_path.is_file() else {"schemaVersion": 2, "mediaType": INDEX, "manifests": []}
    )
    descriptor = {"mediaType": MANIFEST, "digest": digest, "size": size, "annotations": {REF_NAME: tag}}
    manifests: list[dict] = [m for m in index["manifests"] if (m.get("annotations") or {}).get(REF_NAME) != tag]
    index["manifests"] = manifests + [descriptor]
    write_atomic(index_path, json.dumps(index).encode())
    return descriptor


def image(root: Path, layers: Sequence[Iterable[TarEntry]], *, tag: str = "base", compress: bool = True) -> list[BuiltLayer]:
    """A layout at root whose image `tag` stacks these layers, bottom first."""
    built = [write_layer(root, entries, compress=compress) for entries in layers]
    write_image(root, built, tag=tag)
    return built


def blob_path(root: Path, digest: str) -> Path:
    return root / "blobs" / "sha256" / digest.removeprefix("sha256:")


def flip_byte(path: Path, at: int) -> None:
    """Change one byte in place (the size stays): damage a digest check must catch."""
    with open(path, "r+b") as f:
        f.seek(at)
        old = f.read(1)
        f.seek(at)
        f.write(bytes([old[0] ^ 0xFF]))


# --- a small SGLang in an image, and a store of two patches for it --------------------------------

SITE = "usr/lib/python3/site-packages/"
A_PY = "".join(f"def a{i}():\n    return {i}\n\n\n" for i in range(8))
B_PY = "".join(f"def b{i}():\n    return {i}\n\n\n" for i in range(8))
ENGINE = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/a.py": A_PY,
    "sglang/srt/b.py": B_PY,
    "sglang/srt/c.py": "C = 1\n",
}
PATCHED = ("sglang/srt/a.py", "sglang/srt/b.py")  # the files the store's patches edit


def sglang_layer(version: str = "0.5.9") -> list[TarEntry]:
    return engine_files(SITE, "sglang", version, ENGINE)


def two_patch_store(root: Path, *, delete: str | None = None) -> Path:
    """patches/sglang with `pa` (edits a.py) and `pb` (edits b.py), and with delete a third patch
    `pd` removing that file: a store `--store` takes."""
    from support.builders import StoreBuilder

    builder = StoreBuilder(root)
    builder.add(
        "sglang",
        "pa",
        variants={
            "0.5.0": builder.variant({"sglang/srt/a.py": A_PY}, {"sglang/srt/a.py": A_PY.replace("return 3", "return 30")})
        },
    )
    builder.add(
        "sglang",
        "pb",
        variants={
            "0.5.0": builder.variant({"sglang/srt/b.py": B_PY}, {"sglang/srt/b.py": B_PY.replace("return 5", "return 50")})
        },
    )
    if delete is not None:
        content = ENGINE[delete]
        builder.add("sglang", "pd", variants={"0.5.0": builder.variant({delete: content}, {delete: None})})
    return root


def copy_layer(source: Path, dest: Path, layer: BuiltLayer) -> BuiltLayer:
    """A layer of one layout put into another (a large generated layer is made once)."""
    (dest / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    target = blob_path(dest, layer.digest)
    if not target.exists():
        os.link(blob_path(source, layer.digest), target)
    return layer


def tagged(root: Path, tag: str) -> bool:
    """Whether the layout at root has an image tagged `tag` (what a push would have written)."""
    index = root / "index.json"
    if not index.is_file():
        return False
    return any((m.get("annotations") or {}).get(REF_NAME) == tag for m in json.loads(index.read_text())["manifests"])
