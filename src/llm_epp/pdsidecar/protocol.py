"""Request and response rewriting for disaggregated prefill: pure functions over decoded JSON bodies.

NIXL v2 (vLLM's NixlConnector): the prefill leg is the client's request with `kv_transfer_params` asking
for a remote decode, streaming off and every token limit set to 1; the prefill response's
`kv_transfer_params` then go into the decode leg, which restores the client's own stream and limit
fields. SGLang: both legs carry the same bootstrap host/port/room and run at the same time."""

from __future__ import annotations

import copy
import enum
from typing import Any

import orjson

PREFILL_HEADER = "x-prefiller-host-port"
ENCODER_HEADER = "x-encoder-hosts-ports"
DATA_PARALLEL_HEADER = "x-data-parallel-host-port"
KV_CACHE_SOURCE_HEADER = "x-kv-cache-source-host-port"
REQUEST_ID_HEADER = "x-request-id"

NIXLV2 = "nixlv2"
SGLANG = "sglang"
KV_CONNECTORS = (NIXLV2, SGLANG)
DEFAULT_SGLANG_BOOTSTRAP_PORT = 8998

KV_TRANSFER_PARAMS = "kv_transfer_params"
SAMPLING_PARAMS = "sampling_params"

CHAT_COMPLETIONS_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
MESSAGES_PATH = "/v1/messages"
RESPONSES_PATH = "/v1/responses"
GENERATE_PATH = "/inference/v1/generate"


class ApiStyle(enum.Enum):
    CHAT = "chat"  # chat completions, completions, messages: top-level max_tokens / max_completion_tokens
    RESPONSES = "responses"  # max_output_tokens
    GENERATE = "generate"  # vLLM token-in generate: sampling_params.max_tokens


DISAGGREGATED_PATHS: dict[str, ApiStyle] = {
    CHAT_COMPLETIONS_PATH: ApiStyle.CHAT,
    COMPLETIONS_PATH: ApiStyle.CHAT,
    MESSAGES_PATH: ApiStyle.CHAT,
    RESPONSES_PATH: ApiStyle.RESPONSES,
    GENERATE_PATH: ApiStyle.GENERATE,
}

TOKEN_LIMIT_FIELDS: dict[ApiStyle, tuple[str, ...]] = {
    ApiStyle.CHAT: ("max_tokens", "max_completion_tokens", "min_tokens"),
    ApiStyle.RESPONSES: ("max_output_tokens",),
    ApiStyle.GENERATE: ("max_tokens", "min_tokens"),
}

NIXL_PREFILL_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def _limits(body: dict[str, Any], style: ApiStyle) -> dict[str, Any]:
    if style is ApiStyle.GENERATE:
        params = body.get(SAMPLING_PARAMS)
        if not isinstance(params, dict):
            params = body[SAMPLING_PARAMS] = {}
        return params
    return body


def nixl_prefill_body(request: dict[str, Any], style: ApiStyle) -> dict[str, Any]:
    """The prefill leg: a copy of `request` asking for a remote decode, non-streaming, 1 token."""
    body = copy.deepcopy(request)
    body[KV_TRANSFER_PARAMS] = dict(NIXL_PREFILL_PARAMS)
    body["stream"] = False
    body.pop("stream_options", None)
    limits = _limits(body, style)
    for name in TOKEN_LIMIT_FIELDS[style]:
        limits[name] = 1
    return body


def nixl_decode_body(request: dict[str, Any], kv_transfer_params: Any) -> dict[str, Any]:
    """The decode leg: the client's request (its own stream and limit fields) plus the prefill's
    `kv_transfer_params`."""
    body = dict(request)
    body[KV_TRANSFER_PARAMS] = kv_transfer_params
    return body


def sglang_body(request: dict[str, Any], bootstrap_host: str, bootstrap_port: int, room: int) -> dict[str, Any]:
    body = dict(request)
    body["bootstrap_host"] = bootstrap_host
    body["bootstrap_port"] = bootstrap_port
    body["bootstrap_room"] = room
    return body


_DETAILS = ("prompt_tokens_details", "input_tokens_details")


def cached_tokens(response: Any) -> int | None:
    """`usage.prompt_tokens_details.cached_tokens` (or `input_tokens_details` for the Responses API)."""
    usage = _usage(response)
    if usage is None:
        return None
    for name in _DETAILS:
        details = usage.get(name)
        if isinstance(details, dict):
            value = details.get("cached_tokens")
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def _usage(response: Any) -> dict[str, Any] | None:
    if not isinstance(response, dict):
        return None
    usage = response.get("usage")
    if isinstance(usage, dict):
        return usage
    inner = response.get("response")  # Responses API stream events carry the response object
    if isinstance(inner, dict) and isinstance(inner.get("usage"), dict):
        usage = inner["usage"]
        assert isinstance(usage, dict)
        return usage
    return None


def set_cached_tokens(response: Any, value: int) -> bool:
    """Makes the response's usage report `value` cached prompt tokens; False when it has no usage."""
    usage = _usage(response)
    if usage is None:
        return False
    field = "input_tokens_details" if "input_tokens" in usage else "prompt_tokens_details"
    details = usage.get(field)
    if not isinstance(details, dict):
        details = usage[field] = {}
    details["cached_tokens"] = value
    return True


def rewrite_json(body: bytes, value: int) -> bytes:
    """A JSON response body with its cached-token count replaced; unchanged when not JSON or no usage."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not set_cached_tokens(doc, value):
        return body
    return orjson.dumps(doc)


def rewrite_sse_line(line: bytes, value: int) -> bytes:
    """One server-sent-events line (with its line ending) with the usage's cached tokens replaced."""
    stripped = line.rstrip(b"\r\n")
    if not stripped.startswith(b"data:"):
        return line
    data = stripped[5:].strip()
    if not data or data == b"[DONE]":
        return line
    ending = line[len(stripped) :]
    rewritten = rewrite_json(data, value)
    if rewritten is data:
        return line
    return b"data: " + rewritten + ending


class SseRewriter:
    """Rewrites a server-sent-events stream chunk by chunk; a partial line waits for the next chunk."""

    __slots__ = ("_buffer", "_value")

    def __init__(self, value: int) -> None:
        self._value = value
        self._buffer = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._buffer + chunk
        end = data.rfind(b"\n")
        if end < 0:
            self._buffer = data
            return b""
        complete, self._buffer = data[: end + 1], data[end + 1 :]
        return b"".join(rewrite_sse_line(line, self._value) for line in complete.splitlines(keepends=True))

    def flush(self) -> bytes:
        rest, self._buffer = self._buffer, b""
        return rewrite_sse_line(rest, self._value) if rest else b""
