"""A model-server pod dies behind a real Envoy: the EPP stops sending it traffic within a second of
its scrape being refused, and sends it traffic again once it is back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from llm_epp.sim.stub import BackendPool
from tests.envoy.conftest import Stack, start_stack, stop_stack
from tests.support.wait import wait_until

pytestmark = pytest.mark.envoy

NO_METRICS_CONFIG = """\
plugins:
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: random-picker
dataLayer:
  sources: []
"""


def send(stack: Stack, n: int, workers: int = 8) -> list[int]:
    def one(i: int) -> int:
        with httpx.Client(timeout=30) as c:
            body = {"model": "m", "prompt": f"request {i} " * 5, "max_tokens": 2}
            return c.post(stack.url("/v1/completions"), json=body).status_code

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, range(n)))


@pytest.fixture
def backends() -> Iterator[BackendPool]:
    with BackendPool(3) as pool:
        yield pool


@pytest.mark.parametrize("config", ["default", "no-metrics"])
def test_no_request_reaches_a_dead_pod_after_the_first_second(backends: BackendPool, config: str) -> None:
    args: tuple[str, ...] = ("--config-text", NO_METRICS_CONFIG) if config == "no-metrics" else ()
    stack = start_stack(backends, epp_args=args)
    dead = backends[0]
    try:
        assert send(stack, 30) == [200] * 30
        assert dead.served > 0  # alive, it has its share
        backends.call(dead.stop())  # the pod dies: connections refused from now on
        time.sleep(1.0)
        statuses = send(stack, 150)
        lost = sum(s != 200 for s in statuses)
        assert lost == 0, f"{lost} of 150 requests failed after the pod died"
        assert "endpoint_unreachable" in stack.epp.log()
        dead.reset()
        backends.call(dead.start())  # it comes back on the same address
        wait_until(lambda: send(stack, 10) == [200] * 10 and dead.served > 0, "the pod to get traffic again", 15)
    finally:
        stop_stack(stack)
