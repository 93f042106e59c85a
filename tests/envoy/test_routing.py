"""End to end through a real Envoy: what a client sees when llm-epp picks the endpoints."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from llm_epp.sim.stub import BackendPool
from tests.envoy.conftest import Stack, start_stack, stop_stack

pytestmark = pytest.mark.envoy


def completion(
    client: httpx.Client, stack: Stack, headers: dict[str, str] | None = None, **body: object
) -> httpx.Response:
    payload = {"model": "stub-model", "prompt": "hello", "max_tokens": 4, **body}
    return client.post(stack.url("/v1/completions"), json=payload, headers=headers or {})


# The conformance setup: only the endpoints named by `test-epp-endpoint-selection` pass.
CONFORMANCE_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: header-based-testing-filter
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: header-based-testing-filter}
  - {pluginRef: queue-scorer}
  - {pluginRef: max-score-picker}
"""


@pytest.fixture(scope="module")
def conformance(backends: BackendPool) -> Iterator[Stack]:
    s = start_stack(backends, epp_args=("--config-text", CONFORMANCE_CONFIG))
    yield s
    stop_stack(s)


@pytest.mark.parametrize("allowed", [1, 2, 3], ids=["one-pod", "two-pods", "three-pods"])
def test_traffic_lands_only_on_endpoints_the_epp_chose(conformance: Stack, allowed: int) -> None:
    stack = conformance
    chosen = stack.backends.addresses[:allowed]
    headers = {"test-epp-endpoint-selection": ",".join(chosen)}

    def one(_: int) -> tuple[int, str, bool]:
        with httpx.Client(timeout=30) as c:
            r = completion(c, stack, headers)
            return r.status_code, r.headers["x-backend-name"], "x-conformance-test-served-endpoint" in r.headers

    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(one, range(100)))
    assert {status for status, _, _ in results} == {200}
    served_by = {stack.backends.by_address[a].name for a in chosen}
    assert {name for _, name, _ in results} <= served_by
    assert not any(leaked for _, _, leaked in results)  # no pod address is written to clients by default
    counts = stack.backends.served_counts()
    assert sum(counts.values()) == 100
    assert all(counts[name] == 0 for name in counts if name not in served_by)


def test_requests_spread_over_the_pool(stack: Stack) -> None:
    with httpx.Client(timeout=30) as c:
        for _ in range(30):
            assert completion(c, stack).status_code == 200
    assert all(v > 0 for v in stack.backends.served_counts().values())


def test_conformance_header_is_ignored_without_the_filter_plugin(stack: Stack) -> None:
    only = stack.backends.addresses[0]
    with httpx.Client(timeout=30) as c:
        for _ in range(30):
            assert completion(c, stack, {"test-epp-endpoint-selection": only}).status_code == 200
    counts = stack.backends.served_counts()
    assert sum(counts.values()) == 30
    assert sum(n for name, n in counts.items() if name != stack.backends[0].name) > 0


def test_client_sent_destination_header_does_not_steer(conformance: Stack) -> None:
    stack = conformance
    target = stack.backends.addresses[0]
    others = stack.backends.addresses[1:]
    names = {stack.backends.by_address[a].name for a in others}
    with httpx.Client(timeout=30) as c:
        for _ in range(20):
            r = completion(
                c,
                stack,
                {"x-gateway-destination-endpoint": target, "test-epp-endpoint-selection": ",".join(others)},
            )
            assert r.status_code == 200
            assert r.headers["x-backend-name"] in names
    assert stack.backends[0].served == 0


