"""gRPC model-server APIs through a real Envoy: vLLM's engine API (vllmgrpc-parser) and Vertex AI's
PredictionService envelopes (vertexai-parser). A gRPC client calls Envoy, Envoy asks the EPP, and the
request reaches one of three grpcio model-server stand-ins over HTTP/2 (h2c). The checks: the framed
protobuf request reaches the pod byte for byte, the (streamed) answer reaches the client, usage is read
from the response stream, bad requests are refused before any pod sees them, and repeats of a prompt
follow its prefix to one pod."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from llm_epp.gateway.envoy_config import EnvoyConfigOptions, build_bootstrap
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess
from llm_epp.plugins.parsers.wire import vertex_prediction_pb2 as vx
from llm_epp.plugins.parsers.wire import vllm_engine_pb2 as pb
from tests.compat.test_corpus import CONFIGS
from tests.compat.test_corpus_serves import GRPC_ONLY

pytestmark = pytest.mark.envoy

SERVICE = "vllm.grpc.engine.VllmEngine"
VERTEX = "google.cloud.aiplatform.v1beta1.PredictionService"
INPUT_TOKENS = "inference_objective_input_tokens_sum"
OUTPUT_TOKENS = "inference_objective_output_tokens_sum"


@dataclass
class Pods:
    servers: list[grpc.Server] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    seen: list[tuple[int, str, bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.ports]

    def take(self) -> list[tuple[int, str, bytes]]:
        with self.lock:
            out, self.seen[:] = list(self.seen), []
        return out


def _servicer(pods: Pods, index: int) -> grpc.GenericRpcHandler:
    """A vLLM gRPC engine stand-in: Generate streams two chunks and a completion whose token counts are the
    prompt's length and 3; Embed answers a 2-dimensional embedding."""

    def record(method: str, request: Any) -> None:
        with pods.lock:
            pods.seen.append((index, method, request.SerializeToString()))

    def generate(request: pb.GenerateRequest, context: grpc.ServicerContext) -> Iterator[pb.GenerateResponse]:
        record("Generate", request)
        n = len(request.tokenized.input_ids) if request.HasField("tokenized") else len(request.text.split())
        yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[11]))
        yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[12], prompt_tokens=n, completion_tokens=2))
        yield pb.GenerateResponse(
            complete=pb.GenerateComplete(
                output_ids=[11, 12, 13], finish_reason="length", prompt_tokens=n, completion_tokens=3
            )
        )

    def embed(request: pb.EmbedRequest, context: grpc.ServicerContext) -> pb.EmbedResponse:
        record("Embed", request)
        n = len(request.tokenized.input_ids)
        return pb.EmbedResponse(embedding=[0.5, -0.5], prompt_tokens=n, embedding_dim=2)

    def health(request: bytes, context: grpc.ServicerContext) -> bytes:
        with pods.lock:
            pods.seen.append((index, "HealthCheck", request))
        return b"\x08\x01"  # HealthCheckResponse{healthy: true}

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "HealthCheck": grpc.unary_unary_rpc_method_handler(health),
            "Generate": grpc.unary_stream_rpc_method_handler(
                generate,
                request_deserializer=pb.GenerateRequest.FromString,
                response_serializer=pb.GenerateResponse.SerializeToString,
            ),
            "Embed": grpc.unary_unary_rpc_method_handler(
                embed,
                request_deserializer=pb.EmbedRequest.FromString,
                response_serializer=pb.EmbedResponse.SerializeToString,
            ),
        },
    )


