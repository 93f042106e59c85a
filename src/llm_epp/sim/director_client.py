"""The simulator's side of the director: the calls a gateway makes for one request, and nothing else.

Every call the simulator makes into :class:`~llm_epp.requestcontrol.director.Director` is in this module:
routing a request (admission, candidates, PrepareData, scheduling, PreRequest), the response starting
(ResponseReceived hooks) and the request ending (release of the in-flight reservation, ResponseComplete
hooks).  A change of the director's API is a change here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from llm_epp.framework import Endpoint, EppError
from llm_epp.framework.parsing import ResponseReader
from llm_epp.framework.requestcontrol import Usage
from llm_epp.requestcontrol.decision import Outcome, RequestInput, ResponseSeen
from llm_epp.requestcontrol.director import Director
from llm_epp.requestcontrol.lifecycle import RequestHandle

__all__ = ["DirectorClient", "Refused", "Routed"]


class Refused(Exception):
    """The director answered the request itself (shed, no candidate, bad request): `status` is the HTTP
    status the client would get."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class Routed:
    """A request the director placed: where it goes, and what the director needs to see it end."""

    endpoint: Endpoint
    _handle: RequestHandle
    upstream_headers: Mapping[str, str] = field(default_factory=dict)
    """Headers the EPP sets on the upstream request (``x-prefiller-host-port`` for a split request)."""
    eviction: asyncio.Future[None] | None = None
    """Resolved when flow control evicts the request (``enableEviction``); None: it cannot be evicted."""
    reader: ResponseReader | None = None
    """What the director reads the response body with, once the response has started (None: nothing)."""


_EVENT_STREAM = MappingProxyType({"content-type": "text/event-stream"})
_FIRST_EVENT = b'data: {"object":"text_completion","choices":[{"index":0,"text":" t0"}]}\n\n'


class DirectorClient:
    def __init__(self, director: Director) -> None:
        self._director = director

    async def route(
        self, request_id: str, headers: Mapping[str, str], body: bytes, subset: Sequence[str] | None
    ) -> Routed:
        """Runs the director's request path; raises :class:`Refused` with the status it answered."""
        try:
            decision = await self._director.route(RequestInput(request_id, dict(headers), body, subset))
        except EppError as e:
            raise Refused(e.code.http_status, e.message) from None
        handle = decision.handle
        return Routed(decision.endpoint, handle, dict(decision.upstream_headers), handle.eviction)

    def response_started(self, routed: Routed, status: int = 200) -> None:
        """The model server's response headers arrived (a streamed response, Server-Sent Events)."""
        seen = ResponseSeen(
            status=status, served_endpoint=routed.endpoint.hostport, streaming=True, headers=_EVENT_STREAM
        )
        routed.reader = self._director.response_received(routed._handle, seen).reader

    def first_body(self, routed: Routed) -> None:
        """The response's first body bytes reached the EPP (it reads response bodies): its first token."""
        if routed.reader is not None:
            routed.reader.feed(_FIRST_EVENT, False)

    def finish(self, routed: Routed, status: int, usage: Usage | None = None, *, complete: bool = True) -> None:
        """The response ended with `status` (`complete` False: cut short, e.g. evicted): releases the
        reservation and runs the completion hooks, exactly once."""
        self._director.finish(routed._handle, Outcome(complete=complete, status=status, usage=usage))
