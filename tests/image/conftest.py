"""Real parts for the image tests: Debian's registry (the distribution reference implementation)
started on 127.0.0.1 with its storage in a temporary folder, and an image built here with umoci
holding the real SGLang 0.5.9 wheel installed by pip under /usr/lib/python3/site-packages, pushed
with skopeo. Each fixture skips, saying why, when its tool is missing."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REGISTRY = "/usr/bin/docker-registry"
SITE = "usr/lib/python3/site-packages"
SGLANG = "0.5.9"


def need(tool: str) -> str:
    path = shutil.which(tool) or (tool if Path(tool).is_file() else None)
    if path is None:
        pytest.skip(f"{tool} is not installed (.ci/run installs docker-registry, skopeo, umoci, buildah)")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_registry(folder: Path, auth: str = ""):
    """The registry serving from folder on a free loopback port: (host:port, process)."""
    port = free_port()
    config = folder / "config.yml"
    config.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {folder / 'data'}\n"
        f"  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\nlog:\n  level: error\n{auth}"
    )
    log = open(folder / "log", "wb")
    proc = subprocess.Popen([REGISTRY, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    host = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(f"http://{host}/v2/", timeout=1).read()
            break
        except urllib.error.HTTPError:
            break  # 401: up, and asking for a login
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"the registry did not start: {(folder / 'log').read_text()[-2000:]}")
            time.sleep(0.1)
    log.close()
    return host, proc


@pytest.fixture(scope="session")
def registry(tmp_path_factory) -> str:
    """host:port of a fresh registry on loopback (plain HTTP, as loopback registries are)."""
    need(REGISTRY)
    host, proc = start_registry(tmp_path_factory.mktemp("registry"))
    yield host
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="session")
def sglang_wheel(tmp_path_factory) -> Path:
    """The real SGLang release wheel, through the configured package index."""
    folder = tmp_path_factory.mktemp("wheels")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"sglang=={SGLANG}", "-d", str(folder)],
        capture_output=True,
        text=True,
    )
    wheels = list(folder.glob("sglang-*.whl"))
    if proc.returncode != 0 or not wheels:
        pytest.skip(f"sglang=={SGLANG} could not be downloaded: {proc.stderr[-300:]}")
    return wheels[0]


def pip_install(wheel: Path, target: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )


@pytest.fixture(scope="session")
def release_tree(tmp_path_factory, sglang_wheel) -> Path:
    """The same release pip-installed into a plain folder: what `apply --target` patches."""
    tree = tmp_path_factory.mktemp("release") / "site-packages"
    pip_install(sglang_wheel, tree)
    return tree


def run(*cmd: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}: {proc.stderr[-2000:]}"
    return proc.stdout


@pytest.fixture(scope="session")
def sglang_layout(tmp_path_factory, sglang_wheel) -> Path:
    """An OCI layout `L:base` built with umoci: an empty base and one layer with the release."""
    umoci = need("umoci")
    work = tmp_path_factory.mktemp("build")
    layout, bundle = work / "L", work / "bundle"
    run(umoci, "init", "--layout", str(layout))
    run(umoci, "new", "--image", f"{layout}:base")
    run(umoci, "unpack", "--image", f"{layout}:base", str(bundle))
    pip_install(sglang_wheel, bundle / "rootfs" / SITE)
    run(umoci, "repack", "--image", f"{layout}:base", str(bundle))
    run(umoci, "config", "--image", f"{layout}:base", "--config.cmd", "python3")
    return layout


@pytest.fixture(scope="session")
def sglang_image(registry, sglang_layout) -> str:
    """The image on the registry: REGISTRY/test/sglang:0.5.9."""
    skopeo = need("skopeo")
    ref = f"{registry}/test/sglang:{SGLANG}"
    run(skopeo, "copy", "--quiet", "--dest-tls-verify=false", f"oci:{sglang_layout}:base", f"docker://{ref}")
    return ref


def unpack(registry_ref: str, dest: Path) -> Path:
    """The image's root file system, as skopeo pulls it and umoci unpacks it (no patchctl involved)."""
    skopeo, umoci = need("skopeo"), need("umoci")
    layout = dest.parent / (dest.name + "-layout")
    run(skopeo, "copy", "--quiet", "--src-tls-verify=false", f"docker://{registry_ref}", f"oci:{layout}:x")
    run(umoci, "unpack", "--image", f"{layout}:x", str(dest))
    return dest / "rootfs"
