"""The fronts' end: `RemoteDirector` offers the part of the Director's interface the ext_proc servicer
uses and forwards each call to the serving process; `WorkerServicer` is the usual servicer over it, with
the response-side calls awaited (they cross a process boundary)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from llm_epp.extproc.servicer import FDS, ExtProcServicer
from llm_epp.framework import Endpoint, EndpointKey, EppError, ErrorCode, InferenceRequest
from llm_epp.framework.tracing import CURRENT_TRACE, NULL_TRACER, RequestTrace, Tracer
from llm_epp.framework.types import ApiKind, EndpointMetadata, ProfileResult, RequestBody, SchedulingResult
from llm_epp.observability import HealthState
from llm_epp.requestcontrol.decision import (
    NOTHING_TO_ADD,
    Outcome,
    RequestDropped,
    RequestInput,
    ResponsePlan,
    ResponseSeen,
    RoutingDecision,
)
from llm_epp.requestcontrol.director import Director
from llm_epp.requestcontrol.lifecycle import RequestHandle
from llm_epp.workers.wire import FrameConnection

_NO_BODY = RequestBody(ApiKind.NONE)
_CODES = {c.value: c for c in ErrorCode}


@dataclass(slots=True, eq=False)
class RemoteHandle(RequestHandle):
    """The front's handle of a request the serving process routed: `rid` names it on the connection;
    `wants_reader`: the response body comes through the EPP, so its usage reader is wanted."""

    rid: int = 0
    wants_reader: bool = False


class SchedulerGone(Exception):
    """The serving process closed the connection."""


class _ForwardingRecorder:
    """The one recorder call the servicer makes itself (errors it answers without the director)."""

    def __init__(self, remote: RemoteDirector) -> None:
        self._remote = remote

    def request_error(self, model: str, target: str, code: str) -> None:
        self._remote.conn.send_later(("e", model, target, code))


class RemoteDirector:
    """Forwards Director calls over `conn` and matches the answers to the waiting calls by id. `health`
    mirrors the serving process's health state (pushed as `H` messages)."""

    def __init__(self, health: HealthState, tracer: Tracer = NULL_TRACER) -> None:
        self.conn = FrameConnection(self._on_message, self._on_lost)
        self.health = health
        self.recorder = _ForwardingRecorder(self)
        self.tracer = tracer  # this front's: the request's span is made and exported here
        self.lost = asyncio.Event()
        self.on_stop: Callable[[float | None], None] | None = None  # the serving process says stop
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[tuple[Any, ...]]] = {}

    # --- the Director's interface -------------------------------------------------------------------
    async def route(self, inp: RequestInput, dry_run: bool = False) -> RoutingDecision:
        if dry_run:
            raise ValueError("dry_run is not offered by worker processes")
        rid = next(self._ids)
        body = inp.body
        trace = CURRENT_TRACE.get() if self.tracer.enabled else None
        relay: tuple[bool, dict[str, str]] | None = None
        if trace is not None:  # the serving process passes this context on and times the phases for this span
            context: dict[str, str] = {}
            trace.inject(context)
            relay = (getattr(trace, "recording", True), context)
        answer = await self._call(
            ("r", rid, inp.request_id, dict(inp.headers), body, inp.subset, inp.request_id_generated, relay),
            rid,
            cancel=True,
        )
        if answer[0] == "x":
            _, _, code, message, reason = answer
            err_code = _CODES.get(code, ErrorCode.INTERNAL)
            if reason:
                raise RequestDropped(err_code, message, reason)
            raise EppError(err_code, message)
        _, _, destination, body_out, upstream, incoming, target, ep, scheduled, scores, recorded = answer
        if recorded is not None and trace is not None:
            _replay(trace, *recorded)
        endpoint = _endpoint(ep)
        request = InferenceRequest(inp.request_id, incoming, target, _NO_BODY, headers=inp.headers)
        handle = RemoteHandle(inp.request_id, 0.0, request=request, endpoint=endpoint, scheduled=scheduled, rid=rid)
        result: SchedulingResult | None = None
        candidates: tuple[Endpoint, ...] = ()
        if scores is not None:
            profile, by_key, cands = scores
            candidates = tuple(_endpoint(c) for c in cands)
            primary = ProfileResult((endpoint,), {EndpointKey(ns, name): parts for (ns, name), parts in by_key.items()})
            result = SchedulingResult({profile: primary}, profile)
        return RoutingDecision(
            request=request,
            result=result,
            endpoint=endpoint,
            destination=destination,
            handle=handle,
            body=body_out,
            upstream_headers=upstream,
            candidates=candidates,
        )

    async def response_received_async(
        self, handle: RequestHandle, seen: ResponseSeen, *, hooks: bool = True
    ) -> ResponsePlan:
        """`hooks`: ResponseReceived plugins may add headers. Without them, and without a reader wanted, the
        serving process is told without waiting for its (empty) answer."""
        if not isinstance(handle, RemoteHandle) or not handle.scheduled:
            return ResponsePlan()
        rid = handle.rid
        message = ("h", rid, seen.status, seen.served_endpoint, seen.streaming, dict(seen.headers))
        if not hooks and not handle.wants_reader:
            self.conn.send_later((*message, False))
            return ResponsePlan()
        answer = await self._call((*message, True), rid)
        return ResponsePlan(answer[2], answer[3])

    def finish(self, handle: RequestHandle, outcome: Outcome) -> Mapping[str, Mapping[str, object]]:
        """Ends the request without waiting for the response metadata."""
        if handle.finished:
            return NOTHING_TO_ADD
        handle.finished = True
        if isinstance(handle, RemoteHandle):
            self.conn.send_later(_finish_message(handle.rid, outcome, False))
        return NOTHING_TO_ADD

    async def finish_async(self, handle: RequestHandle, outcome: Outcome) -> Mapping[str, Mapping[str, object]]:
        """Ends the request and waits for the metadata the ResponseComplete hooks produce."""
        if handle.finished or not isinstance(handle, RemoteHandle):
            return self.finish(handle, outcome)
        handle.finished = True
        if not handle.scheduled:
            self.conn.send_later(_finish_message(handle.rid, outcome, False))
            return NOTHING_TO_ADD
        answer = await self._call(_finish_message(handle.rid, outcome, True), handle.rid)
        metadata: Mapping[str, Mapping[str, object]] = answer[2]
        return metadata

    # --- plumbing -----------------------------------------------------------------------------------
    async def _call(self, message: tuple[Any, ...], rid: int, cancel: bool = False) -> tuple[Any, ...]:
        if self.conn.closed:
            raise EppError(ErrorCode.SERVICE_UNAVAILABLE, "the endpoint picker is restarting: retry")
        fut: asyncio.Future[tuple[Any, ...]] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        self.conn.send(message)
        try:
            return await fut
        except asyncio.CancelledError:
            if cancel and not self.conn.closed:
                self.conn.send(("c", rid))
            raise
        finally:
            self._waiting.pop(rid, None)

    def _on_message(self, m: tuple[Any, ...]) -> None:
        kind = m[0]
        if kind == "S":
            if self.on_stop is not None:
                self.on_stop(m[1])
            return
        if kind == "H":
            h = self.health
            h.synced, h.leader_election, h.is_leader, h.draining = m[1], m[2], m[3], m[4]
            return
        fut = self._waiting.pop(m[1], None)
        if fut is not None and not fut.done():  # a cancelled stream's answer arrives for nobody
            fut.set_result(m)

    def _on_lost(self) -> None:
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(EppError(ErrorCode.SERVICE_UNAVAILABLE, "the endpoint picker is restarting: retry"))
        self._waiting.clear()
        self.lost.set()


