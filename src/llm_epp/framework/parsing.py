"""Request parsing extension point (the reference's `requestHandler.parsers`).

A parser turns a request's bytes into what scheduling reads (`RequestBody`, the model name) and reads
usage back out of the response. The director resolves one parser per request by the request path: each
parser claims path suffixes, the longest matching suffix wins, and a parser that claims no path is the
fallback for every unclaimed path (as upstream's ParserRegistry does).

Contracts:
- `parse_request` is synchronous and pure; it raises `EppError(ErrorCode.BAD_REQUEST, ...)` with a message
  that says what was wrong for a malformed body. It never mutates `body`.
- `rewrite_model` returns the body to forward with the model replaced, or None when the protocol cannot carry
  a model name (opaque bodies): the body is then forwarded unchanged.
- `response_reader` returns a fresh, stateful reader for one response (or None: usage is not read); the
  adapter feeds it every response body chunk in order, then reads `usage`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from llm_epp.framework.plugin import TypedName
from llm_epp.framework.records import record
from llm_epp.framework.requestcontrol import Usage
from llm_epp.framework.types import RequestBody


@dataclass(frozen=True, slots=True)
class Claims:
    """What a parser handles. `paths`: path suffixes such as `chat/completions` (leading and trailing slashes
    are ignored); empty means the parser is the fallback for any path no other parser claims. `protocols`:
    InferencePool appProtocols it supports (`http`, `kubernetes.io/h2c`)."""

    paths: tuple[str, ...] = ()
    protocols: tuple[str, ...] = ("http",)


@record
class ParsedRequest:
    """A parsed request. `model` is "" when the request names none. `skip_response_processing`: route the
    request, but do not read its response (no usage; completion is learnt when the stream ends)."""

    body: RequestBody
    model: str = ""
    skip_response_processing: bool = False


class ResponseReader(Protocol):
    """Reads one response. `feed` is called with every body chunk in order (`end_of_stream` on the last)."""

    def feed(self, chunk: bytes, end_of_stream: bool) -> None: ...

    @property
    def usage(self) -> Usage | None: ...


@runtime_checkable
class Parser(Protocol):
    @property
    def typed_name(self) -> TypedName: ...

    def claims(self) -> Claims: ...

    def parse_request(self, path: str, headers: Mapping[str, str], body: bytes) -> ParsedRequest: ...

    def rewrite_model(self, parsed: ParsedRequest, body: bytes, model: str) -> bytes | None: ...

    def response_reader(self, parsed: ParsedRequest, headers: Mapping[str, str]) -> ResponseReader | None: ...
