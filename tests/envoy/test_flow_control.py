"""Flow control through a real Envoy: one pod that holds every request until the test lets it go, an EPP
whose concurrency detector counts one request as saturating that pod, and clients on threads.

Requests beyond the first wait in the EPP's queues; they reach the pod as capacity frees, in priority
order; the queue limit answers 429, the time to live 503; a client that goes away while queued never
reaches the pod and leaves no queued request behind."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from llm_epp.gateway.envoy_config import EnvoyConfigOptions, build_bootstrap
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess
from tests.support.http_body import read_request_body

pytestmark = pytest.mark.envoy

ID = "x-test-id"
QUEUE_SIZE = "inference_extension_flow_control_queue_size"

CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: queue-scorer
- {name: one, type: concurrency-detector, parameters: {maxConcurrency: 1}}
flowControl:
  saturationDetector: {pluginRef: one}
  defaultRequestTTL: %s
  priorityBands:
  - {priority: 0, maxRequests: 3}
"""
OBJECTIVES = "objectives:\n- {name: urgent, priority: 10}\n"


@dataclass
class Pod:
    """A loopback model server: records each request's id on arrival, answers once the test releases it."""

    server: ThreadingHTTPServer
    arrived: list[str] = field(default_factory=list)
    release: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    cond: threading.Condition = field(default_factory=threading.Condition)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def wait_arrivals(self, n: int, timeout: float = 10.0) -> list[str]:
        with self.cond:
            self.cond.wait_for(lambda: len(self.arrived) >= n, timeout)
            return list(self.arrived)


