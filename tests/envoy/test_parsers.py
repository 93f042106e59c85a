"""The HTTP request parsers through a real Envoy: vLLM's /inference/v1/generate (vllmhttp-parser), SGLang's
/generate (sglanghttp-parser) and the Anthropic Messages API (anthropic-parser), each next to openai-parser.
Real request and answer shapes go to loopback model servers; the checks are what reaches the pod (model
rewritten or not), 400s for bad bodies that never reach a pod, usage read back from JSON and SSE answers,
and prefix-cache routing on token ids and on message content."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from llm_epp.gateway.envoy_config import EnvoyConfigOptions, build_bootstrap
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess
from tests.support.http_body import read_request_body

pytestmark = pytest.mark.envoy

REWRITE = "x-llm-d-model-name-rewrite"
INPUT_TOKENS = "inference_objective_input_tokens_sum"
OUTPUT_TOKENS = "inference_objective_output_tokens_sum"


@dataclass
class Seen:
    pod: int
    path: str
    body: bytes


@dataclass
class Pods:
    servers: list[ThreadingHTTPServer]
    seen: list[Seen] = field(default_factory=list)

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{s.server_address[1]}" for s in self.servers]

    def take(self) -> list[Seen]:
        out, self.seen[:] = list(self.seen), []
        return out


def _sse(events: list[tuple[str | None, object]]) -> bytes:
    out = b""
    for name, data in events:
        if name:
            out += b"event: " + name.encode() + b"\n"
        out += b"data: " + (data if isinstance(data, bytes) else json.dumps(data).encode()) + b"\n\n"
    return out


def _answer(path: str, request: dict[str, object]) -> tuple[str, bytes]:
    """A model server's answer in the API's real shape; token counts derive from the request so each test
    can tell its own usage apart: input = prompt tokens sent (or 11 for messages), output = 3."""
    stream = request.get("stream") is True
    if path == "/v1/messages":
        usage_in = 11
        if stream:
            return "text/event-stream", _sse(
                [
                    (
                        "message_start",
                        {
                            "type": "message_start",
                            "message": {"id": "m1", "usage": {"input_tokens": usage_in, "output_tokens": 1}},
                        },
                    ),
                    (
                        "content_block_delta",
                        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
                    ),
                    (
                        "message_delta",
                        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}},
                    ),
                    ("message_stop", {"type": "message_stop"}),
                ]
            )
        body = {
            "id": "m1",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": "hi"}],
            "usage": {"input_tokens": usage_in, "output_tokens": 3},
        }
        return "application/json", json.dumps(body).encode()
    if path == "/inference/v1/generate":
        n = len(request.get("token_ids") or [])  # type: ignore[arg-type]
        usage = {"prompt_tokens": n, "completion_tokens": 3, "total_tokens": n + 3}
        if stream:
            return "text/event-stream", _sse(
                [(None, {"choices": [{"token_ids": [5]}]}), (None, {"choices": [], "usage": usage}), (None, b"[DONE]")]
            )
        return "application/json", json.dumps(
            {
                "request_id": "g1",
                "choices": [{"index": 0, "token_ids": [5, 6, 7], "finish_reason": "length"}],
                "usage": usage,
            }
        ).encode()
    if path == "/generate":
        n = len(request.get("input_ids") or [])  # type: ignore[arg-type]
        if stream:
            return "text/event-stream", _sse(
                [
                    (
                        None,
                        {
                            "text": "a",
                            "output_ids": [5],
                            "meta_info": {
                                "id": "s1",
                                "prompt_tokens": n,
                                "completion_tokens": 1,
                                "finish_reason": None,
                            },
                        },
                    ),
                    (
                        None,
                        {
                            "text": "abc",
                            "output_ids": [5, 6, 7],
                            "meta_info": {
                                "id": "s1",
                                "prompt_tokens": n,
                                "completion_tokens": 3,
                                "cached_tokens": 0,
                                "finish_reason": {"type": "length", "length": 3},
                            },
                        },
                    ),
                    (None, b"[DONE]"),
                ]
            )
        meta = {
            "id": "s1",
            "prompt_tokens": n,
            "completion_tokens": 3,
            "cached_tokens": 0,
            "finish_reason": {"type": "length", "length": 3},
        }
        return "application/json", json.dumps({"text": "abc", "output_ids": [5, 6, 7], "meta_info": meta}).encode()
    return "application/json", json.dumps({"id": "c1", "choices": [{"text": "hi"}]}).encode()


def _handler(pods: Pods, index: int) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = read_request_body(self)
            pods.seen.append(Seen(index, self.path, body))
            try:
                request = json.loads(body)
            except ValueError:
                request = {}
            kind, data = _answer(self.path, request if isinstance(request, dict) else {})
            self.send_response(200)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@pytest.fixture(scope="module")
def pods() -> Iterator[Pods]:
    pods = Pods([])
    for i in range(3):
        pods.servers.append(ThreadingHTTPServer(("127.0.0.1", 0), _handler(pods, i)))
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in pods.servers]
    for t in threads:
        t.start()
    yield pods
    for s in pods.servers:
        s.shutdown()
        s.server_close()


CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- {type: vllmhttp-parser}
- {type: sglanghttp-parser}
- {type: anthropic-parser}
- {type: openai-parser}
- {type: approx-prefix-cache-producer, parameters: {blockSizeTokens: 4, autoTune: false}}
- {type: prefix-cache-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: prefix-cache-scorer}
  - {pluginRef: max-score-picker}
requestHandler:
  parsers:
  - {pluginRef: vllmhttp-parser}
  - {pluginRef: sglanghttp-parser}
  - {pluginRef: anthropic-parser}
  - {pluginRef: openai-parser}
"""


