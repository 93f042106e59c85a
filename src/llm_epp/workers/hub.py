"""The serving process's end of the worker connections: every Director call a front makes runs here, on
the one Director, so all fronts share one scheduling state.

Messages from a front (first item):
- `r` (rid, request_id, headers, body, subset, id_generated, trace): route; answered with `d` or `x`. `trace` is
  None when the front does not trace, else (recording, the front's trace context headers): the request's span
  is the front's; the serving process times the Director's phases and sends them back with the decision.
- `h` (rid, status, served_endpoint, streaming, headers, reply): response headers; answered with `h` when
  `reply`.
- `f` (rid, complete, status, usage, response_bytes, reply): finish; answered with `f` when `reply`.
- `c` (rid): the stream ended before its route was answered (cancel it, or end it if it was routed).
- `e` (model, target, code): an error the front answered itself (413, 503 on held bytes), for metrics.
- `p` (index, port): the front listens on `port`.
Answers: `d` (rid, decision fields, what the trace recorded or None), `x` (rid, code, message, dropped
reason), `h` (rid, headers, reader), `f` (rid, metadata); pushed: `H` (health fields) whenever they change."""

from __future__ import annotations

import asyncio
import logging
import pickle
from collections.abc import Callable, Mapping
from typing import Any

from llm_epp.framework import EppError, ErrorCode
from llm_epp.framework.tracing import CURRENT_TRACE, AttributeValue
from llm_epp.observability import HealthState
from llm_epp.requestcontrol.decision import Outcome, RequestDropped, RequestInput, ResponseSeen, RoutingDecision
from llm_epp.requestcontrol.director import Director
from llm_epp.requestcontrol.lifecycle import RequestHandle
from llm_epp.workers.wire import FrameConnection

log = logging.getLogger(__name__)

HEALTH_POLL_S = 0.1


def health_fields(health: HealthState) -> tuple[bool, bool, bool, bool]:
    return (health.synced, health.leader_election, health.is_leader, health.draining)


