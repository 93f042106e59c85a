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

from llm_epp.framework import Endpoint, EppError
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
        """The model server's response headers arrived (a streamed response: at its first token)."""
        self._director.response_received(
            routed._handle, ResponseSeen(status=status, served_endpoint=routed.endpoint.hostport, streaming=True)
        )

    def finish(self, routed: Routed, status: int, usage: Usage | None = None, *, complete: bool = True) -> None:
        """The response ended with `status` (`complete` False: cut short, e.g. evicted): releases the
        reservation and runs the completion hooks, exactly once."""
        self._director.finish(routed._handle, Outcome(complete=complete, status=status, usage=usage))
