"""SIGTERM to a real `llm-epp serve` behind a real Envoy (FailClose): the EPP reports not ready, keeps
serving new requests through the drain window, every in-flight stream completes, then it exits."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from llm_epp.observability.health import NOT_SERVING, SERVING
from llm_epp.sim.stub import BackendPool
from tests.envoy.conftest import Stack, start_stack, stop_stack
from tests.support.health import health
from tests.support.wait import wait_until

pytestmark = pytest.mark.envoy

STREAMS = 20
TOKENS = 40
ITL_S = 0.1  # each stream lasts ~4 s: longer than the drain window, so it ends after the EPP stops accepting


def stream(stack: Stack, i: int, started: threading.Barrier | None) -> tuple[int, bool, int]:
    body = {
        "model": "m",
        "prompt": f"stream {i}",
        "max_tokens": TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.Client(timeout=60) as c, c.stream("POST", stack.url("/v1/completions"), json=body) as r:
        chunks = r.iter_text()
        first = next(chunks, "")
        if started is not None:
            started.wait(30)
        text = first + "".join(chunks)
    return r.status_code, text.rstrip().endswith("data: [DONE]"), text.count("data: ")


@pytest.fixture
def backends() -> Iterator[BackendPool]:
    with BackendPool(3, itl_s=ITL_S) as pool:
        yield pool


def test_sigterm_drains_every_in_flight_stream_and_serves_new_requests(backends: BackendPool) -> None:
    stack = start_stack(
        backends,
        failure_mode="FailClose",
        response_body_mode="FULL_DUPLEX_STREAMED",
        epp_args=("--drain-timeout", "2500ms"),
    )
    try:
        health_port = stack.epp.ports["health"]
        assert health(health_port) == SERVING
        started = threading.Barrier(STREAMS + 1)
        with ThreadPoolExecutor(STREAMS) as pool:
            in_flight = [pool.submit(stream, stack, i, started) for i in range(STREAMS)]
            started.wait(30)  # every stream has its first chunk: the EPP holds 20 open ext_proc streams
            stack.epp.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            wait_until(lambda: health(health_port) == NOT_SERVING, "the EPP to report not ready", 5)
            assert health(health_port, "liveness") == NOT_SERVING  # no leader election: every name (reference)
            with httpx.Client(timeout=30) as c:  # new requests during the drain window are still served
                fresh = [
                    c.post(stack.url("/v1/completions"), json={"model": "m", "prompt": f"new {i}"}).status_code
                    for i in range(20)
                ]
            results = [f.result(60) for f in in_flight]
        assert fresh == [200] * 20
        assert [status for status, _, _ in results] == [200] * STREAMS
        assert all(done for _, done, _ in results), "a stream was cut before [DONE]"
        exit_code = stack.epp.proc.wait(30)  # type: ignore[union-attr]
        assert exit_code == 0
        log = stack.epp.log()
        assert "draining" in log and "stopped" in log
    finally:
        stop_stack(stack)


def test_a_second_signal_ends_the_drain_at_once(backends: BackendPool) -> None:
    stack = start_stack(backends, epp_args=("--drain-timeout", "10m"))
    try:
        proc = stack.epp.proc
        assert proc is not None
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "draining" in stack.epp.log(), "the drain to start", 10)
        time.sleep(0.2)
        assert proc.poll() is None  # still draining
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        stop_stack(stack)
