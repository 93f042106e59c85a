"""vllmgrpc-parser: gRPC framing, vLLM's protobuf messages (wire bytes checked by hand), 400s naming the
problem, unread methods, and usage read back from framed responses split anywhere."""

from __future__ import annotations

import pytest

from llm_epp.framework import ApiKind, EppError
from llm_epp.framework.parsing import Parser
from llm_epp.framework.requestcontrol import Usage
from llm_epp.plugins.parsers import grpc_frames
from llm_epp.plugins.parsers.grpc_frames import FrameReader, frame, request_message
from llm_epp.plugins.parsers.vertexai_parser import TYPE as VERTEX
from llm_epp.plugins.parsers.vertexai_parser import Params as VertexParams
from llm_epp.plugins.parsers.vertexai_parser import factory as vertex_factory
from llm_epp.plugins.parsers.vllmgrpc_parser import TYPE as VLLM_GRPC
from llm_epp.plugins.parsers.vllmgrpc_parser import Params as VllmParams
from llm_epp.plugins.parsers.vllmgrpc_parser import VllmgrpcParser
from llm_epp.plugins.parsers.vllmgrpc_parser import factory as vllm_factory
from llm_epp.plugins.parsers.wire import vllm_engine_pb2 as pb
from llm_epp.requestcontrol.parsers import ParserTable
from tests.unit.builders import FakeHandle

VLLM = VllmgrpcParser()
GENERATE = "/vllm.grpc.engine.VllmEngine/Generate"
EMBED = "/vllm.grpc.engine.VllmEngine/Embed"
CHAT = "/google.cloud.aiplatform.v1beta1.PredictionService/ChatCompletions"
RAW = "/google.cloud.aiplatform.v1beta1.PredictionService/RawPredict"
STREAM_RAW = "/google.cloud.aiplatform.v1beta1.PredictionService/StreamRawPredict"


def _bad(parser: Parser, path: str, body: bytes) -> str:
    with pytest.raises(EppError) as err:
        parser.parse_request(path, {":path": path}, body)
    assert err.value.code.http_status == 400
    return err.value.message


# --- framing ---------------------------------------------------------------------------------------------
def test_wire_bytes_of_a_generate_request_are_vllms() -> None:
    """Hand-encoded protobuf of vLLM's field numbers: request_id=1, tokenized=2 {input_ids=2 packed}, stream=5."""
    req = pb.GenerateRequest(request_id="r", tokenized=pb.TokenizedInput(input_ids=[1, 300]), stream=True)
    expected = b"\x0a\x01r" + b"\x12\x05" + b"\x12\x03\x01\xac\x02" + b"\x28\x01"
    assert req.SerializeToString() == expected


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"", "5-byte prefix"),
        (b"\x00\x00\x00", "5-byte prefix"),
        (b"\x01\x00\x00\x00\x01x", "compressed"),
        (b"\x00\x00\x00\x00\x09abc", "announces 9 bytes"),
        (b"\x00\xff\xff\xff\xffabc", "announces 4294967295 bytes"),
    ],
)
def test_bad_frames_are_400s(body: bytes, fragment: str) -> None:
    with pytest.raises(EppError) as err:
        request_message(body, "thing")
    assert err.value.code.http_status == 400 and fragment in err.value.message


class Collect(FrameReader):
    __slots__ = ("messages",)

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[bytes] = []

    def take(self, message: bytes) -> None:
        self.messages.append(message)


@pytest.mark.parametrize("split", [1, 2, 5, 6, 11, 1000])
def test_frame_reader_reassembles_messages_at_any_split(split: int) -> None:
    messages = [b"", b"a", b"hello world" * 3]
    stream = b"".join(frame(m) for m in messages)
    reader = Collect()
    for i in range(0, len(stream), split):
        reader.feed_frames(stream[i : i + split])
    assert reader.messages == messages