def _handler(ref: list[Pod]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            pod = ref[0]
            read_request_body(self)
            with pod.cond:
                pod.arrived.append(self.headers.get(ID, ""))
                pod.cond.notify_all()
            pod.release.acquire(timeout=30)
            data = json.dumps({"id": "c", "choices": [{"text": "ok"}]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@dataclass
class Stack:
    pod: Pod
    epp: EppProcess
    envoy: EnvoyProcess

    def post(self, rid: str, objective: str = "", timeout: float = 30.0) -> httpx.Response:
        headers = {ID: rid}
        if objective:
            headers["x-gateway-inference-objective"] = objective
        return httpx.post(
            self.envoy.url("/v1/completions"), json={"model": "m", "prompt": rid}, headers=headers, timeout=timeout
        )

    def queued(self) -> float:
        return self.epp.metric_value(QUEUE_SIZE)


def serve_stack(pod: Pod, config: str, *epp_args: str) -> Iterator[Stack]:
    """`llm-epp serve` with `config` in front of `pod`, and Envoy in front of both; stopped (and every request
    the pod still holds let go) when the caller is done."""
    epp = EppProcess("--endpoints", pod.address, "--secure-serving=false", "--config-text", config, *epp_args).start()
    opts = EnvoyConfigOptions(listen_port=0, admin_port=0, epp_port=epp.grpc_port, epp_tls=False)
    try:
        envoy = EnvoyProcess(build_bootstrap(opts)).start()
    except Exception:
        epp.stop()
        raise
    try:
        yield Stack(pod, epp, envoy)
    finally:
        for _ in range(20):
            pod.release.release()
        envoy.stop()
        epp.stop()
        pod.server.shutdown()
        pod.server.server_close()


def start_pod(handler: Callable[[list[Pod]], type[BaseHTTPRequestHandler]] | None = None) -> Pod:
    ref: list[Pod] = []
    pod = Pod(ThreadingHTTPServer(("127.0.0.1", 0), (handler or _handler)(ref)))
    ref.append(pod)
    threading.Thread(target=pod.server.serve_forever, daemon=True).start()
    return pod


def _stack(tmp: Path, ttl: str) -> Iterator[Stack]:
    objectives = tmp / "objectives.yaml"
    objectives.write_text(OBJECTIVES)
    yield from serve_stack(start_pod(), CONFIG % ttl, "--objectives-file", str(objectives))


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from _stack(tmp_path_factory.mktemp("fc"), "30s")


@pytest.fixture
def stack(shared: Stack) -> Stack:
    """The shared stack, idle: every test leaves nothing queued or in flight."""
    shared.pod.arrived.clear()
    assert shared.queued() == 0
    return shared


@pytest.fixture
def short_ttl(tmp_path: Path) -> Iterator[Stack]:
    yield from _stack(tmp_path, "300ms")


def _wait_queued(s: Stack, n: float, timeout: float = 10.0) -> None:
    assert s.epp.wait_metric(QUEUE_SIZE, n, timeout) == n, s.epp.log()


def test_queued_requests_reach_the_pod_as_capacity_frees_and_priority_overtakes(stack: Stack) -> None:
    with ThreadPoolExecutor(5) as pool:
        first = pool.submit(stack.post, "first")
        assert stack.pod.wait_arrivals(1) == ["first"]
        waiting: list[Future[httpx.Response]] = []
        for rid in ("low-1", "low-2"):
            waiting.append(pool.submit(stack.post, rid))
            _wait_queued(stack, len(waiting))
        urgent = pool.submit(stack.post, "urgent", "urgent")
        _wait_queued(stack, 3)
        time.sleep(0.2)
        assert stack.pod.arrived == ["first"], "nothing passes the saturated pod"
        for n in (2, 3, 4):
            stack.pod.release.release()  # one finishes: exactly one more is let through
            assert len(stack.pod.wait_arrivals(n)) == n
        stack.pod.release.release()
        results = [f.result(30) for f in (first, *waiting, urgent)]
    assert [r.status_code for r in results] == [200] * 4
    assert stack.pod.arrived == ["first", "urgent", "low-1", "low-2"], "priority 10 went before the queued 0s"
    assert stack.queued() == 0


def test_a_full_queue_answers_429(stack: Stack) -> None:
    with ThreadPoolExecutor(5) as pool:
        first = pool.submit(stack.post, "first")
        stack.pod.wait_arrivals(1)
        waiting = []
        for i in range(3):  # the band holds three
            waiting.append(pool.submit(stack.post, f"w{i}"))
            _wait_queued(stack, i + 1)
        r = stack.post("one-too-many")
        assert r.status_code == 429, r.text
        assert "queue at capacity" in r.text
        assert r.headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
        for _ in range(4):
            stack.pod.release.release()
        assert [f.result(30).status_code for f in (first, *waiting)] == [200] * 4
    assert "one-too-many" not in stack.pod.arrived


def test_a_request_that_outlives_its_ttl_gets_503(short_ttl: Stack) -> None:
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(short_ttl.post, "first")
        short_ttl.pod.wait_arrivals(1)
        r = short_ttl.post("late")
        assert r.status_code == 503, r.text
        assert "request timed out in queue" in r.text
        assert r.headers["x-llm-d-request-dropped-reason"] == "rejected-ttl-expired"
        assert short_ttl.queued() == 0
        short_ttl.pod.release.release()
        assert first.result(30).status_code == 200
    assert short_ttl.pod.arrived == ["first"]


def test_a_client_that_leaves_while_queued_is_never_dispatched_and_frees_its_place(stack: Stack) -> None:
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(stack.post, "first")
        stack.pod.wait_arrivals(1)
        with pytest.raises(httpx.ReadTimeout):
            stack.post("impatient", timeout=0.5)  # gives up while queued: Envoy resets the stream
        _wait_queued(stack, 0)
        after = pool.submit(stack.post, "after")
        _wait_queued(stack, 1)
        stack.pod.release.release()
        assert stack.pod.wait_arrivals(2) == ["first", "after"]
        stack.pod.release.release()
        assert first.result(30).status_code == 200 and after.result(30).status_code == 200
    assert "impatient" not in stack.pod.arrived
    # no leaked in-flight slot: the pod is idle again, so a new request goes straight through
    stack.pod.release.release()
    assert stack.post("fresh", timeout=10).status_code == 200
    assert stack.pod.arrived == ["first", "after", "fresh"]
