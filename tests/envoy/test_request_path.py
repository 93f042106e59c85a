"""The request path through a real Envoy: model names restored across response chunks, unclaimed paths
routed through the passthrough parser, plugin headers on the routed request, the held-bytes bound."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from llm_epp.gateway.envoy_config import EnvoyConfigOptions, build_bootstrap
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess
from llm_epp.sim.stub import BackendPool
from tests.envoy.conftest import start_stack, stop_stack
from tests.support.http_body import read_request_body

pytestmark = pytest.mark.envoy

REWRITTEN = "big-model-v2"
SPLIT = "x-test-split-at"  # request header: where the pod cuts its JSON answer in two chunks


@dataclass
class Seen:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes


@dataclass
class Pod:
    """A loopback model server that records requests and answers JSON echoing the request's model, sent as
    two HTTP chunks cut where the request says, with a pause between them."""

    server: ThreadingHTTPServer
    seen: list[Seen] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"


def _handler(pod_ref: list[Pod]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = read_request_body(self)
            pod_ref[0].seen.append(Seen("POST", self.path, list(self.headers.items()), body))
            try:
                model = json.loads(body).get("model", "")
            except ValueError:
                model = ""
            answer = json.dumps({"id": "c1", "model": model, "path": self.path, "choices": [{"text": "hi"}]})
            data = answer.encode()
            cut = int(self.headers.get(SPLIT, str(len(data) // 2)))
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for i, piece in enumerate((data[:cut], data[cut:])):
                if i:
                    time.sleep(0.05)  # separate chunks all the way through Envoy
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return Handler


@pytest.fixture(scope="module")
def pod() -> Iterator[Pod]:
    ref: list[Pod] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(ref))
    ref.append(Pod(server))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield ref[0]
    server.shutdown()
    server.server_close()


# A PreRequest plugin installed the way third-party plugins are: a module named by an entry point of the
# group `llm_epp.plugins`, found on the EPP's PYTHONPATH.
PLUGIN_MODULE = '''"""test-upstream-header

Scheduling intent:
    Tests only: asks for a header on the routed request naming the chosen endpoint.

Inputs consumed:
    The scheduling result.

Configuration:
    No parameters.
"""

from llm_epp.framework import PluginParams, TypedName
from llm_epp.framework.requestcontrol import REQUEST_HEADERS_KEY

TYPE = "test-upstream-header"


class Params(PluginParams):
    pass


class TestUpstreamHeader:
    def __init__(self, name):
        self.typed_name = TypedName(TYPE, name)

    def pre_request(self, cycle, request, result):
        chosen = result.primary.target_endpoints[0].hostport
        cycle.write(REQUEST_HEADERS_KEY, {"x-test-upstream": "chosen=" + chosen})


def factory(name, params, handle):
    return TestUpstreamHeader(name)
'''

CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: max-score-picker
- type: test-upstream-header
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer}
  - {pluginRef: max-score-picker}
"""


def _install_plugin(root: Path) -> None:
    (root / "llm_epp_test_upstream_header.py").write_text(PLUGIN_MODULE)
    info = root / "llm_epp_test_upstream_header-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: llm-epp-test-upstream-header\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[llm_epp.plugins]\ntest-upstream-header = llm_epp_test_upstream_header\n")


@dataclass
class Gateway:
    epp: EppProcess
    envoy: EnvoyProcess


@pytest.fixture(scope="module")
def gateway(pod: Pod, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("plugin")
    _install_plugin(root)
    epp = EppProcess(
        "--endpoints", pod.address, "--secure-serving=false", "--config-text", CONFIG, env={"PYTHONPATH": str(root)}
    ).start()
    opts = EnvoyConfigOptions(
        listen_port=0,
        admin_port=0,
        epp_port=epp.grpc_port,
        epp_tls=False,
        response_body_mode="FULL_DUPLEX_STREAMED",
        failure_mode="FailClose",
    )
    try:
        envoy = EnvoyProcess(build_bootstrap(opts)).start()
    except Exception:
        epp.stop()
        raise
    yield Gateway(epp, envoy)
    envoy.stop()
    epp.stop()


def test_a_model_name_split_across_response_chunks_is_restored(gateway: Gateway, pod: Pod) -> None:
    probe = json.dumps({"id": "c1", "model": REWRITTEN}).encode()
    field_at = probe.index(b'"model"')
    # cuts inside the key, at the colon, inside the value and just before its closing quote
    for cut in (field_at + 3, field_at + 8, field_at + 12, field_at + 9 + len(REWRITTEN)):
        pod.seen.clear()
        r = httpx.post(
            gateway.envoy.url("/v1/completions"),
            json={"model": "m", "prompt": "hello"},
            headers={"x-llm-d-model-name-rewrite": REWRITTEN, SPLIT: str(cut)},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "m", cut
        assert json.loads(pod.seen[0].body)["model"] == REWRITTEN  # the pod was asked for the other name


def test_an_unclaimed_vllm_path_reaches_a_pod_through_the_passthrough_parser(gateway: Gateway, pod: Pod) -> None:
    pod.seen.clear()
    body = b'{"model": "reranker", "query": "q", "documents": ["a", "b"]}'
    r = httpx.post(
        gateway.envoy.url("/v1/rerank"), content=body, headers={"content-type": "application/json"}, timeout=30
    )
    assert r.status_code == 200, r.text
    assert r.json()["path"] == "/v1/rerank"
    (seen,) = pod.seen
    assert (seen.method, seen.path, seen.body) == ("POST", "/v1/rerank", body)


def test_plugin_request_headers_arrive_at_the_pod_and_replace_client_copies(gateway: Gateway, pod: Pod) -> None:
    pod.seen.clear()
    r = httpx.post(
        gateway.envoy.url("/v1/completions"),
        json={"model": "m", "prompt": "hello"},
        headers={
            "x-test-upstream": "spoofed",
            "x-llm-d-inference-objective": "o",
            "x-gateway-inference-objective": "o",
        },
        timeout=30,
    )
    assert r.status_code == 200
    assert r.headers["x-went-into-resp-headers"] == "true"
    assert "x-gateway-destination-endpoint-served" not in r.headers
    (seen,) = pod.seen
    values = [v for k, v in seen.headers if k.lower() == "x-test-upstream"]
    assert values == [f"chosen={pod.address}"]
    names = {k.lower() for k, _ in seen.headers}
    assert not names & {"x-llm-d-inference-objective", "x-gateway-inference-objective"}  # control headers stay


def test_held_request_bytes_over_the_bound_get_503_with_retry_after() -> None:
    with BackendPool(1) as backends:
        s = start_stack(backends, epp_args=("--max-held-request-bytes", "4Ki"))
        try:
            big = {"model": "m", "prompt": "z" * 20_000}
            r = httpx.post(s.url("/v1/completions"), json=big, timeout=30)
            assert r.status_code == 503
            assert r.headers["retry-after"] == "1"
            assert "--max-held-request-bytes" in r.json()["error"]["message"]
            assert backends.served_counts() == {backends[0].name: 0}
            # what was held is let go: a request under the bound goes through
            r = httpx.post(s.url("/v1/completions"), json={"model": "m", "prompt": "small"}, timeout=30)
            assert r.status_code == 200
        finally:
            stop_stack(s)
