"""In-flight eviction through a real Envoy: one pod that holds every request until the test lets it go, an
EPP whose concurrency detector counts one request as saturating that pod, flow control with
`enableEviction`.

A dispatched sheddable request (priority -1) is evicted when a priority-10 request queues behind it: its
client gets 429 "request evicted by flow control" with `x-llm-d-request-dropped-reason: evicted` (or, when
its response had already started, a cut stream), and the queued request reaches the pod at once. A request
at priority 0 is never evicted."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
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
CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: queue-scorer
- {name: one, type: concurrency-detector, parameters: {maxConcurrency: 1}}
flowControl:
  saturationDetector: {pluginRef: one}
  enableEviction: true
"""
OBJECTIVES = "objectives:\n- {name: urgent, priority: 10}\n- {name: batch, priority: -1}\n"
REVOCATIONS = "llm_d_epp_flow_control_revocations_total"


@dataclass
class Pod:
    """A loopback model server: records each request's id on arrival and answers once the test releases
    it; ids starting with `stream` get their response headers and a first chunk at once."""

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
            rid = self.headers.get(ID, "")
            with pod.cond:
                pod.arrived.append(rid)
                pod.cond.notify_all()
            try:
                if rid.startswith("stream"):
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    self._chunk(b'data: {"choices":[{"text":"a"}]}\n\n')
                    pod.release.acquire(timeout=30)
                    self._chunk(b"data: [DONE]\n\n")
                    self._chunk(b"")
                    return
                pod.release.acquire(timeout=30)
                data = json.dumps({"id": "c", "choices": [{"text": "ok"}]}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:  # Envoy reset the upstream request
                pass

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

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
        body = {"model": "m", "prompt": rid, "stream": rid.startswith("stream")}
        return httpx.post(self.envoy.url("/v1/completions"), json=body, headers=headers, timeout=timeout)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp: Path = tmp_path_factory.mktemp("evict")
    ref: list[Pod] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(ref))
    pod = Pod(server)
    ref.append(pod)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    objectives = tmp / "objectives.yaml"
    objectives.write_text(OBJECTIVES)
    epp = EppProcess(
        "--endpoints",
        pod.address,
        "--secure-serving=false",
        "--config-text",
        CONFIG,
        "--objectives-file",
        str(objectives),
    ).start()
    opts = EnvoyConfigOptions(listen_port=0, admin_port=0, epp_port=epp.grpc_port, epp_tls=False)
    try:
        envoy = EnvoyProcess(build_bootstrap(opts)).start()
    except Exception:
        epp.stop()
        raise
    yield Stack(pod, epp, envoy)
    for _ in range(20):
        pod.release.release()
    envoy.stop()
    epp.stop()
    server.shutdown()
    server.server_close()


def _revocations(s: Stack) -> float:
    return s.epp.metric_value(REVOCATIONS)


def test_a_dispatched_sheddable_request_is_evicted_for_a_queued_urgent_one(stack: Stack) -> None:
    stack.pod.arrived.clear()
    before = _revocations(stack)
    with ThreadPoolExecutor(2) as pool:
        batch = pool.submit(stack.post, "batch", "batch")
        assert stack.pod.wait_arrivals(1) == ["batch"]
        urgent = pool.submit(stack.post, "urgent", "urgent")
        r = batch.result(30)
        assert r.status_code == 429, r.text
        assert r.text == "request evicted by flow control"
        assert r.headers["x-llm-d-request-dropped-reason"] == "evicted"
        assert stack.pod.wait_arrivals(2) == ["batch", "urgent"], "the freed place goes to the urgent request"
        stack.pod.release.release()  # the evicted request's handler (its client is gone)
        stack.pod.release.release()
        assert urgent.result(30).status_code == 200
    assert stack.epp.wait_metric(REVOCATIONS, before + 1, 10) == before + 1, stack.epp.log()


def test_a_streaming_response_is_cut_when_its_request_is_evicted(stack: Stack) -> None:
    stack.pod.arrived.clear()
    with ThreadPoolExecutor(2) as pool:
        url = stack.envoy.url("/v1/completions")
        body = {"model": "m", "prompt": "s", "stream": True}
        headers = {ID: "stream-batch", "x-gateway-inference-objective": "batch"}
        with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as resp:
            assert resp.status_code == 200
            chunks = resp.iter_raw()
            assert b"data:" in next(chunks), "the response has started"
            urgent = pool.submit(stack.post, "urgent-2", "urgent")
            with pytest.raises(httpx.HTTPError):  # the stream is reset, not finished
                for _ in chunks:
                    pass
        assert stack.pod.wait_arrivals(2) == ["stream-batch", "urgent-2"]
        stack.pod.release.release()
        stack.pod.release.release()
        assert urgent.result(30).status_code == 200


def test_a_request_at_priority_zero_is_never_evicted(stack: Stack) -> None:
    stack.pod.arrived.clear()
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(stack.post, "plain")
        assert stack.pod.wait_arrivals(1) == ["plain"]
        urgent = pool.submit(stack.post, "urgent-3", "urgent")
        assert stack.epp.wait_metric("inference_extension_flow_control_queue_size", 1, 10) == 1
        assert not first.done() and stack.pod.arrived == ["plain"]
        stack.pod.release.release()
        assert first.result(30).status_code == 200
        assert stack.pod.wait_arrivals(2) == ["plain", "urgent-3"]
        stack.pod.release.release()
        assert urgent.result(30).status_code == 200
