from __future__ import annotations

import pytest

from tests.unit.extproc.fake_envoy import Harness


@pytest.fixture
def harness() -> Harness:
    return Harness("10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8001")
