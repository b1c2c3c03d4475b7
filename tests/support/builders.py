"""Real files, real git: a store with variants made by `git format-patch`, and engine trees."""

from __future__ import annotations

import base64
import hashlib
import random
import zipfile
from collections.abc import Mapping
from pathlib import Path

import yaml

from patchctl.core import gitutil


def git(cwd: Path, *args: str) -> str:
    return gitutil.git(cwd, *args).stdout


def write_tree(root: Path, files: Mapping[str, str | bytes]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return root


def make_variant(
    workdir: Path, pristine: dict[str, str], patched: dict[str, str | None], subject: str, body: str = "Why: a test."
) -> bytes:
    """A git format-patch mail turning `pristine` into `patched` (None deletes a file)."""
    repo = workdir
    repo.mkdir(parents=True, exist_ok=True)
    git(repo, "init", "-q")
    write_tree(repo, pristine)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", "pristine")
    for rel, content in patched.items():
        if content is None:
            (repo / rel).unlink()
        else:
            write_tree(repo, {rel: content})
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", subject, "-m", body)
    return git(repo, "format-patch", "-1", "--stdout", "--zero-commit", "--no-signature", "--full-index", "HEAD").encode()


class StoreBuilder:
    """patches/<engine>/series.yaml + patch folders, pinned like the real store."""

    def __init__(self, root: Path):
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self._series: dict[str, list[dict]] = {}
        self._scratch = 0

    def add(
        self,
        engine: str,
        name: str,
        *,
        applies_to: str = ">=0",
        variants: dict[str, bytes],
        depends_on: tuple[str, ...] = (),
        requires: tuple[str, ...] = (),
        drop_when: str | None = None,
        pin: bool = True,
        extra_meta: dict | None = None,
    ) -> Path:
        folder = self.root / engine / name
        folder.mkdir(parents=True, exist_ok=True)
        meta = {
            "title": f"Test patch {name}",
            "why": "tests",
            "applies_to": applies_to,
            "depends_on": list(depends_on),
            "requires": list(requires),
        }
        if drop_when:
            meta["drop_when"] = drop_when
        meta.update(extra_meta or {})
        (folder / "patch.yaml").write_text(yaml.safe_dump(meta))
        pins = {}
        for base, data in variants.items():
            (folder / f"{base}.patch").write_bytes(data)
            pins[f"{base}.patch"] = hashlib.sha256(data).hexdigest()
        self._series.setdefault(engine, []).append({"name": name, "variants": pins if pin else {}})
        (self.root / engine / "series.yaml").write_text(
            yaml.safe_dump({"engine": engine, "patches": self._series[engine]}, sort_keys=False)
        )
        return folder

    def variant(self, pristine: dict[str, str], patched: dict[str, str | None], subject: str = "test change") -> bytes:
        self._scratch += 1
        return make_variant(self.root.parent / f".scratch-{self._scratch}", pristine, patched, subject)


def build_wheel(dest: Path, dist: str, version: str, files: Mapping[str, str | bytes]) -> Path:
    """A real wheel (zip + dist-info with METADATA, WHEEL and a RECORD of sha256s)."""
    norm = dist.replace("-", "_")
    path = dest / f"{norm}-{version}-py3-none-any.whl"
    info = f"{norm}-{version}.dist-info"
    entries = dict(files)
    entries[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
    entries[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: patchctl-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for name, content in entries.items():
        data = content.encode() if isinstance(content, str) else content
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    entries[f"{info}/RECORD"] = "\n".join(record) + "\n"
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, content in entries.items():
            zf.writestr(name, content)
    return path


def install_fake_dist(site: Path, dist: str, version: str, files: dict[str, str]) -> None:
    """What pip leaves in site-packages: the package files and a .dist-info with METADATA."""
    write_tree(site, files)
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    # RECORD as pip writes it: path, urlsafe-base64 sha256 without padding, size.
    rows = []
    for rel, content in sorted(files.items()):
        data = content.encode() if isinstance(content, str) else content
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{rel},sha256={digest},{len(data)}\n")
    rows += [f"{info.name}/METADATA,,\n", f"{info.name}/RECORD,,\n"]
    (info / "RECORD").write_text("".join(rows))


def filler_blobs(count: int, size: int = 150_000) -> dict[str, bytes]:
    """Incompressible files for a synthetic vllm wheel, so that it is much larger than what a sparse
    read needs (release.choose then reads it by ranges, not whole). The same bytes every run."""
    return {f"vllm/filler/blob{i}.bin": random.Random(i).randbytes(size) for i in range(count)}


def fake_venv(
    prefix: Path, *, cfg_version: str | None = "version", system_site: bool = False, interpreter: str | None = None
) -> Path:
    """A venv as `python -m venv` lays it out, without running anything: bin/python a link to this
    interpreter (or, interpreter: a script with that text), pyvenv.cfg, lib/pythonX.Y/site-packages.
    cfg_version: the key naming the version ("version", uv's "version_info") or None (none named).
    Returns site-packages."""
    import os
    import sys

    xy = f"{sys.version_info.major}.{sys.version_info.minor}"
    full = ".".join(map(str, sys.version_info[:3]))
    site = prefix / "lib" / f"python{xy}" / "site-packages"
    site.mkdir(parents=True)
    (prefix / "bin").mkdir()
    python = prefix / "bin" / "python"
    if interpreter is None:
        python.symlink_to(sys.executable)
    else:
        python.write_text(interpreter)
        python.chmod(0o755)
    lines = [f"home = {Path(sys.executable).parent}", f"include-system-site-packages = {'true' if system_site else 'false'}"]
    if cfg_version == "version":
        lines.append(f"version = {full}")
    elif cfg_version == "version_info":
        lines.append(f"version_info = {full}.final.0")
    (prefix / "pyvenv.cfg").write_text("\n".join(lines) + "\n")
    if not (prefix / "lib64").exists():
        os.symlink("lib", prefix / "lib64")
    return site