def test_frame_reader_skips_oversized_and_compressed_messages_without_buffering(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(grpc_frames, "MAX_RESPONSE_MESSAGE_BYTES", 8)
    stream = frame(b"x" * 50) + b"\x01" + frame(b"zip")[1:] + frame(b"ok")
    reader = Collect()
    for i in range(0, len(stream), 7):
        reader.feed_frames(stream[i : i + 7])
        assert len(reader._buf) <= 8 + 5
    assert reader.messages == [b"ok"]


# --- vllmgrpc-parser -------------------------------------------------------------------------------------
def test_generate_with_token_ids() -> None:
    req = pb.GenerateRequest(
        request_id="r1",
        tokenized=pb.TokenizedInput(original_text="hi there", input_ids=[101, 2, 4294967295]),
        sampling_params=pb.SamplingParams(max_tokens=16, temperature=0.5),
        stream=True,
    )
    parsed = VLLM.parse_request(GENERATE, {}, frame(req.SerializeToString()))
    assert parsed.body.api is ApiKind.GENERATE
    assert parsed.body.token_ids == (101, 2, 4294967295)
    assert parsed.body.stream and parsed.model == "" and not parsed.skip_response_processing
    assert VLLM.rewrite_model(parsed, b"", "other") is None


def test_generate_with_text_is_a_completion_on_that_text() -> None:
    req = pb.GenerateRequest(request_id="r2", text="Once upon a time")
    parsed = VLLM.parse_request(GENERATE, {}, frame(req.SerializeToString()))
    assert parsed.body.api is ApiKind.COMPLETIONS
    assert parsed.body.payload["prompt"] == "Once upon a time"
    assert not parsed.body.token_ids and not parsed.body.stream


def test_embed_with_token_ids() -> None:
    req = pb.EmbedRequest(request_id="e", tokenized=pb.TokenizedInput(input_ids=[5, 6]))
    parsed = VLLM.parse_request(EMBED, {}, frame(req.SerializeToString()))
    assert (parsed.body.api, parsed.body.token_ids) == (ApiKind.EMBEDDINGS, (5, 6))


@pytest.mark.parametrize(
    ("path", "body", "fragment"),
    [
        (GENERATE, frame(pb.GenerateRequest(request_id="x").SerializeToString()), "has no input"),
        (EMBED, frame(pb.EmbedRequest(request_id="x").SerializeToString()), "no 'tokenized'"),
        (GENERATE, frame(b"\xff\xff\xff"), "not a vLLM GenerateRequest"),
        (GENERATE, b'{"prompt": "json is not grpc"}', "whose first byte is 0 or 1, got 123"),
        (GENERATE, b"\x01" + frame(b"")[1:], "compressed"),
    ],
)
def test_bad_vllm_grpc_requests_are_400s(path: str, body: bytes, fragment: str) -> None:
    assert fragment in _bad(VLLM, path, body)


def test_other_vllm_methods_are_routed_unread() -> None:
    parsed = VLLM.parse_request("/vllm.grpc.engine.VllmEngine/HealthCheck", {}, frame(b""))
    assert parsed.body.api is ApiKind.OPAQUE and parsed.skip_response_processing


def _generate_stream() -> bytes:
    msgs = [
        pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[7])),
        pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[8], prompt_tokens=3, completion_tokens=2)),
        pb.GenerateResponse(
            complete=pb.GenerateComplete(
                output_ids=[7, 8, 9], finish_reason="stop", prompt_tokens=3, completion_tokens=3, cached_tokens=2
            )
        ),
    ]
    return b"".join(frame(m.SerializeToString()) for m in msgs)


@pytest.mark.parametrize("split", [1, 3, 7, 40, 10_000])
def test_generate_usage_from_the_last_message_reporting_tokens(split: int) -> None:
    parsed = VLLM.parse_request(
        GENERATE, {}, frame(pb.GenerateRequest(tokenized=pb.TokenizedInput(input_ids=[1])).SerializeToString())
    )
    reader = VLLM.response_reader(parsed, {"content-type": "application/grpc"})
    assert reader is not None
    stream = _generate_stream()
    for i in range(0, len(stream), split):
        reader.feed(stream[i : i + split], False)
    reader.feed(b"", True)
    assert reader.usage == Usage(3, 3, 6, 2)


def test_embed_usage() -> None:
    parsed = VLLM.parse_request(
        EMBED, {}, frame(pb.EmbedRequest(tokenized=pb.TokenizedInput(input_ids=[1, 2])).SerializeToString())
    )
    reader = VLLM.response_reader(parsed, {})
    assert reader is not None
    reader.feed(
        frame(pb.EmbedResponse(embedding=[0.5, 0.25], prompt_tokens=2, embedding_dim=2).SerializeToString()), True
    )
    assert reader.usage == Usage(2, 0, 2, 0)


def test_a_response_without_token_counts_has_no_usage() -> None:
    parsed = VLLM.parse_request(GENERATE, {}, frame(pb.GenerateRequest(text="x").SerializeToString()))
    reader = VLLM.response_reader(parsed, {})
    assert reader is not None
    reader.feed(frame(pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[1])).SerializeToString()), True)
    assert reader.usage is None


# --- registration --------------------------------------------------------------------------------------------
def test_factories_claims_and_resolution() -> None:
    vllm = vllm_factory("v", VllmParams(), FakeHandle())
    vertex = vertex_factory("x", VertexParams(), FakeHandle())
    assert (vllm.typed_name.type, vertex.typed_name.type) == (VLLM_GRPC, VERTEX)
    assert vllm.claims().protocols == vertex.claims().protocols == ("kubernetes.io/h2c",)
    table = ParserTable([vllm, vertex])
    assert table.resolve(GENERATE) is vllm and table.resolve(EMBED) is vllm
    assert table.resolve(CHAT) is vertex and table.resolve(RAW) is vertex and table.resolve(STREAM_RAW) is vertex