def _vertex_servicer(pods: Pods, index: int) -> grpc.GenericRpcHandler:
    """A Vertex AI endpoint stand-in: ChatCompletions streams OpenAI chunks (SSE) in HttpBody messages with
    usage in the last; RawPredict answers one Responses API JSON body."""

    def record(method: str, request: Any) -> None:
        with pods.lock:
            pods.seen.append((index, method, request.SerializeToString()))

    def chat(request: vx.HttpBodyRequest, context: grpc.ServicerContext) -> Iterator[vx.HttpBody]:
        record("ChatCompletions", request)
        sse = "text/event-stream"
        yield vx.HttpBody(content_type=sse, data=b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n')
        usage = {"prompt_tokens": 17, "completion_tokens": 4, "total_tokens": 21}
        yield vx.HttpBody(
            content_type=sse, data=b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
        )

    def raw(request: vx.HttpBodyRequest, context: grpc.ServicerContext) -> vx.HttpBody:
        record("RawPredict", request)
        answer = {"object": "response", "output": [], "usage": {"input_tokens": 19, "output_tokens": 2}}
        return vx.HttpBody(content_type="application/json", data=json.dumps(answer).encode())

    return grpc.method_handlers_generic_handler(
        VERTEX,
        {
            "ChatCompletions": grpc.unary_stream_rpc_method_handler(
                chat,
                request_deserializer=vx.HttpBodyRequest.FromString,
                response_serializer=vx.HttpBody.SerializeToString,
            ),
            "RawPredict": grpc.unary_unary_rpc_method_handler(
                raw,
                request_deserializer=vx.HttpBodyRequest.FromString,
                response_serializer=vx.HttpBody.SerializeToString,
            ),
        },
    )


@pytest.fixture(scope="module")
def pods() -> Iterator[Pods]:
    pods = Pods()
    for i in range(3):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers((_servicer(pods, i), _vertex_servicer(pods, i)))
        pods.ports.append(server.add_insecure_port("127.0.0.1:0"))
        server.start()
        pods.servers.append(server)
    yield pods
    for server in pods.servers:
        server.stop(grace=None)


CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- {type: vllmgrpc-parser}
- {type: vertexai-parser}
- {type: passthrough-parser}
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
  - {pluginRef: vllmgrpc-parser}
  - {pluginRef: vertexai-parser}
  - {pluginRef: passthrough-parser}
"""


@dataclass
class Gateway:
    epp: EppProcess
    envoy: EnvoyProcess
    channel: grpc.Channel

    def generate(self, request: pb.GenerateRequest, **kwargs: Any) -> list[pb.GenerateResponse]:
        call = self.channel.unary_stream(
            f"/{SERVICE}/Generate",
            request_serializer=pb.GenerateRequest.SerializeToString,
            response_deserializer=pb.GenerateResponse.FromString,
        )
        return list(call(request, timeout=30, **kwargs))

    def embed(self, request: pb.EmbedRequest) -> pb.EmbedResponse:
        call = self.channel.unary_unary(
            f"/{SERVICE}/Embed",
            request_serializer=pb.EmbedRequest.SerializeToString,
            response_deserializer=pb.EmbedResponse.FromString,
        )
        return call(request, timeout=30)  # type: ignore[no-any-return]

    def vertex(self, method: str, request: vx.HttpBodyRequest) -> list[vx.HttpBody]:
        path = f"/{VERTEX}/{method}"
        if method == "ChatCompletions":
            stream = self.channel.unary_stream(
                path,
                request_serializer=vx.HttpBodyRequest.SerializeToString,
                response_deserializer=vx.HttpBody.FromString,
            )
            return list(stream(request, timeout=30))
        unary = self.channel.unary_unary(
            path, request_serializer=vx.HttpBodyRequest.SerializeToString, response_deserializer=vx.HttpBody.FromString
        )
        return [unary(request, timeout=30)]


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
        pool_protocol="h2c",  # an InferencePool with appProtocol kubernetes.io/h2c
    )
    try:
        envoy = EnvoyProcess(build_bootstrap(opts)).start()
    except Exception:
        epp.stop()
        raise
    channel = grpc.insecure_channel(f"127.0.0.1:{envoy.listen_port}")
    yield Gateway(epp, envoy, channel)
    channel.close()
    envoy.stop()
    epp.stop()


@pytest.fixture(autouse=True)
def _clear(pods: Pods) -> None:
    pods.take()


def test_generate_with_token_ids_reaches_a_pod_unchanged_and_usage_is_read(gateway: Gateway, pods: Pods) -> None:
    ids = list(range(500, 523))  # 23 prompt tokens: no other test sends this many
    request = pb.GenerateRequest(
        request_id="g-1",
        tokenized=pb.TokenizedInput(original_text="twenty-three tokens", input_ids=ids),
        sampling_params=pb.SamplingParams(max_tokens=3, temperature=0.0),
        stream=True,
    )
    before_in = gateway.epp.metric_value(INPUT_TOKENS)
    before_out = gateway.epp.metric_value(OUTPUT_TOKENS)
    answers = gateway.generate(request)
    assert [a.WhichOneof("response") for a in answers] == ["chunk", "chunk", "complete"]
    assert list(answers[-1].complete.output_ids) == [11, 12, 13]
    (seen,) = pods.take()
    assert seen[1:] == ("Generate", request.SerializeToString())
    assert gateway.epp.wait_metric(INPUT_TOKENS, before_in + 23) == before_in + 23
    assert gateway.epp.wait_metric(OUTPUT_TOKENS, before_out + 3) == before_out + 3


def test_generate_with_a_text_prompt(gateway: Gateway, pods: Pods) -> None:
    request = pb.GenerateRequest(request_id="g-2", text="Once upon a time there was", stream=False)
    answers = gateway.generate(request)
    assert answers[-1].complete.finish_reason == "length"
    (seen,) = pods.take()
    assert seen[1:] == ("Generate", request.SerializeToString())


def test_embed_reaches_a_pod_and_usage_is_read(gateway: Gateway, pods: Pods) -> None:
    request = pb.EmbedRequest(request_id="e-1", tokenized=pb.TokenizedInput(input_ids=list(range(31))))
    before = gateway.epp.metric_value(INPUT_TOKENS)
    answer = gateway.embed(request)
    assert list(answer.embedding) == [0.5, -0.5]
    (seen,) = pods.take()
    assert seen[1:] == ("Embed", request.SerializeToString())
    assert gateway.epp.wait_metric(INPUT_TOKENS, before + 31) == before + 31


@pytest.mark.parametrize(
    ("send", "fragment"),
    [
        (lambda g: g.generate(pb.GenerateRequest(request_id="no-input")), "has no input"),
        (lambda g: g.embed(pb.EmbedRequest(request_id="no-tokens")), "no 'tokenized'"),
        (
            lambda g: g.generate(
                pb.GenerateRequest(request_id="gz", text="zip " * 100), compression=grpc.Compression.Gzip
            ),
            "compressed",
        ),
    ],
    ids=["generate-without-input", "embed-without-tokens", "compressed"],
)
def test_bad_requests_are_refused_before_any_pod(gateway: Gateway, pods: Pods, send: Any, fragment: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        send(gateway)
    assert err.value.code() is not grpc.StatusCode.OK
    assert fragment in (err.value.details() or ""), err.value.details()
    assert pods.take() == []


def test_an_unclaimed_method_reaches_a_pod_through_the_passthrough_fallback(gateway: Gateway, pods: Pods) -> None:
    call = gateway.channel.unary_unary(f"/{SERVICE}/HealthCheck")
    assert call(b"", timeout=30) == b"\x08\x01"
    assert [s[1:] for s in pods.take()] == [("HealthCheck", b"")]


def test_repeats_of_a_token_prompt_follow_its_prefix_to_one_pod(gateway: Gateway, pods: Pods) -> None:
    for k in range(5):
        request = pb.GenerateRequest(tokenized=pb.TokenizedInput(input_ids=[k * 1000 + i for i in range(64)]))
        for _ in range(4):
            gateway.generate(request)
        assert len({s[0] for s in pods.take()}) == 1, k


# --- Vertex AI ---------------------------------------------------------------------------------------------
def _envelope(body: object) -> vx.HttpBodyRequest:
    data = json.dumps(body).encode()
    return vx.HttpBodyRequest(
        endpoint="projects/p/locations/us-central1/endpoints/openapi",
        http_body=vx.HttpBody(content_type="application/json", data=data),
    )


@pytest.mark.parametrize(
    ("method", "body", "tokens"),
    [
        (
            "ChatCompletions",
            {"model": "vertex-chat", "messages": [{"role": "user", "content": "hi"}], "stream": True},
            (17, 4),
        ),
        ("RawPredict", {"model": "vertex-raw", "input": "Hello from raw predict"}, (19, 2)),
    ],
)
def test_vertex_envelopes_reach_a_pod_unchanged_and_usage_is_read(
    gateway: Gateway, pods: Pods, method: str, body: dict[str, Any], tokens: tuple[int, int]
) -> None:
    model = body["model"]
    before_in = gateway.epp.metric_value(INPUT_TOKENS, model_name=model)
    before_out = gateway.epp.metric_value(OUTPUT_TOKENS, model_name=model)
    request = _envelope(body)
    answers = gateway.vertex(method, request)
    assert answers and all(a.data for a in answers)
    (seen,) = pods.take()
    assert seen[1:] == (method, request.SerializeToString())
    assert gateway.epp.wait_metric(INPUT_TOKENS, before_in + tokens[0], model_name=model) == before_in + tokens[0]
    assert gateway.epp.wait_metric(OUTPUT_TOKENS, before_out + tokens[1], model_name=model) == before_out + tokens[1]


@pytest.mark.parametrize(
    ("method", "request_", "fragment"),
    [
        ("ChatCompletions", _envelope({"model": "m", "messages": []}), "ChatCompletionsRequest.http_body"),
        ("RawPredict", vx.HttpBodyRequest(endpoint="e"), "has no http_body"),
    ],
)
def test_bad_vertex_requests_are_refused_before_any_pod(
    gateway: Gateway, pods: Pods, method: str, request_: vx.HttpBodyRequest, fragment: str
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        gateway.vertex(method, request_)
    assert fragment in (err.value.details() or ""), err.value.details()
    assert pods.take() == []


def test_repeats_of_a_vertex_chat_follow_its_prefix_to_one_pod(gateway: Gateway, pods: Pods) -> None:
    for k in range(5):
        text = f"report {k}: " + "lorem ipsum " * 40
        request = _envelope({"model": "m", "messages": [{"role": "user", "content": text}]})
        for _ in range(4):
            gateway.vertex("ChatCompletions", request)
        assert len({s[0] for s in pods.take()}) == 1, k


@pytest.mark.parametrize("name", sorted(GRPC_ONLY))
def test_an_upstream_grpc_parser_config_serves_generate_through_envoy(name: str, pods: Pods) -> None:
    config = (CONFIGS / name).read_text()
    epp = EppProcess("--endpoints", ",".join(pods.addresses), "--secure-serving=false", "--config-text", config)
    epp.start()
    try:
        opts = EnvoyConfigOptions(
            listen_port=0, admin_port=0, epp_port=epp.grpc_port, epp_tls=False, pool_protocol="h2c"
        )
        envoy = EnvoyProcess(build_bootstrap(opts)).start()
        try:
            with grpc.insecure_channel(f"127.0.0.1:{envoy.listen_port}") as channel:
                gateway = Gateway(epp, envoy, channel)
                request = pb.GenerateRequest(
                    request_id="corpus-1",
                    tokenized=pb.TokenizedInput(input_ids=list(range(900, 917))),
                    sampling_params=pb.SamplingParams(max_tokens=3),
                    stream=True,
                )
                answers = gateway.generate(request)
                assert answers[-1].WhichOneof("response") == "complete"
                (seen,) = pods.take()
                assert seen[1:] == ("Generate", request.SerializeToString())
                with pytest.raises(grpc.RpcError) as refused:  # a method no configured parser claims
                    channel.unary_unary(f"/{SERVICE}/HealthCheck")(b"", timeout=30)
                assert "no parser is configured" in str(refused.value.details())
                assert pods.take() == []
        finally:
            envoy.stop()
    finally:
        epp.stop()
