"""vllmgrpc-parser

Scheduling intent:
    Read vLLM's gRPC engine API (service `vllm.grpc.engine.VllmEngine`) through Envoy, on an InferencePool
    whose appProtocol is `kubernetes.io/h2c` (the chart's `modelServerProtocol: grpc`). The request body is
    one gRPC frame holding a protobuf message, decoded with vLLM's message definitions
    (`proto/llm_epp/parsers/v1/vllm_engine.proto`):
    - `/vllm.grpc.engine.VllmEngine/Generate` (`GenerateRequest`): a pre-tokenized prompt (`tokenized`) gives
      the exact token ids (`RequestBody.token_ids`, scheduled as `ApiKind.GENERATE`); a text prompt
      (`text`) is scheduled as a completion on that text. `stream` is read.
    - `/vllm.grpc.engine.VllmEngine/Embed` (`EmbedRequest`): the token ids of `tokenized`, scheduled as
      embeddings.
    Prefix-cache scoring and token counting work on those ids or that text. The API names no model, so none
    is extracted or rewritten; the body is forwarded exactly as sent. A body that is not one uncompressed
    gRPC frame, a message that does not decode, a Generate request with neither input, or an Embed request
    without `tokenized` is a 400 that says so (compressed requests are refused: send them uncompressed).
    Only those two methods are claimed: to route the service's other methods (HealthCheck, GetModelInfo,
    ...), configure `passthrough-parser` after this parser as the fallback.

Inputs consumed:
    The request path (the gRPC method), the gRPC request body, and the gRPC response: token usage
    (`prompt_tokens`, `completion_tokens`, `cached_tokens`) of the `GenerateResponse` stream (the last chunk
    or the final `complete` message that reports tokens) or of the `EmbedResponse`, reassembled across
    response chunks.

Configuration:
    No parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from llm_epp.framework import ApiKind, Handle, PluginParams, RequestBody, TypedName
from llm_epp.framework.parsing import Claims, ParsedRequest, ResponseReader
from llm_epp.framework.requestcontrol import Usage
from llm_epp.plugins.parsers.grpc_frames import FrameReader, request_message
from llm_epp.plugins.parsers.tokens import bad_request
from llm_epp.plugins.parsers.wire import DecodeError
from llm_epp.plugins.parsers.wire import vllm_engine_pb2 as pb

TYPE = "vllmgrpc-parser"
SERVICE = "vllm.grpc.engine.VllmEngine"
GENERATE_METHOD = f"{SERVICE}/Generate"
EMBED_METHOD = f"{SERVICE}/Embed"
_UNREAD = ParsedRequest(RequestBody(ApiKind.OPAQUE), skip_response_processing=True)
M = TypeVar("M", pb.GenerateRequest, pb.EmbedRequest)


class Params(PluginParams):
    pass


def _decode(message_type: type[M], body: bytes) -> M:
    name = message_type.DESCRIPTOR.name
    data = request_message(body, f"vLLM {name}")
    try:
        return message_type.FromString(data)
    except DecodeError as e:
        raise bad_request(f"the gRPC request is not a vLLM {name}: {e}") from None


def parse_generate(body: bytes) -> ParsedRequest:
    req = _decode(pb.GenerateRequest, body)
    which = req.WhichOneof("input")
    if which == "tokenized":
        ids = tuple(req.tokenized.input_ids)
        payload = {"token_ids": list(ids), "stream": req.stream}
        return ParsedRequest(RequestBody(ApiKind.GENERATE, payload, stream=req.stream, token_ids=ids))
    if which == "text":
        payload = {"prompt": req.text, "stream": req.stream}
        return ParsedRequest(RequestBody(ApiKind.COMPLETIONS, payload, stream=req.stream))
    raise bad_request("vLLM GenerateRequest has no input: set 'tokenized' (token ids) or 'text'")


def parse_embed(body: bytes) -> ParsedRequest:
    req = _decode(pb.EmbedRequest, body)
    if not req.HasField("tokenized"):
        raise bad_request("vLLM EmbedRequest has no 'tokenized' input: send the token ids to embed")
    ids = tuple(req.tokenized.input_ids)
    return ParsedRequest(RequestBody(ApiKind.EMBEDDINGS, {"input": list(ids)}, token_ids=ids))


def _usage(prompt: int, completion: int, cached: int) -> Usage | None:
    if prompt <= 0 and completion <= 0:
        return None
    return Usage(prompt, completion, prompt + completion, cached)


class GenerateUsageReader(FrameReader):
    """Usage of a `GenerateResponse` stream: the last chunk or completion that reports tokens."""

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
            resp = pb.GenerateResponse.FromString(message)
        except DecodeError:
            return
        which = resp.WhichOneof("response")
        if which == "chunk":
            c = resp.chunk
            found = _usage(c.prompt_tokens, c.completion_tokens, c.cached_tokens)
        elif which == "complete":
            d = resp.complete
            found = _usage(d.prompt_tokens, d.completion_tokens, d.cached_tokens)
        else:
            return
        if found is not None:
            self._usage = found


class EmbedUsageReader(GenerateUsageReader):
    """Usage of an `EmbedResponse`: its prompt tokens."""

    __slots__ = ()

    def take(self, message: bytes) -> None:
        try:
            resp = pb.EmbedResponse.FromString(message)
        except DecodeError:
            return
        if resp.prompt_tokens > 0:
            self._usage = Usage(resp.prompt_tokens, 0, resp.prompt_tokens, 0)


class VllmgrpcParser:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def claims(self) -> Claims:
        return Claims(paths=(GENERATE_METHOD, EMBED_METHOD), protocols=("kubernetes.io/h2c",))

    def parse_request(self, path: str, headers: Mapping[str, str], body: bytes) -> ParsedRequest:
        trimmed = path.strip().removesuffix("/")
        if trimmed.endswith(GENERATE_METHOD):
            return parse_generate(body)
        if trimmed.endswith(EMBED_METHOD):
            return parse_embed(body)
        return _UNREAD

    def rewrite_model(self, parsed: ParsedRequest, body: bytes, model: str) -> bytes | None:
        return None  # the API carries no model name

    def response_reader(self, parsed: ParsedRequest, headers: Mapping[str, str]) -> ResponseReader | None:
        if parsed.body.api is ApiKind.EMBEDDINGS:
            return EmbedUsageReader()
        return GenerateUsageReader()


def factory(name: str, params: Params, handle: Handle) -> VllmgrpcParser:
    return VllmgrpcParser(name)
