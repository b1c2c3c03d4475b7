"""A large layer is streamed: `apply --image` on an image with a 256 MiB incompressible layer
stays far under 200 MB of memory (the process's own peak, VmHWM: ru_maxrss would carry the forking
pytest worker's), and its blobs land in the cache by digest."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from patchctl.store.layered import default_store_dir
from tests.image.conftest import need, run

pytestmark = [pytest.mark.network, pytest.mark.slow]

PROBE = r"""
import atexit, sys
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            sys.stderr.write("VMHWM_KB " + line.split()[1] + "\n")
atexit.register(peak)
from patchctl.cli.main import main
sys.argv = ["patchctl"] + sys.argv[1:]
main()
"""


def test_memory_stays_bounded_on_a_large_layer(sglang_layout, registry, tmp_path):
    umoci, skopeo = need("umoci"), need("skopeo")
    layout, bundle = tmp_path / "L", tmp_path / "bundle"
    run("cp", "-a", str(sglang_layout), str(layout))
    run(umoci, "unpack", "--image", f"{layout}:base", str(bundle))
    (bundle / "rootfs" / "opt").mkdir()
    with open(bundle / "rootfs" / "opt" / "weights.bin", "wb") as f:
        for _ in range(256):
            f.write(os.urandom(1 << 20))
    run(umoci, "repack", "--image", f"{layout}:base", str(bundle))
    ref, to = f"{registry}/test/large:1", f"{registry}/test/large:patched"
    run(skopeo, "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}:base", f"docker://{ref}")
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            PROBE,
            "apply",
            "sglang",
            "--image",
            ref,
            "--to",
            to,
            "--store",
            str(default_store_dir()),
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    doc = json.loads(proc.stdout)
    assert proc.returncode == 0, doc
    peak_kb = int(next(line.split()[1] for line in proc.stderr.splitlines() if line.startswith("VMHWM_KB ")))
    assert peak_kb < 200 * 1024, f"peak memory {peak_kb // 1024} MB"
    cache = os.environ["PATCHCTL_CACHE_DIR"]
    sizes = [os.path.getsize(os.path.join(root, "blob")) for root, _, names in os.walk(cache) if "blob" in names]
    assert max(sizes) > 256 << 20  # the large layer, cached whole on disk by its digest
