"""vertexai-parser: Vertex AI request envelopes carrying OpenAI JSON, 400s naming the problem, unread methods,
and usage read back from framed HttpBody answers (JSON or SSE) split anywhere."""

from __future__ import annotations

import json

import pytest

from llm_epp.framework import ApiKind, EppError
from llm_epp.framework.parsing import Parser
from llm_epp.framework.requestcontrol import Usage
from llm_epp.plugins.parsers.grpc_frames import frame
from llm_epp.plugins.parsers.vertexai_parser import VertexaiParser
from llm_epp.plugins.parsers.wire import vertex_prediction_pb2 as vx

VERTEX_PARSER = VertexaiParser()
CHAT = "/google.cloud.aiplatform.v1beta1.PredictionService/ChatCompletions"
RAW = "/google.cloud.aiplatform.v1beta1.PredictionService/RawPredict"
STREAM_RAW = "/google.cloud.aiplatform.v1beta1.PredictionService/StreamRawPredict"


def _bad(parser: Parser, path: str, body: bytes) -> str:
    with pytest.raises(EppError) as err:
        parser.parse_request(path, {":path": path}, body)
    assert err.value.code.http_status == 400
    return err.value.message


# --- vertexai-parser -------------------------------------------------------------------------------------
def _envelope(payload: object, content_type: str = "application/json") -> bytes:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    msg = vx.HttpBodyRequest(
        endpoint="projects/p/locations/l/endpoints/openapi", http_body=vx.HttpBody(content_type=content_type, data=data)
    )
    return frame(msg.SerializeToString())


def test_chat_completions_envelope_is_read_as_a_chat_completion() -> None:
    body = {"model": "meta/llama", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    parsed = VERTEX_PARSER.parse_request(CHAT, {}, _envelope(body))
    assert parsed.body.api is ApiKind.CHAT_COMPLETIONS
    assert (parsed.model, parsed.body.stream) == ("meta/llama", True)
    assert VERTEX_PARSER.rewrite_model(parsed, b"", "other") is None


@pytest.mark.parametrize("path", [RAW, STREAM_RAW])
def test_raw_predict_envelopes_are_read_as_responses_requests(path: str) -> None:
    parsed = VERTEX_PARSER.parse_request(path, {}, _envelope({"model": "m", "input": "Hello"}))
    assert (parsed.body.api, parsed.model, parsed.body.payload["input"]) == (ApiKind.RESPONSES, "m", "Hello")


@pytest.mark.parametrize(
    ("path", "body", "fragment"),
    [
        (CHAT, _envelope({"model": "m", "messages": []}), "ChatCompletionsRequest.http_body: "),
        (CHAT, _envelope(b"not json"), "not valid JSON"),
        (RAW, _envelope({"model": "m"}), "RawPredictRequest.http_body: "),
        (CHAT, frame(vx.HttpBodyRequest(endpoint="e").SerializeToString()), "has no http_body"),
        (STREAM_RAW, frame(b"\x0a\xff"), "not a Vertex AI StreamRawPredictRequest"),
        (CHAT, b"\x00", "5-byte prefix"),
    ],
)
def test_bad_vertex_requests_are_400s(path: str, body: bytes, fragment: str) -> None:
    assert fragment in _bad(VERTEX_PARSER, path, body)


def test_other_vertex_methods_are_routed_unread() -> None:
    parsed = VERTEX_PARSER.parse_request(
        "/google.cloud.aiplatform.v1beta1.PredictionService/Predict", {}, b"\x00\x00\x00\x00\x00"
    )
    assert parsed.body.api is ApiKind.OPAQUE and parsed.skip_response_processing


@pytest.mark.parametrize("split", [1, 9, 10_000])
def test_vertex_usage_from_json_and_sse_http_bodies(split: int) -> None:
    parsed = VERTEX_PARSER.parse_request(
        CHAT, {}, _envelope({"model": "m", "messages": [{"role": "user", "content": "x"}]})
    )
    usage = {"prompt_tokens": 4, "completion_tokens": 5, "total_tokens": 9}
    answers = [
        b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n',
        b'data: {"choices": [], "usage": ' + json.dumps(usage).encode() + b"}\n\ndata: [DONE]\n\n",
    ]
    stream = b"".join(frame(vx.HttpBody(content_type="text/event-stream", data=a).SerializeToString()) for a in answers)
    reader = VERTEX_PARSER.response_reader(parsed, {"content-type": "application/grpc"})
    assert reader is not None
    for i in range(0, len(stream), split):
        reader.feed(stream[i : i + split], False)
    reader.feed(b"", True)
    assert reader.usage == Usage(4, 5, 9, 0)
    json_reader = VERTEX_PARSER.response_reader(parsed, {})
    assert json_reader is not None
    json_reader.feed(frame(vx.HttpBody(data=json.dumps({"usage": usage}).encode()).SerializeToString()), True)
    assert json_reader.usage == Usage(4, 5, 9, 0)
