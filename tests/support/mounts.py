"""A small real tmpfs for tests that need a full disk (ENOSPC where it really happens): mounted on a
folder of the test's, skipped (saying why) where this machine cannot mount one."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def small_tmpfs(mnt: Path, size: int) -> Iterator[Path]:
    """A tmpfs of `size` bytes (rounded to KiB) on mnt, unmounted afterwards."""
    import pytest

    mnt.mkdir(parents=True, exist_ok=True)
    try:
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={max(4, size // 1024)}k", "tmpfs", str(mnt)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except FileNotFoundError:
        pytest.skip("no mount command on this machine: cannot make a small tmpfs")
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {proc.stderr.strip() or proc.returncode}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)