def test_sse_stream_arrives_intact_and_usage_is_recorded(stack: Stack) -> None:
    before = stack.epp.metric_value("inference_objective_output_tokens_sum")
    body = {
        "model": "stub-model",
        "prompt": "hello",
        "max_tokens": 50,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.Client(timeout=30) as c, c.stream("POST", stack.url("/v1/completions"), json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(r.iter_raw())
    events = [line[6:] for line in raw.decode().split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert len([e for e in parsed if e["choices"]]) == 50
    assert parsed[-1]["usage"]["completion_tokens"] == 50
    assert stack.epp.wait_metric("inference_objective_output_tokens_sum", before + 50) == before + 50


def test_event_streams_end_on_envoys_reset_once_the_epp_has_seen_it_reset_one(backends: BackendPool) -> None:
    # Envoy resets an ext_proc stream once a response without processed bodies has passed. After the first such
    # reset the EPP stops keeping a read in flight for event streams (a read caught by a reset leaks native
    # memory in grpcio): each stream must still arrive intact and still end its request when Envoy resets it.
    s = start_stack(backends, epp_args=("-v", "2"))
    body = {"model": "stub-model", "prompt": "hello", "max_tokens": 20, "stream": True}
    try:
        with httpx.Client(timeout=30) as c:
            for i in range(4):
                with c.stream("POST", s.url("/v1/completions"), json=body) as r:
                    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
                    raw = b"".join(r.iter_raw())
                assert raw.rstrip().endswith(b"data: [DONE]")
                assert s.epp.wait_metric("inference_objective_request_duration_seconds_count", i + 1) == i + 1
                assert s.epp.wait_metric("inference_objective_running_requests", 0) == 0
        assert "ext_proc_peer_ends_streams by=reset" in s.epp.log()
        assert "by=half-close" not in s.epp.log()
    finally:
        stop_stack(s)


@pytest.mark.parametrize("size", [2_000_000, 5_000_000], ids=["2MB", "5MB"])
def test_large_bodies_arrive_byte_exact(stack: Stack, size: int) -> None:
    payload = json.dumps({"model": "stub-model", "prompt": "y" * size, "max_tokens": 1}).encode()
    with httpx.Client(timeout=60) as c:
        r = c.post(stack.url("/v1/completions"), content=payload, headers={"content-type": "application/json"})
    assert r.status_code == 200
    got = r.json()
    assert got["x_body_len"] == len(payload)
    assert got["x_body_sha256"] == hashlib.sha256(payload).hexdigest()


def test_bodyless_get_is_routed(stack: Stack) -> None:
    r = httpx.get(stack.url("/v1/models"), timeout=30)
    assert r.status_code == 200
    assert r.headers["x-backend-name"] in {b.name for b in stack.backends}


@pytest.mark.parametrize(
    ("content", "headers", "status", "fragment"),
    [
        (b"{oops", {}, 400, "not valid JSON"),
        (b'{"prompt": "x"}', {}, 400, "model not found"),
    ],
    ids=["bad-json", "no-model"],
)
def test_errors_reach_the_client(
    stack: Stack, content: bytes, headers: dict[str, str], status: int, fragment: str
) -> None:
    r = httpx.post(stack.url("/v1/completions"), content=content, headers=headers, timeout=30)
    assert r.status_code == status
    assert fragment in r.json()["error"]["message"]
    assert sum(stack.backends.served_counts().values()) == 0


def test_no_selected_endpoint_is_a_saturated_drop(conformance: Stack) -> None:
    r = httpx.post(
        conformance.url("/v1/completions"),
        json={"model": "m", "prompt": "x"},
        headers={"test-epp-endpoint-selection": "127.0.0.9:1"},
        timeout=30,
    )
    assert r.status_code == 429
    assert r.headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
    assert sum(conformance.backends.served_counts().values()) == 0


def test_oversized_body_gets_413(backends: BackendPool) -> None:
    s = start_stack(backends, epp_args=("--max-request-body-bytes", "100000"))
    try:
        payload = {"model": "m", "prompt": "z" * 200_000}
        r = httpx.post(s.url("/v1/completions"), json=payload, timeout=30)
        assert r.status_code == 413
        assert "100000 bytes" in r.json()["error"]["message"]
        assert sum(backends.served_counts().values()) == 0
    finally:
        stop_stack(s)


@pytest.mark.parametrize(
    ("tls", "request_body_mode", "response_body_mode", "transport"),
    [
        (False, "FULL_DUPLEX_STREAMED", "NONE", "asyncio"),
        (True, "BUFFERED", "NONE", "asyncio"),
        (False, "BUFFERED", "FULL_DUPLEX_STREAMED", "asyncio"),
        (False, "FULL_DUPLEX_STREAMED", "NONE", "grpcio"),
        (True, "FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED", "grpcio"),
    ],
    ids=[
        "plaintext-fds",
        "tls-buffered",
        "plaintext-buffered-fds-response",
        "grpcio-plaintext-fds",
        "grpcio-tls-fds-fds-response",
    ],
)
def test_modes_and_transport(
    backends: BackendPool, tls: bool, request_body_mode: str, response_body_mode: str, transport: str
) -> None:
    s = start_stack(
        backends,
        tls=tls,
        request_body_mode=request_body_mode,
        response_body_mode=response_body_mode,
        epp_args=(f"--grpc-transport={transport}",),
    )
    try:
        with httpx.Client(timeout=30) as c:
            for _ in range(10):
                r = completion(c, s, {"x-gateway-model-name-rewrite": "rewritten-model"})
                assert r.status_code == 200
                # the backend saw the rewritten name; the client sees its own name when bodies are processed
                assert r.json()["model"] == ("stub-model" if response_body_mode != "NONE" else "rewritten-model")
            big = json.dumps({"model": "m", "prompt": "q" * 1_500_000}).encode()
            r = c.post(s.url("/v1/completions"), content=big, headers={"content-type": "application/json"})
            assert r.status_code == 200 and r.json()["x_body_len"] == len(big)
        assert s.epp.metric_value("inference_objective_request_total") == 11
        # completion is learnt in every mode (with response body NONE: when Envoy ends the stream)
        assert s.epp.wait_metric("inference_objective_request_duration_seconds_count", 11) == 11
        assert s.epp.wait_metric("inference_objective_running_requests", 0) == 0
    finally:
        stop_stack(s)


def test_fail_open_serves_without_the_epp_and_fail_close_does_not(backends: BackendPool) -> None:
    fail_open = start_stack(backends, failure_mode="FailOpen", fallback=True)
    fail_close = start_stack(backends, failure_mode="FailClose")
    try:
        for s in (fail_open, fail_close):
            assert (
                httpx.post(s.url("/v1/completions"), json={"model": "m", "prompt": "x"}, timeout=30).status_code == 200
            )
        fail_open.epp.stop()
        fail_close.epp.stop()
        fail_open.envoy.wait_cluster_healthy("epp", healthy=False)
        answers = [
            httpx.post(fail_open.url("/v1/completions"), json={"model": "m", "prompt": "x"}, timeout=30)
            for _ in range(6)
        ]
        assert [r.status_code for r in answers] == [200] * 6
        # with the EPP down nothing removes the served-endpoint header but Envoy itself: no pod address leaks
        assert not any("x-gateway-destination-endpoint-served" in r.headers for r in answers)
        r = httpx.post(fail_close.url("/v1/completions"), json={"model": "m", "prompt": "x"}, timeout=30)
        assert r.status_code >= 500
    finally:
        stop_stack(fail_open)
        stop_stack(fail_close)
