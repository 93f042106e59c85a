"""anthropic-parser

Scheduling intent:
    Read Anthropic Messages API requests (`POST /v1/messages`) so scheduling sees the model and the
    conversation: `model` is extracted (and rewritten in the forwarded body when the request is routed to
    another model name), `stream` and `cache_salt` are read, and the body is kept as `ApiKind.MESSAGES`
    (`system` and `messages` are the prompt for prefix-cache estimation and token counting).
    `/v1/messages/count_tokens` is routed without reading its body or its answer.

    Body checks (a failure is a 400 that names the field): a JSON object; `messages` a non-empty list of
    objects whose `content` is a string or a list of content blocks (objects with a string `type`: text,
    image, tool_use, tool_result, thinking, ...); `system`, when present, a string or a list of content
    blocks; `tools`, when present, a list of objects; `model`, when present, a string. Any other path
    ending in `messages` is a 400 naming it.

Inputs consumed:
    The request path (`:path`, `x-original-path`, `x-forwarded-path`), the JSON request body, and the
    response's token usage: from a JSON answer's `usage` (`input_tokens`, `output_tokens`,
    `cache_read_input_tokens`), or from a Server-Sent Events stream, where `message_start` carries the input
    and cache-read tokens and `message_delta` the output tokens (also when an event is split across
    response chunks).

Configuration:
    No parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from llm_epp.framework import ApiKind, Handle, PluginParams, RequestBody, TypedName
from llm_epp.framework.parsing import Claims, ParsedRequest, ResponseReader
from llm_epp.framework.requestcontrol import Usage
from llm_epp.plugins.parsers import openai_parser
from llm_epp.plugins.parsers.sse import SseDataReader, non_negative_int
from llm_epp.plugins.parsers.tokens import bad_request, json_object

TYPE = "anthropic-parser"
MESSAGES_PATH = "messages"
COUNT_TOKENS_PATH = "messages/count_tokens"
_USAGE = b'"usage"'
_COUNT_TOKENS = ParsedRequest(RequestBody(ApiKind.OPAQUE), skip_response_processing=True)


class Params(PluginParams):
    pass


def _check_content(value: Any, where: str) -> None:
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise bad_request(f"{where} must be a string or a list of content blocks")
    for i, block in enumerate(value):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise bad_request(f"{where}[{i}] must be a content block: an object with a string 'type'")


def parse_messages(body: bytes) -> ParsedRequest:
    """A Messages API body. Raises EppError(BadRequest) saying what is wrong."""
    payload = json_object(body, "/v1/messages request")
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("/v1/messages expects 'messages': a non-empty list of {role, content} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object with 'role' and 'content'")
        if "role" in m and not isinstance(m["role"], str):
            raise bad_request(f"messages[{i}].role must be a string")
        _check_content(m.get("content", ""), f"messages[{i}].content")
    if payload.get("system") is not None:
        _check_content(payload["system"], "system")
    tools = payload.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise bad_request("'tools' must be a list of tool objects")
    model = payload.get("model", "")
    if not isinstance(model, str):
        raise bad_request("'model' must be a string naming the model to use")
    salt = payload.get("cache_salt")
    parsed = RequestBody(
        api=ApiKind.MESSAGES,
        payload=payload,
        stream=payload.get("stream") is True,
        cache_salt=salt if isinstance(salt, str) else "",
    )
    return ParsedRequest(parsed, model)


def usage_from_message(obj: Any) -> Usage | None:
    """Usage of a decoded (non-streamed) Messages API answer."""
    usage = obj.get("usage") if isinstance(obj, dict) else None
    if not isinstance(usage, dict):
        return None
    p, c = non_negative_int(usage.get("input_tokens")), non_negative_int(usage.get("output_tokens"))
    return Usage(p, c, p + c, non_negative_int(usage.get("cache_read_input_tokens")))


def usage_from_message_json(body: bytes) -> Usage | None:
    if _USAGE not in body:
        return None
    try:
        return usage_from_message(orjson.loads(body))
    except orjson.JSONDecodeError:
        return None


class SseMessagesUsageReader(SseDataReader):
    """Usage of a streamed Messages API answer: input and cache-read tokens from `message_start`, output
    tokens from the last `message_delta`."""

    __slots__ = ("_cached", "_completion", "_prompt")
    marker = _USAGE

    def __init__(self) -> None:
        super().__init__()
        self._prompt = self._completion = self._cached = 0

    def take(self, payload: bytes) -> None:
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            if not isinstance(usage, dict):
                return
            self._prompt = non_negative_int(usage.get("input_tokens"))
            self._cached = non_negative_int(usage.get("cache_read_input_tokens"))
        elif kind == "message_delta":
            usage = event.get("usage")
            if not isinstance(usage, dict):
                return
            self._completion = non_negative_int(usage.get("output_tokens"))
        else:
            return
        p, c = self._prompt, self._completion
        self._usage = Usage(p, c, p + c, self._cached)


class AnthropicParser:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def claims(self) -> Claims:
        return Claims(paths=(MESSAGES_PATH, COUNT_TOKENS_PATH), protocols=("kubernetes.io/h2c", "http"))

    def parse_request(self, path: str, headers: Mapping[str, str], body: bytes) -> ParsedRequest:
        trimmed = path.strip().removesuffix("/")
        if trimmed.endswith("/" + COUNT_TOKENS_PATH):
            return _COUNT_TOKENS
        if not trimmed.endswith("/" + MESSAGES_PATH):
            raise bad_request(f"anthropic-parser reads /v1/messages and /v1/messages/count_tokens, not {path!r}")
        return parse_messages(body)

    def rewrite_model(self, parsed: ParsedRequest, body: bytes, model: str) -> bytes | None:
        if parsed.body.api is not ApiKind.MESSAGES:
            return None
        return openai_parser.rewrite_model(parsed.body.payload, model)

    def response_reader(self, parsed: ParsedRequest, headers: Mapping[str, str]) -> ResponseReader | None:
        if "text/event-stream" in headers.get("content-type", "").lower():
            return SseMessagesUsageReader()
        return openai_parser.JsonUsageReader(decode=usage_from_message_json)


def factory(name: str, params: Params, handle: Handle) -> AnthropicParser:
    return AnthropicParser(name)
