"""openai-parser

Scheduling intent:
    Read OpenAI-style JSON requests so scheduling sees the model and the prompt: the API is detected from the
    path suffix (`conversations`, `responses`, `chat/completions` and its `/render`, `completions` and its
    `/render`, `embeddings`, `images/generations`), the body shape is checked for that API (a malformed body
    is a 400 that says what is missing), `model` is extracted and, when the request is routed to another model
    name, rewritten in the forwarded body. Image generation requests are scheduled as completions on their
    `prompt`.

Inputs consumed:
    The request path (`:path`, `x-original-path`, `x-forwarded-path`), the JSON request body, and the model
    server's response: token usage from a JSON body or from Server-Sent Events (`data:` lines, also when a
    line is split across body chunks; the Responses API's `response.completed` event).

Configuration:
    No parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import orjson

from llm_epp.framework import ApiKind, EppError, ErrorCode, Handle, PluginParams, RequestBody, TypedName
from llm_epp.framework.parsing import Claims, ParsedRequest, ResponseReader
from llm_epp.framework.requestcontrol import Usage
from llm_epp.plugins.parsers.sse import SseDataReader, non_negative_int

TYPE = "openai-parser"

# The reference's claimed suffixes.
PATHS = (
    "chat/completions",
    "completions",
    "embeddings",
    "responses",
    "conversations",
    "chat/completions/render",
    "completions/render",
    "images/generations",
)

# Tested in this order (the reference's): the first suffix the path ends with names the API.
_APIS = (
    ("/conversations", ApiKind.CONVERSATIONS),
    ("/responses", ApiKind.RESPONSES),
    ("/chat/completions", ApiKind.CHAT_COMPLETIONS),
    ("/chat/completions/render", ApiKind.CHAT_COMPLETIONS),
    ("/completions", ApiKind.COMPLETIONS),
    ("/completions/render", ApiKind.COMPLETIONS),
    ("/embeddings", ApiKind.EMBEDDINGS),
)
_IMAGES = "/images/generations"
_USAGE = b'"usage"'
MAX_JSON_RESPONSE_BYTES = 4 << 20  # non-streamed responses larger than this are not parsed for usage


class Params(PluginParams):
    pass


def detect_api(path: str) -> tuple[ApiKind, bool]:
    """(API kind, is an image generation request); unknown paths are completions, as in the reference."""
    path = path.strip().removesuffix("/")
    for suffix, kind in _APIS:
        if path.endswith(suffix):
            return kind, False
    if path.endswith(_IMAGES):
        return ApiKind.COMPLETIONS, True
    return ApiKind.COMPLETIONS, False


def _bad(message: str) -> EppError:
    return EppError(ErrorCode.BAD_REQUEST, message)


def _check_shape(api: ApiKind, images: bool, payload: Mapping[str, Any], path: str) -> None:
    if images:
        prompt = payload.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise _bad(f"{path} expects a non-empty 'prompt' string")
        return
    if api is ApiKind.COMPLETIONS:
        prompt = payload.get("prompt")
        if isinstance(prompt, str | list) and prompt:
            return
        raise _bad(f"{path} expects a non-empty 'prompt' (a string or a list of strings)")
    if api is ApiKind.CHAT_COMPLETIONS:
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _bad(f"{path} expects 'messages': a non-empty list of {{role, content}} objects")
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                raise _bad(f"messages[{i}] must be an object with 'role' and 'content'")
        return
    if api is ApiKind.RESPONSES:
        if payload.get("input") in (None, "", []):
            raise _bad(f"{path} expects 'input'")
        return
    if api is ApiKind.CONVERSATIONS:
        items = payload.get("items")
        if not isinstance(items, list) or not items:
            raise _bad(f"{path} expects 'items': a non-empty list")
        return
    if api is ApiKind.EMBEDDINGS and payload.get("input") in (None, "", []):
        raise _bad(f"{path} expects a non-empty 'input'")


def parse_body(path: str, body: bytes) -> ParsedRequest:
    """The parsed request and its model. Raises EppError(BadRequest) saying what is wrong."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise _bad(f"the request body is not valid JSON: {e}") from None
    if not isinstance(payload, dict):
        raise _bad("the request body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise _bad('model not found in request body: set "model" to the name of the model to use')
    api, images = detect_api(path)
    _check_shape(api, images, payload, path)
    salt = payload.get("cache_salt")
    body_out = RequestBody(
        api=api,
        payload=payload,
        stream=payload.get("stream") is True,
        cache_salt=salt if isinstance(salt, str) else "",
    )
    return ParsedRequest(body_out, model)


def rewrite_model(payload: Mapping[str, Any], target_model: str) -> bytes:
    """The body with `model` replaced, re-serialised."""
    out = dict(payload)
    out["model"] = target_model
    return orjson.dumps(out)


# --- responses --------------------------------------------------------------------------------------------
def usage_from_object(obj: Any) -> Usage | None:
    """Usage from a decoded response object (chat/text completion, responses API, or an SSE event)."""
    if not isinstance(obj, dict):
        return None
    if obj.get("type") == "response.completed" and isinstance(obj.get("response"), dict):
        obj = obj["response"]
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    total = usage.get("total_tokens")
    n = non_negative_int
    p, c = n(prompt), n(completion)
    return Usage(prompt_tokens=p, completion_tokens=c, total_tokens=n(total) or p + c, cached_tokens=n(cached))


def usage_from_json(body: bytes) -> Usage | None:
    if _USAGE not in body:
        return None
    try:
        return usage_from_object(orjson.loads(body))
    except orjson.JSONDecodeError:
        return None


class SseUsageReader(SseDataReader):
    """Reads Server-Sent Events chunk by chunk and keeps the last usage seen. A `data:` line split across
    chunks is reassembled; only lines that mention "usage" are decoded, so token events cost a search."""

    __slots__ = ()
    marker = _USAGE

    def take(self, payload: bytes) -> None:
        try:
            found = usage_from_object(orjson.loads(payload))
        except orjson.JSONDecodeError:
            return
        if found is not None:
            self._usage = found


class JsonUsageReader:
    """Collects a JSON response (up to `limit` bytes; larger ones are not read) and decodes its usage at the
    end of the stream with `decode` (the OpenAI `usage` object unless told otherwise)."""

    __slots__ = ("_chunks", "_decode", "_limit", "_size", "_usage")

    def __init__(
        self, limit: int = MAX_JSON_RESPONSE_BYTES, decode: Callable[[bytes], Usage | None] | None = None
    ) -> None:
        self._chunks: list[bytes] | None = []
        self._size = 0
        self._limit = limit
        self._decode = decode or usage_from_json
        self._usage: Usage | None = None

    @property
    def usage(self) -> Usage | None:
        return self._usage

    def feed(self, chunk: bytes, end_of_stream: bool = False) -> None:
        chunks = self._chunks
        if chunks is None:
            return
        self._size += len(chunk)
        if self._size > self._limit:
            self._chunks = None
            return
        if chunk:
            chunks.append(chunk)
        if end_of_stream:
            self._chunks = None
            self._usage = self._decode(b"".join(chunks))


class OpenaiParser:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def claims(self) -> Claims:
        return Claims(paths=PATHS, protocols=("http", "kubernetes.io/h2c"))

    def parse_request(self, path: str, headers: Mapping[str, str], body: bytes) -> ParsedRequest:
        return parse_body(path, body)

    def rewrite_model(self, parsed: ParsedRequest, body: bytes, model: str) -> bytes | None:
        return rewrite_model(parsed.body.payload, model)

    def response_reader(self, parsed: ParsedRequest, headers: Mapping[str, str]) -> ResponseReader | None:
        if "text/event-stream" in headers.get("content-type", "").lower():
            return SseUsageReader()
        return JsonUsageReader()


def factory(name: str, params: Params, handle: Handle) -> OpenaiParser:
    return OpenaiParser(name)
