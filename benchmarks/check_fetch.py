"""`check` of the vLLM patch set on one release, cold cache: the sparse path (range reads of the
wheel) against the naive path (download the sdist, extract it, `git apply --check`), in one run.

    python benchmarks/check_fetch.py [--version 0.23.0]

Targets (issue 2): sparse bytes <= 2% of the artifact's, and >= 10x faster.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from packaging.version import Version

from patchctl.core.config import resolve_index
from patchctl.core.engines import get_engine
from patchctl.patching import evaluate
from patchctl.sources import http
from patchctl.sources.index import PackageIndex
from patchctl.sources.release import ReleaseSource, choose_artifact
from patchctl.store.layered import Store
from patchctl.store.series import choose_variant


def sparse(version: Version, cache: Path, patches) -> tuple[float, int, int, list[str]]:
    start = time.perf_counter()
    index = PackageIndex(resolve_index().url, cache)
    artifact = choose_artifact(index.project("vllm"), version)
    source = ReleaseSource(get_engine("vllm"), artifact, cache)
    result = evaluate.evaluate(patches, version, source)
    return time.perf_counter() - start, source.bytes_fetched, artifact.size, [o.outcome for o in result.outcomes]


def naive(version: Version, workdir: Path, patches) -> tuple[float, int, int, list[str]]:
    start = time.perf_counter()
    index = PackageIndex(resolve_index().url, workdir / "cache")
    sdist = next(f for f in index.project("vllm").files_for(version) if f.kind == "sdist")
    response = http.get(sdist.url, stream=True)
    archive = workdir / sdist.filename
    digest = hashlib.sha256()
    with open(archive, "wb") as out:
        for chunk in response.iter_content(1 << 20):
            out.write(chunk)
            digest.update(chunk)
    assert digest.hexdigest() == sdist.sha256
    with tarfile.open(archive) as tf:
        tf.extractall(workdir / "src", filter="data")
    (root,) = list((workdir / "src").iterdir())
    outcomes = []
    for patch in patches:
        choice = choose_variant(patch, version)
        if choice.variant is None:
            outcomes.append("obsolete")
            continue
        proc = subprocess.run(["git", "apply", "--check", str(choice.variant.path)], cwd=root, capture_output=True)
        outcomes.append("applies" if proc.returncode == 0 else "fails")
    return time.perf_counter() - start, archive.stat().st_size, sdist.size or archive.stat().st_size, outcomes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--version", default="0.23.0")
    args = parser.parse_args()
    version = Version(args.version)
    patches = Store.open().series("vllm").patches
    resolve_index()  # pip's configuration (~0.5 s to import) is the same cost for both paths: not timed
    if not patches:
        sys.exit("the store has no vLLM patches to check")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        s_time, s_bytes, s_size, s_out = sparse(version, tmp / "sparse-cache", patches)
        n_time, n_bytes, n_size, n_out = naive(version, tmp, patches)
    print(f"check vllm@{version}, {len(patches)} patches, cold cache")
    print(f"{'path':<8} {'wall s':>8} {'bytes fetched':>14} {'artifact bytes':>15} {'% of artifact':>14}  outcomes")
    print(f"{'sparse':<8} {s_time:>8.2f} {s_bytes:>14,} {s_size:>15,} {100 * s_bytes / s_size:>13.2f}%  {' '.join(s_out)}")
    print(f"{'naive':<8} {n_time:>8.2f} {n_bytes:>14,} {n_size:>15,} {100 * n_bytes / n_size:>13.2f}%  {' '.join(n_out)}")
    print(
        f"speed-up {n_time / s_time:.1f}x; sparse bytes {100 * s_bytes / s_size:.2f}% of its artifact "
        f"(target <= 2%), {100 * s_bytes / n_bytes:.2f}% of the sdist"
    )


if __name__ == "__main__":
    main()
