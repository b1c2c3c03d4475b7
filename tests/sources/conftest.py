"""What the sources tests share: a store of one patch, `loader`, clean on the synthetic vllm 1.0 (a
module that needs another store defines its own `store`)."""

import pytest
from support.fixtures import PRISTINE, loader_with


@pytest.fixture
def store(builder):
    builder.add("vllm", "loader", variants={"1.0": builder.variant(PRISTINE, {"vllm/loader.py": loader_with({10: "ten\n"})})})
    return builder.root
