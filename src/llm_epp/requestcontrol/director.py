"""The director: parse -> objective -> candidates -> prepare-data -> admission -> schedule -> pre-request,
and on the way back the response hooks, run exactly once per request. Protocol-free: an adapter (ext_proc,
the Pick API, the simulator) turns what it received into a `RequestInput`, gets a `RoutingDecision` back
(or an EppError to answer the client with), and reports the response as values.

Order of calls for one request:

1. `decision = await director.route(RequestInput(...), dry_run=False)`; an EppError means "answer the
   client with it" (nothing is reserved, `finish` is not needed).
2. Optionally `plan = director.response_received(decision.handle, ResponseSeen(...))` when the response
   headers arrive: `plan.headers` go to the client, `plan.reader` (if any) is fed the response body.
3. `metadata = director.finish(decision.handle, Outcome(...))` exactly once when the request ends (more
   calls do nothing); it releases in-flight load, runs ResponseComplete hooks and records metrics, and
   returns the response dynamic metadata plugins asked for (RESPONSE_METADATA_KEY).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from llm_epp.flowcontrol import FlowController, Ticket
from llm_epp.flowcontrol.controller import FlowControlRejected
from llm_epp.framework import (
    CycleState,
    Endpoint,
    EppError,
    ErrorCode,
    InferenceRequest,
    Recorder,
    TypedName,
)
from llm_epp.framework.flowcontrol import SaturationDetector
from llm_epp.framework.flowpolicy import EvictionItem
from llm_epp.framework.parsing import Parser, ResponseReader
from llm_epp.framework.requestcontrol import (
    REQUEST_HEADERS_KEY,
    RESPONSE_HEADERS_KEY,
    RESPONSE_METADATA_KEY,
    Admission,
    PrepareData,
    PreRequest,
    ResponseComplete,
    ResponseFirstBody,
    ResponseInfo,
    ResponseReceived,
    Screener,
    Usage,
)
from llm_epp.framework.tracing import CURRENT_TRACE, NULL_TRACER, RequestTrace, Tracer
from llm_epp.framework.types import ApiKind, RequestBody
from llm_epp.requestcontrol.decision import (
    DROPPED_NO_ENDPOINTS,
    DROPPED_SATURATED,
    NOTHING_TO_ADD,
    Outcome,
    RequestDropped,
    RequestInput,
    ResponsePlan,
    ResponseSeen,
    RoutingDecision,
)
from llm_epp.requestcontrol.lifecycle import RequestHandle
from llm_epp.requestcontrol.parsers import ParserTable, request_path
from llm_epp.requestcontrol.transfer_fields import strip_transfer_fields
from llm_epp.scheduling import Scheduler, SchedulingFailedError

log = logging.getLogger(__name__)

# Control headers: llm-d-router's names first, GIE's `x-gateway-*` names as aliases.
OBJECTIVE_HEADERS = ("x-llm-d-inference-objective", "x-gateway-inference-objective")
FAIRNESS_HEADERS = ("x-llm-d-inference-fairness-id", "x-gateway-inference-fairness-id")
MODEL_REWRITE_HEADERS = ("x-llm-d-model-name-rewrite", "x-gateway-model-name-rewrite")
DEFAULT_FAIRNESS_ID = "default-flow"
PREPARE_DATA_TIMEOUT_S = 0.4


def header_value(headers: Mapping[str, str], names: Sequence[str]) -> str | None:
    """The value of the first of `names` present (current name, then deprecated aliases), or None."""
    for name in names:
        value = headers.get(name)
        if value is not None:
            return value
    return None


@dataclass
class RequestPlugins:
    screeners: Sequence[Screener] = ()
    prepare_data: Sequence[PrepareData] = ()
    admission: Sequence[Admission] = ()
    pre_request: Sequence[PreRequest] = ()
    response_received: Sequence[ResponseReceived] = ()
    response_first_body: Sequence[ResponseFirstBody] = ()
    response_complete: Sequence[ResponseComplete] = ()


class Objectives(Protocol):
    """InferenceObjectives (priority by objective name) and InferenceModelRewrite rules, from Kubernetes
    or a static file."""

    def priority(self, objective: str) -> int | None: ...

    def rewrite(self, model: str) -> tuple[str, str] | None:
        """(target model, rule name) when a rewrite rule matches `model`, else None."""
        ...


class NoObjectives:
    def priority(self, objective: str) -> int | None:
        return None

    def rewrite(self, model: str) -> tuple[str, str] | None:
        return None


@dataclass
class DirectorOptions:
    disable_subset_filter: bool = False
    objectives: Objectives = field(default_factory=NoObjectives)


def estimate_tokens(body_bytes: int) -> int:
    """The reference's in-flight token estimate: input = max(bytes / 4, 1) plus 1.5x that for output."""
    prompt = max(body_bytes // 4, 1)
    return prompt + int(prompt * 1.5 + 0.5)  # Go's math.Round: halves away from zero


def filter_by_list(endpoints: Sequence[Endpoint], entries: Sequence[str]) -> list[Endpoint]:
    """Endpoints named in `entries` (each a comma list of `ip:port` or a bare `ip`, which names every port of
    that address), in pool order. Linear in endpoints + entries: one set of `ip:port`s, one of addresses."""
    hostports: set[str] = set()
    addresses: set[str] = set()
    for item in entries:
        for entry in item.split(","):
            entry = entry.strip()
            if not entry:
                continue
            if entry.startswith("["):  # [v6]:port or [v6]
                if "]:" in entry:
                    hostports.add(entry)
                else:
                    addresses.add(entry[1:].rstrip("]"))
            elif entry.count(":") == 1:  # v4:port
                hostports.add(entry)
            else:  # v4, or a bare v6 address
                addresses.add(entry)
    if not addresses:
        return [ep for ep in endpoints if ep.hostport in hostports]
    return [ep for ep in endpoints if ep.hostport in hostports or ep.metadata.address in addresses]


class _FirstBodyClock:
    """Wraps the parser's response reader (or none): notes on the request handle when the first non-empty
    body chunk arrived, so ResponseComplete hooks see `ResponseInfo.first_body_at`, and calls `on_first` then
    (the ResponseFirstBody hooks)."""

    __slots__ = ("_clock", "_handle", "_inner", "_on_first")

    def __init__(
        self,
        inner: ResponseReader | None,
        handle: RequestHandle,
        clock: Callable[[], float],
        on_first: Callable[[RequestHandle], None] | None = None,
    ) -> None:
        self._inner = inner
        self._handle = handle
        self._clock = clock
        self._on_first = on_first

    def feed(self, chunk: bytes, end_of_stream: bool) -> None:
        if chunk and self._handle.first_body_at is None:
            self._handle.first_body_at = self._clock()
            if self._on_first is not None:
                self._on_first(self._handle)
        if self._inner is not None:
            self._inner.feed(chunk, end_of_stream)

    @property
    def usage(self) -> Usage | None:
        return self._inner.usage if self._inner is not None else None


_HOOK_METHODS = {
    "ResponseReceived": "response_received",
    "ResponseFirstBody": "response_first_body",
    "ResponseComplete": "response_complete",
}


def _now_ns() -> int:
    return time.time_ns()


async def _within(seconds: float, coro: Awaitable[None], clock: Callable[[], float]) -> None:
    """`await coro` with a time limit (TimeoutError past it), where a coroutine that finishes without ever
    waiting (the usual PrepareData plugin: work on the loop, nothing to wait for) costs no timer: it is run to
    its first suspension by hand, and only one that suspends gets the rest of `seconds` as a deadline."""
    if type(coro) is not types.CoroutineType:  # another awaitable: the plain way
        async with asyncio.timeout(seconds):
            await coro
        return
    started = clock()
    try:
        waiting_on = coro.send(None)
    except StopIteration:
        return
    except BaseException:
        coro.close()
        raise
    async with asyncio.timeout(max(seconds - (clock() - started), 0.0)):
        await _Resume(coro, waiting_on)


class _Resume:
    """Awaits the rest of a coroutine that was stepped by hand up to its first suspension: hands what it
    waits on to the running task, and the task's results, exceptions (cancellation) and close to it, as
    `yield from` / `await` would."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, None], first: Any) -> None:
        self._coro = coro
        self._first = first

    def __await__(self) -> Generator[Any, Any, None]:
        coro, value = self._coro, self._first
        self._first = None
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as e:
                try:
                    value = coro.throw(e)
                except StopIteration:
                    return
            else:
                try:
                    value = coro.send(sent)
                except StopIteration:
                    return


class Director:
    """Routes requests and runs the request-control hooks. `clock` times every duration it measures (inject a
    virtual clock to run it in simulated time); `parsers` in resolution order (see `ParserTable`)."""

    def __init__(
        self,
        snapshot: Callable[[], Sequence[Endpoint]],
        scheduler: Scheduler,
        plugins: RequestPlugins,
        recorder: Recorder,
        options: DirectorOptions | None = None,
        rng: random.Random | None = None,
        saturation: SaturationDetector | None = None,
        *,
        parsers: Sequence[Parser] = (),
        clock: Callable[[], float] = time.monotonic,
        tracer: Tracer = NULL_TRACER,
        flow_control: FlowController | None = None,
    ) -> None:
        self._snapshot = snapshot
        self.scheduler = scheduler
        self.plugins = plugins
        self.recorder = recorder
        self.options = options or DirectorOptions()
        self.saturation = saturation
        self.parsers = ParserTable(parsers)
        self.clock = clock
        self.tracer = tracer
        self.flow_control = flow_control
        self._rng = rng or random.Random()

    # --- request path ---------------------------------------------------------------------------------
    def candidates(self, subset: Sequence[str] | None) -> list[Endpoint]:
        endpoints: Sequence[Endpoint] = self._snapshot()
        if not endpoints:
            raise RequestDropped(
                ErrorCode.SERVICE_UNAVAILABLE,
                "no endpoints in the inference pool: check that model-server pods are ready and match the pool",
                DROPPED_NO_ENDPOINTS,
            )
        if subset is not None and not self.options.disable_subset_filter:
            endpoints = filter_by_list(endpoints, subset)
        if not endpoints:
            raise RequestDropped(
                ErrorCode.SERVICE_UNAVAILABLE,
                "failed to find endpoint candidates for serving the request: "
                "the gateway's endpoint subset matches no endpoint of the pool",
                DROPPED_NO_ENDPOINTS,
            )
        return list(endpoints)

    async def route(self, inp: RequestInput, dry_run: bool = False) -> RoutingDecision:
        """Decides where the request goes. Raises EppError for answers to send to the client.

        `dry_run` decides without reserving anything: no PreRequest hooks (which update e.g. the prefix
        index), no in-flight accounting, no running-request metrics; `finish` is then a no-op."""
        received = inp.received_at if inp.received_at is not None else self.clock()
        handle = RequestHandle(inp.request_id, received)
        if inp.body is None:
            return self._route_bodyless(inp, handle)
        trace = CURRENT_TRACE.get() if self.tracer.enabled else None
        # Phases are timed only for a trace that records them (a sampled-out one only carries its context).
        timed = trace if trace is not None and getattr(trace, "recording", True) else None
        t0 = _now_ns() if timed is not None else 0
        body = inp.body
        headers = inp.headers
        path = request_path(headers)
        try:
            parser = self.parsers.resolve(path)
            parsed = parser.parse_request(path, headers, body)
        except EppError as e:
            self.recorder.request_error("", "", e.code.value)
            raise
        incoming = parsed.model
        objectives = self.options.objectives
        target = header_value(headers, MODEL_REWRITE_HEADERS) or incoming
        rule = objectives.rewrite(incoming) if incoming else None
        if rule is not None:
            target = rule[0]
            self.recorder.model_rewrite(rule[1], incoming, target)
        body_out = parser.rewrite_model(parsed, body, target) if incoming and target != incoming else None
        stripped = strip_transfer_fields(parsed.body.payload, body_out if body_out is not None else body)
        if stripped is not None:  # a client may not point a model server at a KV peer of its choice
            body_out = stripped[0]
            if log.isEnabledFor(logging.DEBUG):  # the INFO budget is one line per request (endpoint_picked)
                fields = ",".join(stripped[1])
                log.debug("client_transfer_fields_removed request_id=%s fields=%s", inp.request_id, fields)
        objective = header_value(headers, OBJECTIVE_HEADERS) or ""
        priority = objectives.priority(objective) if objective else None
        request = InferenceRequest(
            request_id=inp.request_id,
            incoming_model=incoming,
            target_model=target,
            body=parsed.body,
            headers=headers,
            priority=priority or 0,
            objective=objective,
            fairness_id=header_value(headers, FAIRNESS_HEADERS) or DEFAULT_FAIRNESS_ID,
            size_bytes=len(body),
        )
        handle.request, handle.parser, handle.parsed = request, parser, parsed
        handle.forwarded_bytes = len(body_out) if body_out is not None else len(body)
        cycle = handle.cycle
        if timed is not None:
            t1 = _now_ns()
            timed.phase("parse", t0, t1, {"parser": parser.typed_name.type, "model": incoming})
            t0 = t1
        ticket: Ticket | None = None
        try:
            if self.flow_control is not None and not dry_run:
                ticket = await self._admit_flow_control(request)
                candidates = self.candidates(inp.subset)
            else:
                candidates = self.candidates(inp.subset)
                self._shed_if_saturated(request, candidates)
            if self.plugins.screeners:
                candidates = self._screen(request, candidates)
            if timed is not None:
                t1 = _now_ns()
                timed.phase("admission", t0, t1)
                t0 = t1
            await self._prepare_and_admit(cycle, request, candidates, timed)
            if timed is not None:
                t0 = _now_ns()
            try:
                result = self.scheduler.schedule(request, candidates, cycle)
            except SchedulingFailedError as e:
                self.recorder.scheduler_attempt(False, target, "", "", "")
                raise RequestDropped(ErrorCode.RESOURCE_EXHAUSTED, str(e), DROPPED_SATURATED) from None
            if timed is not None:
                t1 = _now_ns()
                timed.phase("schedule", t0, t1)
                t0 = t1
        except EppError as e:
            if ticket is not None:
                ticket.settle()
            self.recorder.request_error(incoming, target, e.code.value)
            raise
        except BaseException:
            if ticket is not None:
                ticket.settle()
            raise
        primary = result.primary
        assert primary is not None
        targets = primary.target_endpoints
        endpoint = targets[0]
        destination = endpoint.hostport if len(targets) == 1 else ",".join(e.hostport for e in targets)
        key = endpoint.key
        self.recorder.scheduler_attempt(True, target, key.name, key.namespace, str(endpoint.metadata.port))
        handle.endpoint = endpoint
        upstream: dict[str, str] = {}
        if not dry_run:
            self.recorder.request_scheduled(incoming, target, request.priority)
            self.recorder.running_requests(incoming, 1)
            handle.reserved_tokens = estimate_tokens(len(body))
            load = endpoint.load
            load.requests += 1
            load.tokens += handle.reserved_tokens
            handle.scheduled = True
            fc = self.flow_control
            if fc is not None and fc.evictor is not None:
                item = EvictionItem(request.request_id, request.priority, fc.now(), endpoint.hostport, request)
                handle.eviction = fc.evictor.track(handle, item)
            for plugin in self.plugins.pre_request:
                try:
                    plugin.pre_request(cycle, request, result)
                except Exception:
                    self._plugin_failed("PreRequest", plugin.typed_name)
            plugin_headers = cycle.read(REQUEST_HEADERS_KEY)
            if plugin_headers:
                upstream.update((k.lower(), v) for k, v in plugin_headers.items())
            if timed is not None:
                timed.phase("pre_request", t0, _now_ns(), {"endpoint": destination})
        if ticket is not None:
            ticket.settle()  # its load is counted: the flow controller may release the next request
        if trace is not None:
            trace.inject(upstream)
        return RoutingDecision(
            request=request,
            result=result,
            endpoint=endpoint,
            destination=destination,
            handle=handle,
            body=body_out,
            upstream_headers=upstream,
            candidates=tuple(candidates),
        )

    def _route_bodyless(self, inp: RequestInput, handle: RequestHandle) -> RoutingDecision:
        candidates = self.candidates(inp.subset)
        chosen = candidates[0] if len(candidates) == 1 else self._rng.choice(candidates)
        request = InferenceRequest(inp.request_id, "", "", RequestBody(ApiKind.NONE), headers=inp.headers)
        handle.request, handle.endpoint = request, chosen
        upstream: dict[str, str] = {}
        trace = CURRENT_TRACE.get() if self.tracer.enabled else None
        if trace is not None:
            trace.inject(upstream)
        return RoutingDecision(
            request=request,
            result=None,
            endpoint=chosen,
            destination=chosen.hostport,
            handle=handle,
            upstream_headers=upstream,
            candidates=tuple(candidates),
        )

    async def _admit_flow_control(self, request: InferenceRequest) -> Ticket:
        """The flowControl gate: waits in the flow controller's queues until released. Cancellation of the
        calling task (the client went away) takes the request out of its queue."""
        assert self.flow_control is not None
        try:
            return await self.flow_control.enqueue_and_wait(request)
        except FlowControlRejected as e:
            raise RequestDropped(e.code, e.message, e.reason) from None

    def _shed_if_saturated(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> None:
        """Legacy admission: a sheddable request (priority < 0) is refused while the candidates are saturated."""
        if request.priority >= 0 or self.saturation is None:
            return
        if self.saturation.saturation(candidates) >= 1.0:
            raise EppError(
                ErrorCode.RESOURCE_EXHAUSTED,
                "system saturated, sheddable request dropped: retry later or send it with a higher priority",
            )

    def _screen(self, request: InferenceRequest, candidates: list[Endpoint]) -> list[Endpoint]:
        """The candidates every screener kept (each sees the same input); none left: 503. A screener that
        raises is skipped."""
        kept = candidates
        for plugin in self.plugins.screeners:
            t0 = time.perf_counter()
            try:
                allowed = {e.key for e in plugin.screen(request, tuple(candidates))}
            except Exception:
                log.exception("screener_failed plugin=%s", plugin.typed_name)
                self.recorder.plugin_error("Screener", plugin.typed_name)
                continue
            finally:
                self.recorder.plugin_duration("Screener", plugin.typed_name, time.perf_counter() - t0)
            kept = [e for e in kept if e.key in allowed]
        if not kept:
            raise RequestDropped(
                ErrorCode.SERVICE_UNAVAILABLE, "screeners eliminated all endpoint candidates", DROPPED_NO_ENDPOINTS
            )
        return kept

    async def _prepare_and_admit(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        candidates: Sequence[Endpoint],
        trace: RequestTrace | None,
    ) -> None:
        t0 = _now_ns() if trace is not None else 0
        for plugin in self.plugins.prepare_data:
            try:
                # a plugin that waits on purpose (a batching window) says how long it needs
                deadline = getattr(plugin, "prepare_data_timeout_s", PREPARE_DATA_TIMEOUT_S)
                await _within(deadline, plugin.prepare_data(cycle, request, candidates), self.clock)
            except TimeoutError:
                log.warning("prepare_data_timeout plugin=%s", plugin.typed_name)
            except Exception:
                log.exception("prepare_data_failed plugin=%s", plugin.typed_name)
                self.recorder.plugin_error("PrepareData", plugin.typed_name)
        if trace is not None:
            t1 = _now_ns()
            trace.phase("prepare_data", t0, t1)
            t0 = t1
        for admission in self.plugins.admission:
            reason = await admission.admit(cycle, request, candidates)
            if reason is not None:
                raise EppError(ErrorCode.INTERNAL, f"request cannot be admitted: {reason}")
        if trace is not None and self.plugins.admission:
            trace.phase("admission", t0, _now_ns(), {"plugins": len(self.plugins.admission)})

    # --- response path --------------------------------------------------------------------------------
    def response_received(self, handle: RequestHandle, seen: ResponseSeen) -> ResponsePlan:
        """The response headers arrived: runs ResponseReceived hooks; returns the headers they want added to
        the client's response and, when the parser reads usage, a fresh reader for the body."""
        handle.status = seen.status
        handle.streaming = seen.streaming
        endpoint = handle.endpoint
        handle.served_endpoint = seen.served_endpoint or (endpoint.hostport if endpoint is not None else "")
        request = handle.request
        if request is None or not handle.scheduled:
            return ResponsePlan()
        if self.plugins.response_received:
            info = ResponseInfo(
                status=seen.status,
                headers=seen.headers,
                served_endpoint=handle.served_endpoint,
                streaming=seen.streaming,
            )
            self._response_hooks(
                "ResponseReceived", self.plugins.response_received, handle.cycle, request, info, endpoint
            )
        reader = None
        parser, parsed = handle.parser, handle.parsed
        if parser is not None and parsed is not None and not parsed.skip_response_processing:
            reader = parser.response_reader(parsed, seen.headers)
        if self.plugins.response_complete or self.plugins.response_first_body:  # the first body bytes' time
            reader = _FirstBodyClock(
                reader, handle, self.clock, self._first_body if self.plugins.response_first_body else None
            )
        added = handle.cycle.read(RESPONSE_HEADERS_KEY)
        return ResponsePlan(dict(added) if added else {}, reader)

    def _first_body(self, handle: RequestHandle) -> None:
        """The first response body bytes arrived (`handle.first_body_at` is set): runs ResponseFirstBody hooks."""
        request = handle.request
        if request is None or not handle.scheduled or handle.finished:
            return
        endpoint = handle.endpoint
        info = ResponseInfo(
            status=handle.status,
            served_endpoint=handle.served_endpoint,
            streaming=handle.streaming,
            first_body_at=handle.first_body_at,
        )
        self._response_hooks(
            "ResponseFirstBody", self.plugins.response_first_body, handle.cycle, request, info, endpoint
        )

    def _response_hooks(
        self,
        point: str,
        plugins: Sequence[ResponseReceived | ResponseFirstBody | ResponseComplete],
        cycle: CycleState,
        request: InferenceRequest,
        info: ResponseInfo,
        endpoint: Endpoint | None,
    ) -> None:
        """Runs one response extension point's hooks (`point`: ResponseReceived, ResponseFirstBody or
        ResponseComplete, the method of the same name in snake case); a failing hook is logged and counted."""
        method = _HOOK_METHODS[point]
        for plugin in plugins:
            try:
                getattr(plugin, method)(cycle, request, info, endpoint)
            except Exception:
                self._plugin_failed(point, plugin.typed_name)

    def finish(self, handle: RequestHandle, outcome: Outcome) -> Mapping[str, Mapping[str, object]]:
        """Ends the request exactly once: releases the in-flight reservation, runs ResponseComplete hooks,
        updates the running-requests gauge and metrics. Returns the response dynamic metadata the hooks
        asked for (namespace -> key -> value). Later calls do nothing and return {}."""
        if handle.finished:
            return NOTHING_TO_ADD
        handle.finished = True
        request = handle.request
        if not handle.scheduled or request is None:
            return NOTHING_TO_ADD
        endpoint = handle.endpoint
        if endpoint is not None:  # release the reservation (a removed endpoint's counter is simply dropped)
            load = endpoint.load
            load.requests = max(load.requests - 1, 0)
            load.tokens = max(load.tokens - handle.reserved_tokens, 0)
        fc = self.flow_control
        if fc is not None:
            if fc.evictor is not None:
                fc.evictor.untrack(handle)  # confirms an eviction, if this request was evicted
            fc.notify()  # capacity may have freed for a queued request
        status = outcome.status or handle.status
        cycle = handle.cycle
        if self.plugins.response_complete:
            info = ResponseInfo(
                status=status,
                served_endpoint=handle.served_endpoint or (endpoint.hostport if endpoint is not None else ""),
                usage=outcome.usage,
                streaming=handle.streaming,
                complete=outcome.complete,
                first_body_at=handle.first_body_at,
            )
            self._response_hooks("ResponseComplete", self.plugins.response_complete, cycle, request, info, endpoint)
        rec = self.recorder
        incoming, target = request.incoming_model, request.target_model
        rec.running_requests(incoming, -1)
        if outcome.complete:
            if status >= 400:
                rec.request_error(incoming, target, ErrorCode.MODEL_SERVER_ERROR.value)
            usage = outcome.usage
            rec.request_completed(
                incoming,
                target,
                self.clock() - handle.received_at,
                handle.forwarded_bytes,
                outcome.response_bytes,
                usage.prompt_tokens if usage else None,
                usage.completion_tokens if usage else None,
                usage.cached_tokens if usage else None,
            )
        metadata = cycle.read(RESPONSE_METADATA_KEY)
        if not metadata:
            return NOTHING_TO_ADD
        return {ns: dict(values) for ns, values in metadata.items()}

    def _plugin_failed(self, point: str, name: TypedName) -> None:
        log.exception("plugin_failed extension_point=%s plugin=%s", point, name)
        self.recorder.plugin_error(point, name)