def _replay(
    trace: RequestTrace,
    phases: list[tuple[str, int, int, Any]],
    events: list[tuple[str, Any]],
    attributes: dict[str, Any],
) -> None:
    """What the serving process recorded for this request (`hub.RelayedTrace.relayed`), onto the front's trace."""
    for name, start_ns, end_ns, attrs in phases:
        trace.phase(name, start_ns, end_ns, attrs)
    for name, attrs in events:
        trace.event(name, attrs)
    if attributes:
        trace.set_attributes(attributes)


def _finish_message(rid: int, outcome: Outcome, reply: bool) -> tuple[Any, ...]:
    return ("f", rid, outcome.complete, outcome.status, outcome.usage, outcome.response_bytes, reply)


def _endpoint(fields: tuple[str, str, str, int]) -> Endpoint:
    namespace, name, address, port = fields
    return Endpoint(EndpointMetadata(EndpointKey(namespace, name), address, port))


class WorkerServicer(ExtProcServicer):
    """The ext_proc servicer of a front process. `finish_metadata`: ResponseComplete plugins may add
    response metadata, so the end of a response waits for the serving process's answer (else the end is
    sent without waiting). `response_hooks`: ResponseReceived plugins may add response headers, so the
    response headers wait for the serving process's answer (they also do when a usage reader is wanted)."""

    def __init__(self, remote: RemoteDirector, *, finish_metadata: bool, response_hooks: bool, **kwargs: Any) -> None:
        # RemoteDirector offers what the servicer calls of a Director: route, finish, recorder, tracer.
        super().__init__(cast(Director, remote), tracer=remote.tracer, **kwargs)
        self.remote = remote
        self.finish_metadata = finish_metadata
        self.response_hooks = response_hooks

    async def _on_response_headers(self, st: Any, req: Any) -> bytes:
        handle = st.handle
        if isinstance(handle, RemoteHandle):
            handle.wants_reader = st.resp_mode == FDS  # the servicer reads usage only from streamed bodies
        return await super()._on_response_headers(st, req)

    async def _response_plan(self, handle: RequestHandle, seen: ResponseSeen) -> ResponsePlan:
        return await self.remote.response_received_async(handle, seen, hooks=self.response_hooks)

    async def _end(self, handle: RequestHandle, outcome: Outcome) -> Mapping[str, Mapping[str, object]]:
        if self.finish_metadata:
            return await self.remote.finish_async(handle, outcome)
        return self.remote.finish(handle, outcome)