@dataclass
class Gateway:
    epp: EppProcess
    envoy: EnvoyProcess

    def post(self, path: str, body: object, headers: dict[str, str] | None = None) -> httpx.Response:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.post(
            self.envoy.url(path),
            content=data,
            headers={"content-type": "application/json", **(headers or {})},
            timeout=30,
        )


@pytest.fixture(scope="module")
def gateway(pods: Pods) -> Iterator[Gateway]:
    epp = EppProcess("--endpoints", ",".join(pods.addresses), "--secure-serving=false", "--config-text", CONFIG).start()
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


@pytest.fixture(autouse=True)
def _clear(pods: Pods) -> None:
    pods.take()


# --- vLLM /inference/v1/generate -----------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_vllm_generate_reaches_a_pod_with_the_model_rewritten_and_usage_is_read(
    gateway: Gateway, pods: Pods, stream: bool
) -> None:
    model = f"vllm-gen-{stream}"
    before = gateway.epp.metric_value(INPUT_TOKENS, model_name=model)
    body = {"model": model, "token_ids": list(range(1, 8)), "sampling_params": {"max_tokens": 3}, "stream": stream}
    r = gateway.post("/inference/v1/generate", body, {REWRITE: "served-model"})
    assert r.status_code == 200, r.text
    (seen,) = pods.take()
    assert seen.path == "/inference/v1/generate"
    assert json.loads(seen.body) == {**body, "model": "served-model"}
    assert gateway.epp.wait_metric(INPUT_TOKENS, before + 7, model_name=model) == before + 7


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b'{"model": "m", "prompt": "text is not read here"}', "token_ids"),
        (b'{"model": "m", "token_ids": [1, -5]}', "token_ids[1]"),
        (b"[1, 2, 3]", "JSON object"),
    ],
)
def test_bad_vllm_generate_bodies_get_400_and_reach_no_pod(
    gateway: Gateway, pods: Pods, body: bytes, fragment: str
) -> None:
    r = gateway.post("/inference/v1/generate", body)
    assert r.status_code == 400
    assert fragment in r.text
    assert pods.take() == []


