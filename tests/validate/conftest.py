from __future__ import annotations

import pytest
from support.reasoner import ReasonerServer


@pytest.fixture
def shape_server():
    with ReasonerServer() as server:
        yield server
