"""vllmhttp-parser

Scheduling intent:
    Read vLLM's token-in generate API, `POST /inference/v1/generate`, which is not part of the
    OpenAI-compatible surface: the client sends the prompt already tokenized, so scheduling sees the exact
    token ids (`RequestBody.token_ids`) rather than text. Prefix-cache scoring and token counting work on
    those ids; `model`, when present, is extracted and rewritten in the forwarded body like an OpenAI body.
    It claims that one path only: configure `openai-parser` next to it to keep the OpenAI paths working on
    the same route.

    Body: a JSON object with `token_ids` (required: a non-empty list of integers 0..2^32-1; whole numbers
    written as floats such as `7.0` are accepted), and optional `model`, `stream` (true streams the
    answer), `cache_salt` (isolates prefix-cache hits), `sampling_params`, `features` (multimodal hashes and
    placeholders) and any other field, forwarded untouched. A missing or empty `token_ids`, an entry that is
    not a token id, or a body that is not a JSON object is a 400 that names the problem.

Inputs consumed:
    The request path (`:path`, `x-original-path`, `x-forwarded-path`), the JSON request body, and the
    response's token usage, read as `openai-parser` reads it (a JSON body's `usage`, or the `usage` of
    Server-Sent Events).

Configuration:
    No parameters.
"""

from __future__ import annotations

from collections.abc import Mapping

from llm_epp.framework import ApiKind, Handle, PluginParams, RequestBody, TypedName
from llm_epp.framework.parsing import Claims, ParsedRequest, ResponseReader
from llm_epp.plugins.parsers import openai_parser
from llm_epp.plugins.parsers.tokens import bad_request, json_object, token_ids

TYPE = "vllmhttp-parser"
GENERATE_PATH = "inference/v1/generate"


class Params(PluginParams):
    pass


def parse_generate(body: bytes) -> ParsedRequest:
    """A /inference/v1/generate body. Raises EppError(BadRequest) saying what is wrong."""
    payload = json_object(body, "/inference/v1/generate request")
    if payload.get("token_ids") is None:
        raise bad_request("/inference/v1/generate expects 'token_ids': the prompt's token ids (a non-empty list)")
    ids = token_ids(payload["token_ids"], "token_ids", whole_floats=True)
    model = payload.get("model")
    salt = payload.get("cache_salt")
    parsed = RequestBody(
        api=ApiKind.GENERATE,
        payload=payload,
        stream=payload.get("stream") is True,
        cache_salt=salt if isinstance(salt, str) else "",
        token_ids=ids,
    )
    return ParsedRequest(parsed, model if isinstance(model, str) else "")


class VllmhttpParser:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def claims(self) -> Claims:
        return Claims(paths=(GENERATE_PATH,), protocols=("kubernetes.io/h2c", "http"))

    def parse_request(self, path: str, headers: Mapping[str, str], body: bytes) -> ParsedRequest:
        if not path.strip().removesuffix("/").endswith(GENERATE_PATH):
            raise bad_request(f"vllmhttp-parser reads only /{GENERATE_PATH}, not {path!r}")
        return parse_generate(body)

    def rewrite_model(self, parsed: ParsedRequest, body: bytes, model: str) -> bytes | None:
        return openai_parser.rewrite_model(parsed.body.payload, model)

    def response_reader(self, parsed: ParsedRequest, headers: Mapping[str, str]) -> ResponseReader | None:
        if "text/event-stream" in headers.get("content-type", "").lower():
            return openai_parser.SseUsageReader()
        return openai_parser.JsonUsageReader()


def factory(name: str, params: Params, handle: Handle) -> VllmhttpParser:
    return VllmhttpParser(name)
