"""A whole artifact in one streamed GET, its sha256 computed on the way and compared with the one the
index published: the bytes land beside the target and are renamed over it only when they match."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from patchctl.core.errors import NetworkError
from patchctl.sources import http
from patchctl.sources.files import ProgressSink


def download(
    url: str,
    target: Path,
    *,
    filename: str,
    expected_sha256: str | None,
    size: int | None,
    progress: ProgressSink,
    count: Callable[[int], None],
) -> str:
    """Fetch `url` into `target` (its folder must exist); returns the sha256 of what was fetched.
    With expected_sha256 None (an index that publishes none) nothing is compared here: the caller
    checks the members against RECORD and records the digest."""
    # Held to the size the index lists and to --max-download (refused before the request when over it).
    response = http.get(url, stream=True, what=filename, max_bytes=size or None)
    if response.status_code != 200:
        response.close()
        raise NetworkError(f"{filename}: HTTP {response.status_code}")
    total = response.length() or size or None
    progress.start(filename, total)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.part")
    digest = hashlib.sha256()
    try:
        # O_EXCL|O_NOFOLLOW: a name planted at the temp path is not written through.
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as out:
            for chunk in response.iter_content(1 << 20):
                out.write(chunk)
                digest.update(chunk)
                count(len(chunk))
                progress.advance(len(chunk))
    except NetworkError as exc:  # past a limit, cut short, past the deadline: it names the URL itself
        tmp.unlink(missing_ok=True)
        if not exc.message.startswith(filename):
            exc.message = f"download of {filename}: {exc.message}"
            exc.args = (exc.message,)
        raise
    except Exception as exc:
        response.close()
        tmp.unlink(missing_ok=True)
        raise NetworkError(f"download of {filename} broke off: {exc}") from None
    except BaseException:  # Ctrl-C: no part file left in the cache either
        response.close()
        tmp.unlink(missing_ok=True)
        raise
    finally:
        progress.finish()
    if expected_sha256 is not None and digest.hexdigest() != expected_sha256:
        tmp.unlink(missing_ok=True)
        raise NetworkError(f"{filename}: sha256 {digest.hexdigest()} does not match the index's {expected_sha256}")
    os.replace(tmp, target)
    return digest.hexdigest()
