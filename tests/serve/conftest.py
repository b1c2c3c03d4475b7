from __future__ import annotations

import pytest

from .shape_server import ShapeServer


@pytest.fixture
def shape_server():
    with ShapeServer() as server:
        yield server
