"""A tiny synthetic vLLM tree and the four-release index built from it: engine mechanics (offsets,
conflicts, upstreamed patches) tested against real wheels on a real local index, in milliseconds."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from support.builders import StoreBuilder, build_wheel
from support.index_server import IndexServer

PRISTINE = {
    "vllm/__init__.py": "",
    "vllm/loader.py": "".join(f"line {i}\n" for i in range(1, 41)),
    "vllm/utils.py": "def helper():\n    return 1\n\n\ndef other():\n    return 2\n",
}


def loader_with(changes: dict[int, str], base: str = PRISTINE["vllm/loader.py"]) -> str:
    lines = base.splitlines(keepends=True)
    for number, text in changes.items():
        lines[number - 1] = text
    return "".join(lines)


@contextlib.contextmanager
def four_release_index(tmp_path: Path, builder: StoreBuilder) -> Iterator[IndexServer]:
    """Four real wheels of vllm on a local index and one patch, `loader`, that is clean on 1.0,
    applies at an offset on 1.1, conflicts on 1.2 and is upstreamed on 1.3. Yields the server."""
    files = tmp_path / "files"
    files.mkdir()
    trees = {
        "1.0": PRISTINE,
        "1.1": dict(PRISTINE, **{"vllm/loader.py": "# new header\n" + PRISTINE["vllm/loader.py"]}),
        "1.2": dict(PRISTINE, **{"vllm/loader.py": loader_with({9: "nine!\n", 10: "TEN\n", 11: "eleven!\n"})}),
        "1.3": dict(PRISTINE, **{"vllm/loader.py": loader_with({10: "ten\n"})}),
    }
    builder.add(
        "vllm",
        "loader",
        applies_to=">=1.0",
        variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})},
    )
    with IndexServer(files) as server:
        for version, files_of_tree in trees.items():
            server.add("vllm", build_wheel(files, "vllm", version, files_of_tree))
        yield server