# --- SGLang /generate ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_sglang_generate_reaches_a_pod_unchanged_and_usage_is_read(gateway: Gateway, pods: Pods, stream: bool) -> None:
    ids = list(range(100, 100 + 29 + int(stream)))  # a length no other test sends: its usage is recognisable
    before = gateway.epp.metric_value(OUTPUT_TOKENS)
    body = json.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": 3}, "stream": stream}).encode()
    r = gateway.post("/generate", body, {REWRITE: "ignored: the API has no model"})
    assert r.status_code == 200, r.text
    (seen,) = pods.take()
    assert (seen.path, seen.body) == ("/generate", body)
    assert gateway.epp.wait_metric(OUTPUT_TOKENS, before + 3) == before + 3


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b'{"text": "hello"}', "text prompts are not supported"),
        (b'{"input_ids": [[1, 2], [3, 4]]}', "batch"),
        (b'{"input_ids": [1], "extra_key": ["a"]}', "extra_key"),
    ],
)
def test_bad_sglang_generate_bodies_get_400_and_reach_no_pod(
    gateway: Gateway, pods: Pods, body: bytes, fragment: str
) -> None:
    r = gateway.post("/generate", body)
    assert r.status_code == 400
    assert fragment in r.text
    assert pods.take() == []


def test_a_path_that_only_ends_in_generate_is_refused(gateway: Gateway, pods: Pods) -> None:
    r = gateway.post("/health_generate", {"input_ids": [1]})
    assert r.status_code == 400 and "/health_generate" in r.text
    assert pods.take() == []


# --- Anthropic Messages API ----------------------------------------------------------------------------------
MESSAGES = {
    "max_tokens": 3,
    "system": [{"type": "text", "text": "You answer in one word."}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Name a colour."}]},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another?"},
    ],
}


@pytest.mark.parametrize("stream", [False, True])
def test_messages_reach_a_pod_with_the_model_rewritten_and_usage_is_read(
    gateway: Gateway, pods: Pods, stream: bool
) -> None:
    model = f"messages-{stream}"
    before = gateway.epp.metric_value(INPUT_TOKENS, model_name=model)
    before_out = gateway.epp.metric_value(OUTPUT_TOKENS, model_name=model)
    body = {**MESSAGES, "model": model, "stream": stream}
    r = gateway.post("/v1/messages", body, {REWRITE: "served-model", "anthropic-version": "2023-06-01"})
    assert r.status_code == 200, r.text
    (seen,) = pods.take()
    assert seen.path == "/v1/messages"
    assert json.loads(seen.body) == {**body, "model": "served-model"}
    assert gateway.epp.wait_metric(INPUT_TOKENS, before + 11, model_name=model) == before + 11
    assert gateway.epp.wait_metric(OUTPUT_TOKENS, before_out + 3, model_name=model) == before_out + 3


def test_count_tokens_is_forwarded_as_sent(gateway: Gateway, pods: Pods) -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    r = gateway.post("/v1/messages/count_tokens", body, {REWRITE: "other"})
    assert r.status_code == 200
    (seen,) = pods.take()
    assert (seen.path, seen.body) == ("/v1/messages/count_tokens", body)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": [{"role": "user", "content": 42}]}, "messages[0].content"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "system": 7}, "system"),
    ],
)
def test_bad_messages_bodies_get_400_and_reach_no_pod(
    gateway: Gateway, pods: Pods, body: object, fragment: str
) -> None:
    r = gateway.post("/v1/messages", body)
    assert r.status_code == 400
    assert fragment in r.text
    assert pods.take() == []


# --- scheduling on what the parsers extract ------------------------------------------------------------------
def _pods_of(gateway: Gateway, pods: Pods, path: str, body: object, times: int) -> set[int]:
    for _ in range(times):
        assert gateway.post(path, body).status_code == 200
    return {s.pod for s in pods.take()}


@pytest.mark.parametrize("api", ["vllm", "sglang", "messages"])
def test_repeats_of_a_prompt_follow_its_prefix_to_one_pod(gateway: Gateway, pods: Pods, api: str) -> None:
    """Five different long prompts, each sent four times: every repeat lands where its first copy went,
    which needs the parser's token ids (or messages) in the prefix index; without them the picker spreads
    ties at random over three pods."""
    for k in range(5):
        if api == "vllm":
            path, body = "/inference/v1/generate", {"model": "m", "token_ids": [k * 1000 + i for i in range(64)]}
        elif api == "sglang":
            path, body = "/generate", {"input_ids": [k * 1000 + i for i in range(64)]}
        else:
            text = f"document {k}: " + "lorem ipsum " * 40
            path, body = "/v1/messages", {"model": "m", "messages": [{"role": "user", "content": text}]}
        assert len(_pods_of(gateway, pods, path, body, 4)) == 1, (api, k)
