"""The two-patch store the target tests share: `loader` changes a line, `utils` changes a function and
creates a file (vllm/added.py), both over support.fixtures.PRISTINE."""

import pytest
from support.fixtures import PRISTINE, loader_with

PATCHED_LOADER = loader_with({10: "ten\n"})
PATCHED_UTILS = PRISTINE["vllm/utils.py"].replace("return 2", "return 3")


@pytest.fixture
def store(builder):
    builder.add("vllm", "loader", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": PATCHED_LOADER})})
    builder.add(
        "vllm",
        "utils",
        variants={"1.0": builder.variant(PRISTINE, {"vllm/utils.py": PATCHED_UTILS, "vllm/added.py": "NEW = True\n"})},
    )
    return builder.root
