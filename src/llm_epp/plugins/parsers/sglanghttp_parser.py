"""sglanghttp-parser

Scheduling intent:
    Read SGLang's native generate API, `POST /generate`, for pre-tokenized prompts: scheduling sees the
    prompt's exact token ids (`RequestBody.token_ids`), so prefix-cache scoring and token counting work on
    them. The body is forwarded exactly as sent: the API carries no model name, so none is extracted or
    rewritten. Configure `openai-parser` next to it to keep the OpenAI paths working on the same route.

    It claims the path suffix `generate` but reads only the path `/generate` itself; any other path ending
    in `generate` that no longer-suffix parser claims (`/regenerate`, `/health_generate`, or
    `/inference/v1/generate` without `vllmhttp-parser`) is a 400 naming the path.

    Body: a JSON object with `input_ids` (required: one prompt, a non-empty list of integers 0..2^32-1;
    a batch of prompts, text-only `text` and `input_embeds` requests are not supported and are refused with
    a 400 that says so), optional `extra_key` (a string: isolates prefix-cache hits, as `cache_salt` does
    elsewhere; a per-prompt list is refused), `stream`, `sampling_params` and any other field, forwarded
    untouched.

Inputs consumed:
    The request path, the JSON request body, and the response's token usage from SGLang's `meta_info`
    (`prompt_tokens`, `completion_tokens`, `cached_tokens`): of a JSON body, or, for Server-Sent Events, of
    the final event (the one whose `meta_info.finish_reason` is set).

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
from llm_epp.plugins.parsers.openai_parser import JsonUsageReader
from llm_epp.plugins.parsers.sse import SseDataReader, non_negative_int
from llm_epp.plugins.parsers.tokens import bad_request, json_object, token_ids

TYPE = "sglanghttp-parser"
GENERATE_PATH = "generate"
_META = b'"meta_info"'


class Params(PluginParams):
    pass


def parse_generate(body: bytes) -> ParsedRequest:
    """A /generate body. Raises EppError(BadRequest) saying what is wrong."""
    payload = json_object(body, "/generate request")
    ids = payload.get("input_ids")
    if ids is None:
        hint = (
            " (text prompts are not supported: tokenize the prompt and send 'input_ids')"
            if payload.get("text") is not None or payload.get("input_embeds") is not None
            else ""
        )
        raise bad_request(f"/generate expects 'input_ids': the prompt's token ids{hint}")
    if isinstance(ids, list) and ids and isinstance(ids[0], list):
        raise bad_request("/generate: a batch of prompts in 'input_ids' is not supported; send one prompt per request")
    salt = payload.get("extra_key")
    if salt is not None and not isinstance(salt, str):
        raise bad_request("/generate: 'extra_key' must be a string (a per-prompt list is not supported)")
    parsed = RequestBody(
        api=ApiKind.GENERATE,
        payload=payload,
        stream=payload.get("stream") is True,
        cache_salt=salt or "",
        token_ids=token_ids(ids, "input_ids"),
    )
    return ParsedRequest(parsed)


def usage_from_meta(obj: Any) -> Usage | None:
    """Usage from a decoded /generate answer's `meta_info`; None when it reports no token counts."""
    meta = obj.get("meta_info") if isinstance(obj, dict) else None
    if not isinstance(meta, dict) or (meta.get("prompt_tokens") is None and meta.get("completion_tokens") is None):
        return None
    p, c = non_negative_int(meta.get("prompt_tokens")), non_negative_int(meta.get("completion_tokens"))
    return Usage(p, c, p + c, non_negative_int(meta.get("cached_tokens")))


def usage_from_meta_json(body: bytes) -> Usage | None:
    """Usage of a /generate JSON answer, or None."""
    if _META not in body:
        return None
    try:
        return usage_from_meta(orjson.loads(body))
    except orjson.JSONDecodeError:
        return None


class SseMetaUsageReader(SseDataReader):
    """Usage of a streamed /generate answer: the `meta_info` of the event whose `finish_reason` is set."""

    __slots__ = ()
    marker = _META

    def take(self, payload: bytes) -> None:
        if self._usage is not None:
            return
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        meta = obj.get("meta_info") if isinstance(obj, dict) else None
        if isinstance(meta, dict) and meta.get("finish_reason") is not None:
            self._usage = usage_from_meta(obj)


class SglanghttpParser:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def claims(self) -> Claims:
        return Claims(paths=(GENERATE_PATH,), protocols=("kubernetes.io/h2c", "http"))

    def parse_request(self, path: str, headers: Mapping[str, str], body: bytes) -> ParsedRequest:
        if path.strip().removesuffix("/").removeprefix("/") != GENERATE_PATH:
            raise bad_request(f"sglanghttp-parser reads only /{GENERATE_PATH}, not {path!r}")
        return parse_generate(body)

    def rewrite_model(self, parsed: ParsedRequest, body: bytes, model: str) -> bytes | None:
        return None  # the API carries no model name

    def response_reader(self, parsed: ParsedRequest, headers: Mapping[str, str]) -> ResponseReader | None:
        if "text/event-stream" in headers.get("content-type", "").lower():
            return SseMetaUsageReader()
        return JsonUsageReader(decode=usage_from_meta_json)


def factory(name: str, params: Params, handle: Handle) -> SglanghttpParser:
    return SglanghttpParser(name)
