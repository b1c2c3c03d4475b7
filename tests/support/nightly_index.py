"""vLLM's nightly wheel repository (https://wheels.vllm.ai) on 127.0.0.1, laid out exactly as upstream:
PEP 503 HTML only, `/nightly/vllm/` for main, `/nightly/<variant>/vllm/` per build variant, `/<commit>/vllm/`
per commit, wheels under `/<commit>/`, relative links (`../../<commit>/vllm-…%2Bg….whl`), the local version's
`+` percent-encoded, and no `#sha256=`. A switch makes it ignore Range, as some mirrors do. Responders on
the one test server (checklib.testserver)."""

from __future__ import annotations

import base64
import hashlib
import re
import urllib.parse
import zipfile
from pathlib import Path
from types import TracebackType

from checklib.testserver import Reply, Request, TestServer, file_reply, pep503_page, redirect

WHEEL_TAG = "cp38-abi3-manylinux_2_31_x86_64"


def touched_paths(store: Path, engine: str) -> list[str]:
    """Every file the store's variants of `engine` write (`+++ b/PATH`), import-root relative."""
    return sorted(
        {m.group(1) for p in (store / engine).glob("*/*.patch") for m in re.finditer(r"^\+\+\+ b/(\S+)", p.read_text(), re.M)}
    )


def release_files(engine: str, version: str, paths: list[str]) -> dict[str, bytes]:
    """The real files of a release at those paths (read sparsely from the package index; absent ones left out):
    what a repackaged dev build carries."""
    from packaging.version import Version

    from patchctl.core.engines import get_engine
    from patchctl.sources.fetch import SourceContext, release

    source = release(get_engine(engine), Version(version), SourceContext())
    files = {path: source.read(path) for path in paths}
    return {p: d for p, d in files.items() if d is not None}


def sglang_layout_repo(repo: Path, files: dict[str, bytes], *, tag: str, commits_after: int = 2) -> Path:
    """A git repository laid out like SGLang's: `files` (import-root relative) under python/,
    python/sglang/version.py holding setuptools-scm's fallback, one commit tagged `tag`, then
    `commits_after` commits (main's version is then the next release .devN+g<sha>)."""
    from support.builders import git, write_tree

    tree: dict[str, str | bytes] = {f"python/{p}": d for p, d in files.items()}
    tree.setdefault("python/sglang/version.py", b'__version__ = "0.0.0.dev0"\n')  # main's fallback
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    write_tree(repo, tree)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", tag)
    git(repo, "tag", tag)
    for i in range(commits_after):
        write_tree(repo, {"README.md": f"commit {i}\n"})
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"after {i}")
    return repo


def build_dev_wheel(
    dest: Path,
    version: str,
    files: dict[str, bytes],
    *,
    dist: str = "vllm",
    tamper: dict[str, bytes] | None = None,
    tag: str = WHEEL_TAG,
) -> Path:
    """A wheel named like vLLM's nightlies, METADATA and RECORD written for `version`; `tamper` replaces
    members after RECORD was computed (CRC-32 stays right: only RECORD can tell)."""
    norm = dist.replace("-", "_")
    path = dest / f"{norm}-{version}-{tag}.whl"
    info = f"{norm}-{version}.dist-info"
    entries = dict(files)
    entries[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode()
    entries[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: patchctl-tests\nRoot-Is-Purelib: false\nTag: {tag}\n").encode()
    rows = []
    for name, data in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{name},sha256={digest},{len(data)}")
    rows.append(f"{info}/RECORD,,")
    entries.update(tamper or {})
    entries[f"{info}/RECORD"] = ("\n".join(rows) + "\n").encode()
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
    return path


class NightlyIndex:
    """`publish(commit, wheel, nightly=True, variant=None)` puts a build at /<commit>/ and, for main, on
    /nightly/ (or /nightly/<variant>/). `url` is the nightly index (what --nightly-source takes).
    Responders on the one test server."""

    def __init__(self, root_dir: Path):
        self.root_dir = root_dir
        self.builds: dict[str, list[Path]] = {}  # commit -> wheels
        self.nightly: dict[str | None, list[tuple[str, Path]]] = {}  # variant -> (commit, wheel)
        self.honour_range = True
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header), HEAD included
        self.full_downloads = 0  # GETs of a whole wheel (no Range, or Range ignored)
        self.server = TestServer([self._respond], protocol="HTTP/1.0")

    @property
    def root(self) -> str:
        return self.server.root

    @property
    def url(self) -> str:
        return f"{self.root}/nightly"

    def publish(self, commit: str, wheel: Path, *, nightly: bool = True, variant: str | None = None) -> None:
        self.builds.setdefault(commit, []).append(wheel)
        if nightly:
            self.nightly.setdefault(variant, []).append((commit, wheel))

    def __enter__(self) -> NightlyIndex:
        self.server.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.server.stop()

    def range_requests(self) -> int:
        return sum(1 for _, rng in self.requests if rng)

    def _page(self, path: str) -> Reply | None:
        """The HTML of a project page (links relative to it, as upstream writes them), or None."""
        parts = [p for p in path.split("/") if p]
        if len(parts) < 2 or parts[-1] != "vllm":
            return None
        up = "../" * len(parts)
        if parts[0] == "nightly" and len(parts) in (2, 3):
            variant = parts[1] if len(parts) == 3 else None
            links = [(f"{up}{commit}/{w.name}", w.name) for commit, w in self.nightly.get(variant, [])]
        elif len(parts) == 2 and parts[0] in self.builds:
            links = [(f"../{w.name}", w.name) for w in self.builds[parts[0]]]
        else:
            return None
        return pep503_page("vllm", ((urllib.parse.quote(href), urllib.parse.quote(name)) for href, name in links))

    def _file(self, path: str) -> Path | None:
        m = re.fullmatch(r"/([0-9a-f]+)/([^/]+\.whl)", path)
        if not m:
            return None
        name = urllib.parse.unquote(m.group(2))
        return next((w for w in self.builds.get(m.group(1), []) if w.name == name), None)

    def _respond(self, request: Request) -> Reply | None:
        self.requests.append((request.path + (f"?{request.query}" if request.query else ""), request.headers.get("Range")))
        path = request.path
        if not path.endswith("/") and not path.endswith(".whl"):
            return redirect(path + "/")  # as a static server does for a folder without its slash
        page = self._page(path)
        if page is not None:
            return page
        wheel = self._file(path)
        if wheel is None:
            return None
        reply = file_reply(wheel.read_bytes(), request, honour_range=self.honour_range)
        if reply.status == 200 and request.method != "HEAD":
            self.full_downloads += 1
        return reply
