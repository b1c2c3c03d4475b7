"""Where the bundled patch set is: inside the installed package (patchctl/bundled/, put there by
setup.py when a wheel is built), or, in a checkout and an editable install, the repository's patches/.
It is read-only to commands that write patches (`new`, `refresh`), which want a user store."""

from __future__ import annotations

from pathlib import Path


def bundled_store() -> Path | None:
    here = Path(__file__).resolve().parent.parent  # the package, above core/
    for candidate in (here / "bundled", here.parent / "patches"):
        if (candidate / "envs").is_dir() or any(candidate.glob("*/series.yaml")):
            return candidate
    return None
