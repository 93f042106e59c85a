"""Fixtures shared by the simulated-pod tests: each test module defines its own ``server`` (the pod it needs);
``client`` talks to it over loopback HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from llm_epp.sim.server import SimServer


@pytest.fixture
async def client(server: SimServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as c:
        yield c