class _Front:
    """One front's connection: its routes in progress and its routed requests."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.conn = FrameConnection(self.on_message, self.on_lost, token=hub.token)
        self.routing: dict[int, asyncio.Task[None]] = {}
        self.handles: dict[int, RequestHandle] = {}
        self.index = -1
        self.port = 0
        self.reader_warned = False

    def on_message(self, m: tuple[Any, ...]) -> None:
        kind = m[0]
        director = self.hub.director
        if kind == "r":
            rid = m[1]
            inp = RequestInput(m[2], m[3], m[4], m[5], m[6])
            self.routing[rid] = asyncio.get_running_loop().create_task(self._route(rid, inp, m[7]))
        elif kind == "h":
            rid = m[1]
            handle = self.handles.get(rid)
            if handle is None:
                if m[6]:
                    self.conn.send(("h", rid, {}, None))
                return
            plan = director.response_received(handle, ResponseSeen(m[2], m[3], m[4], m[5]))
            if m[6]:
                self.conn.send(("h", rid, dict(plan.headers), self._reader(plan.reader)))
        elif kind == "f":
            rid = m[1]
            handle = self.handles.pop(rid, None)
            metadata: Any = {}
            if handle is not None:
                metadata = self._finish(rid, handle, Outcome(m[2], m[3], m[4], m[5]))
            if m[6]:
                self.conn.send(("f", rid, {ns: dict(v) for ns, v in metadata.items()}))
        elif kind == "c":
            rid = m[1]
            pending = self.routing.pop(rid, None)
            if pending is not None:
                pending.cancel()
            handle = self.handles.pop(rid, None)
            if handle is not None:
                self._finish(rid, handle, Outcome(complete=False))
        elif kind == "e":
            director.recorder.request_error(m[1], m[2], m[3])
        elif kind == "p":
            self.index, self.port = m[1], m[2]
            self.hub.front_ready(self)
        else:
            log.error("worker_message_unknown kind=%r", kind)

    def _finish(self, rid: int, handle: RequestHandle, outcome: Outcome) -> Mapping[str, Mapping[str, object]]:
        return self.hub.director.finish(handle, outcome)

    def _reader(self, reader: Any) -> Any:
        """The response reader travels pickled; one that cannot be pickled is not read (logged once)."""
        if reader is None:
            return None
        try:
            pickle.dumps(reader)
        except Exception as e:
            if not self.reader_warned:
                self.reader_warned = True
                log.warning(
                    "response_reader_not_picklable type=%s: usage is not read with --workers: %s", type(reader), e
                )
            return None
        return reader

    async def _route(self, rid: int, inp: RequestInput, relay: tuple[bool, dict[str, str]] | None) -> None:
        director = self.hub.director
        trace = None
        if relay is not None and director.tracer.enabled:  # the front's span; the phases are timed here
            trace = RelayedTrace(*relay)
            CURRENT_TRACE.set(trace)  # this task's own context
        try:
            decision = await director.route(inp)
        except asyncio.CancelledError:
            self.routing.pop(rid, None)
            raise
        except EppError as e:
            self.routing.pop(rid, None)
            reason = e.reason if isinstance(e, RequestDropped) else ""
            self.conn.send(("x", rid, e.code.value, e.message, reason))
            return
        except Exception as e:
            self.routing.pop(rid, None)
            log.exception("route_failed request_id=%s", inp.request_id)
            self.conn.send(("x", rid, ErrorCode.INTERNAL.value, f"internal error: {e}", ""))
            return
        self.routing.pop(rid, None)
        if self.conn.closed:  # the front went away while this request waited
            self._finish(rid, decision.handle, Outcome(complete=False))
            return
        self.handles[rid] = decision.handle
        recorded = trace.relayed() if trace is not None else None
        self.conn.send(("d", rid, *decision_fields(decision, self.hub.with_scores), recorded))

    def on_lost(self) -> None:
        """The front is gone: its queued routes are cancelled and its routed requests end incomplete, so
        their in-flight load is released at once."""
        for task in self.routing.values():
            task.cancel()
        self.routing.clear()
        for rid, handle in self.handles.items():
            self._finish(rid, handle, Outcome(complete=False))
        self.handles.clear()
        self.hub.front_lost(self)


class RelayedTrace:
    """The serving process's stand-in for a front's request trace: the trace context the front sent goes into
    the upstream headers; what the Director and the plugins record (phases, events, attributes) is kept for the
    front, which puts it on its request span (`relayed()`). Sampled-out requests (`recording` False) keep
    nothing."""

    __slots__ = ("_attributes", "_context", "_events", "_phases", "recording")

    def __init__(self, recording: bool, context: dict[str, str]) -> None:
        self.recording = recording
        self._context = context
        self._phases: list[tuple[str, int, int, dict[str, AttributeValue] | None]] = []
        self._events: list[tuple[str, dict[str, AttributeValue] | None]] = []
        self._attributes: dict[str, AttributeValue] = {}

    def phase(
        self, name: str, start_ns: int, end_ns: int, attributes: Mapping[str, AttributeValue] | None = None
    ) -> None:
        if self.recording:
            self._phases.append((name, start_ns, end_ns, dict(attributes) if attributes else None))

    def event(self, name: str, attributes: Mapping[str, AttributeValue] | None = None) -> None:
        if self.recording:
            self._events.append((name, dict(attributes) if attributes else None))

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        if self.recording:
            self._attributes.update(attributes)

    def inject(self, headers: dict[str, str]) -> None:
        headers.update(self._context)

    def end(self, status: int = 0, error: str = "") -> None:
        pass  # the front ends its own span

    def relayed(self) -> tuple[list[Any], list[Any], dict[str, AttributeValue]] | None:
        """What goes back to the front with the decision: (phases, events, attributes), or None."""
        if not self.recording or not (self._phases or self._events or self._attributes):
            return None
        return self._phases, self._events, self._attributes


def decision_fields(d: RoutingDecision, with_scores: bool) -> tuple[Any, ...]:
    """What a front needs of a decision to answer Envoy (and, with `with_scores`, to explain it)."""
    req = d.request
    ep = d.endpoint.metadata
    endpoint = (ep.key.namespace, ep.key.name, ep.address, ep.port)
    scores: Any = None
    if with_scores and d.result is not None and d.result.primary is not None:
        primary = d.result.primary
        scores = (
            d.result.primary_profile_name,
            {(k.namespace, k.name): dict(v) for k, v in primary.scores.items()},
            [
                (c.metadata.key.namespace, c.metadata.key.name, c.metadata.address, c.metadata.port)
                for c in d.candidates
            ],
        )
    return (
        d.destination,
        d.body,
        dict(d.upstream_headers),
        req.incoming_model,
        req.target_model,
        endpoint,
        d.result is not None,
        scores,
    )


class Hub:
    """Listens on a Unix socket for the fronts. `on_ready(index, port)` and `on_lost(index)` tell the pool."""

    def __init__(
        self,
        director: Director,
        health: HealthState,
        token: bytes,
        *,
        with_scores: bool,
        on_ready: Callable[[int, int], None],
        on_lost: Callable[[int], None],
    ) -> None:
        self.director = director
        self.health = health
        self.token = token
        self.with_scores = with_scores
        self._on_ready = on_ready
        self._on_lost = on_lost
        self.fronts: set[_Front] = set()
        self._server: asyncio.AbstractServer | None = None
        self._health_task: asyncio.Task[None] | None = None
        self._health_sent: tuple[bool, ...] = ()

    async def start(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self._accept, path)
        self._health_task = loop.create_task(self._push_health())

    def _accept(self) -> FrameConnection:
        front = _Front(self)
        self.fronts.add(front)
        return front.conn

    def front_ready(self, front: _Front) -> None:
        front.conn.send(("H", *health_fields(self.health)))
        self._on_ready(front.index, front.port)

    def front_lost(self, front: _Front) -> None:
        self.fronts.discard(front)
        if front.index >= 0:
            self._on_lost(front.index)

    async def _push_health(self) -> None:
        """Mirrors the health state to the fronts (for `--health-checking` on their ports)."""
        while True:
            fields = health_fields(self.health)
            if fields != self._health_sent:
                self._health_sent = fields
                for front in self.fronts:
                    if front.index >= 0:
                        front.conn.send(("H", *fields))
            await asyncio.sleep(HEALTH_POLL_S)

    async def stop(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
        if self._server is not None:
            self._server.close()
        for front in list(self.fronts):
            front.conn.close()
