"""A whole artifact in one streamed GET, its sha256 computed on the way and compared with the one the
index published: the bytes land beside the target and are renamed over it only when they match."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from patchctl.core.errors import NetworkError
from patchctl.sources import http, scratch
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
    digest = hashlib.sha256()
    try:
        # A part file beside the target: removed on every way out, a Ctrl-C on any thread included.
        with scratch.part_file(target) as part:
            for chunk in response.iter_content(1 << 20):
                part.file.write(chunk)
                digest.update(chunk)
                count(len(chunk))
                progress.advance(len(chunk))
            if expected_sha256 is not None and digest.hexdigest() != expected_sha256:
                raise NetworkError(f"{filename}: sha256 {digest.hexdigest()} does not match the index's {expected_sha256}")
            part.publish(target)
    except NetworkError as exc:  # past a limit, cut short, past the deadline: it names the URL itself
        response.close()
        if not exc.message.startswith(filename):
            exc.message = f"download of {filename}: {exc.message}"
            exc.args = (exc.message,)
        raise
    except Exception as exc:
        response.close()
        raise NetworkError(f"download of {filename} broke off: {exc}") from None
    except BaseException:  # Ctrl-C
        response.close()
        raise
    finally:
        progress.finish()
    return digest.hexdigest()
