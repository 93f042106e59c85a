"""passthrough-parser

Scheduling intent:
    Route requests whose body the EPP does not interpret (vLLM's `/v1/rerank`, `/v1/score`, `/pooling`,
    `/classify`, `/detokenize`, or any other API): the body is forwarded unchanged, no model is extracted and
    none is rewritten, and the request is scheduled on load signals only (prefix-cache scoring has no prompt
    to match). It claims no path, so configured last it is the fallback for every path no other parser
    claims.

Inputs consumed:
    Nothing of the request body (it is opaque); the response is not read for usage.

Configuration:
    No parameters.
"""

from __future__ import annotations

from collections.abc import Mapping

from llm_epp.framework import ApiKind, Handle, PluginParams, RequestBody, TypedName
from llm_epp.framework.parsing import Claims, ParsedRequest, ResponseReader

TYPE = "passthrough-parser"

_OPAQUE = RequestBody(ApiKind.OPAQUE)


class Params(PluginParams):
    pass


class PassthroughParser:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def claims(self) -> Claims:
        return Claims(paths=(), protocols=())

    def parse_request(self, path: str, headers: Mapping[str, str], body: bytes) -> ParsedRequest:
        return ParsedRequest(_OPAQUE)

    def rewrite_model(self, parsed: ParsedRequest, body: bytes, model: str) -> bytes | None:
        return None

    def response_reader(self, parsed: ParsedRequest, headers: Mapping[str, str]) -> ResponseReader | None:
        return None


def factory(name: str, params: Params, handle: Handle) -> PassthroughParser:
    return PassthroughParser(name)
