"""vertexai-parser

Scheduling intent:
    Read Vertex AI PredictionService gRPC requests that carry an OpenAI-compatible JSON body, on an
    InferencePool whose appProtocol is `kubernetes.io/h2c`. The request body is one gRPC frame holding the
    request envelope (`endpoint`, `http_body`); the JSON in `http_body.data` is read as `openai-parser`
    reads it:
    - `.../PredictionService/ChatCompletions` (`ChatCompletionsRequest`): as a chat completion
      (`/chat/completions`);
    - `.../PredictionService/RawPredict` and `.../PredictionService/StreamRawPredict`
      (`RawPredictRequest`, `StreamRawPredictRequest`): as a Responses API request (`/responses`).
    So scheduling sees the model and the prompt, and a bad JSON body gets the same 400 as over HTTP, prefixed
    with the message it came in. A body that is not one uncompressed gRPC frame, an envelope that does not
    decode or has no `http_body` is a 400 that says so. The body is forwarded exactly as sent (the model is
    not rewritten inside the envelope). Only those three methods are claimed: configure
    `passthrough-parser` after this parser to route other methods unread.

Inputs consumed:
    The request path (the gRPC method), the gRPC request body, and the gRPC response: each `HttpBody`
    message of the answer (reassembled across response chunks) holds OpenAI-style JSON, or Server-Sent Events
    for a streamed answer; the last token usage found is kept.

Configuration:
    No parameters.
"""

from __future__ import annotations

from collections.abc import Mapping

from llm_epp.framework import ApiKind, EppError, Handle, PluginParams, RequestBody, TypedName
from llm_epp.framework.parsing import Claims, ParsedRequest, ResponseReader
from llm_epp.framework.requestcontrol import Usage
from llm_epp.plugins.parsers import openai_parser
from llm_epp.plugins.parsers.grpc_frames import FrameReader, request_message
from llm_epp.plugins.parsers.tokens import bad_request
from llm_epp.plugins.parsers.wire import DecodeError
from llm_epp.plugins.parsers.wire import vertex_prediction_pb2 as pb

TYPE = "vertexai-parser"
CHAT_COMPLETIONS = "PredictionService/ChatCompletions"
STREAM_RAW_PREDICT = "PredictionService/StreamRawPredict"
RAW_PREDICT = "PredictionService/RawPredict"
# method suffix -> (request message name, the OpenAI path its JSON body is read as)
_METHODS = (
    (CHAT_COMPLETIONS, "ChatCompletionsRequest", "/chat/completions"),
    (STREAM_RAW_PREDICT, "StreamRawPredictRequest", "/responses"),
    (RAW_PREDICT, "RawPredictRequest", "/responses"),
)
_UNREAD = ParsedRequest(RequestBody(ApiKind.OPAQUE), skip_response_processing=True)


class Params(PluginParams):
    pass


def parse_envelope(body: bytes, name: str, openai_path: str) -> ParsedRequest:
    """The OpenAI-style JSON inside a Vertex AI request envelope. Raises EppError(BadRequest)."""
    data = request_message(body, f"Vertex AI {name}")
    try:
        envelope = pb.HttpBodyRequest.FromString(data)
    except DecodeError as e:
        raise bad_request(f"the gRPC request is not a Vertex AI {name}: {e}") from None
    if not envelope.HasField("http_body"):
        raise bad_request(f"Vertex AI {name} has no http_body: put the JSON request in http_body.data")
    try:
        return openai_parser.parse_body(openai_path, envelope.http_body.data)
    except EppError as e:
        raise bad_request(f"{name}.http_body: {e.message}") from None


class HttpBodyUsageReader(FrameReader):
    """Usage of a Vertex AI answer: each `HttpBody` message's data, as JSON or as Server-Sent Events."""

    __slots__ = ("_usage",)

    def __init__(self) -> None:
        super().__init__()
        self._usage: Usage | None = None

    @property
    def usage(self) -> Usage | None:
        return self._usage

    def feed(self, chunk: bytes, end_of_stream: bool = False) -> None:
        self.feed_frames(chunk)

    def take(self, message: bytes) -> None:
        try:
            data = pb.HttpBody.FromString(message).data
        except DecodeError:
            return
        if data.lstrip().startswith(b"data:"):
            sse = openai_parser.SseUsageReader()
            sse.feed(data, True)
            found = sse.usage
        else:
            found = openai_parser.usage_from_json(data)
        if found is not None:
            self._usage = found


class VertexaiParser:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def claims(self) -> Claims:
        return Claims(paths=(CHAT_COMPLETIONS, STREAM_RAW_PREDICT, RAW_PREDICT), protocols=("kubernetes.io/h2c",))

    def parse_request(self, path: str, headers: Mapping[str, str], body: bytes) -> ParsedRequest:
        trimmed = path.strip().removesuffix("/")
        for method, name, openai_path in _METHODS:
            if trimmed.endswith(method):
                return parse_envelope(body, name, openai_path)
        return _UNREAD

    def rewrite_model(self, parsed: ParsedRequest, body: bytes, model: str) -> bytes | None:
        return None  # the envelope is forwarded as sent

    def response_reader(self, parsed: ParsedRequest, headers: Mapping[str, str]) -> ResponseReader | None:
        return HttpBodyUsageReader()


def factory(name: str, params: Params, handle: Handle) -> VertexaiParser:
    return VertexaiParser(name)
