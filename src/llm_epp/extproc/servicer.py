"""The ext_proc stream handler: one coroutine per HTTP request, a read()/write() loop over answers that are
already wire bytes (cheaper than an async generator and message objects; benchmarks/README.md, "Where the
EPP's time goes", has the measurements).

Body modes: FULL_DUPLEX_STREAMED (the reference's mode: the headers answer is withheld until the body is
complete) and BUFFERED (the routing mutation rides on the body answer). Response bodies may be
FULL_DUPLEX_STREAMED (every chunk echoed; usage read) or NONE (no per-chunk round trips; completion is
learnt at the response headers when they carry the length of a non-streamed body, else when Envoy closes the
stream).

Protocol state (modes, body chunks, response reader, byte counts) lives here, per stream; the director gets
values in (`RequestInput`, `ResponseSeen`, `Outcome`) and gives values back (`RoutingDecision`,
`ResponsePlan`, response metadata)."""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Mapping
from contextvars import Token
from typing import Any

import grpc
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from llm_epp.extproc import codec
from llm_epp.extproc import headers as h
from llm_epp.extproc.held import DEFAULT_MAX_HELD_BYTES, HeldBytes, HeldBytesExceeded
from llm_epp.framework import EppError, ErrorCode
from llm_epp.framework.parsing import ResponseReader
from llm_epp.framework.tracing import CURRENT_TRACE, RequestTrace, Tracer
from llm_epp.requestcontrol.decision import (
    Outcome,
    RequestDropped,
    RequestInput,
    ResponsePlan,
    ResponseSeen,
    RoutingDecision,
)
from llm_epp.requestcontrol.director import Director
from llm_epp.requestcontrol.lifecycle import RequestHandle
from llm_epp.requestcontrol.model_restore import ModelNameRestorer

log = logging.getLogger(__name__)

VERBOSE = 15  # the reference's -v 3: one line per request

SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
FDS = ProcessingMode.FULL_DUPLEX_STREAMED
BUFFERED = ProcessingMode.BUFFERED
STREAMED = ProcessingMode.STREAMED
RETRY_AFTER_S = "1"
# How long a stream whose response ended at its headers waits for Envoy to close it before ending it with OK.
# Envoy resets the stream as soon as the response has passed; a read in flight at that moment (or a status
# sent just after it) leaks a small native array in grpcio's asyncio server (grpc/grpc issue 43360), so the
# handler waits on a timer instead, which the reset cancels without touching a gRPC batch.
CLOSE_WAIT_S = 10.0
# An event stream (response bodies NONE) ends only when Envoy closes the stream after its last chunk (a
# half-close at once followed by a reset): the same leak if a read is in flight when the reset lands. Once the
# servicer has seen its peer reset streams at the end of a response, the handler waits for that reset on a
# timer instead of a read; after this long it reads again, so a very long stream still sees whatever comes. A
# peer that only half-closes is noticed when a wait for its reset runs out (`CLOSE_WAIT_S`), and its streams keep
# the read.
STREAM_WAIT_S = 60.0
_RESPONSE_HEADERS = frozenset((":status", h.CONTENT_TYPE, h.CONTENT_LENGTH, h.DESTINATION_SERVED))
_YES = frozenset(("1", "true", "yes"))


class _Stream:
    """State of one ext_proc stream."""

    __slots__ = (
        "body",
        "body_len",
        "closed_by_envoy",
        "event_stream",
        "explain",
        "handle",
        "headers",
        "held",
        "reader",
        "req_mode",
        "request_id",
        "request_id_generated",
        "resp_mode",
        "response_bytes",
        "response_done",
        "restorer",
        "routed",
        "saw_response_headers",
        "status",
        "subset",
        "trace",
        "trace_token",
    )

    def __init__(self) -> None:
        self.req_mode: int = FDS
        self.resp_mode: int = ProcessingMode.NONE
        self.headers: dict[str, str] | None = None
        self.request_id = ""
        self.request_id_generated = False
        self.subset: list[str] | None = None
        self.body: list[bytes] = []
        self.body_len = 0
        self.held = 0  # body bytes counted against the servicer-wide bound
        self.handle: RequestHandle | None = None
        self.routed = False
        self.explain = ""
        self.saw_response_headers = False
        self.response_done = False
        self.event_stream = False  # the response is text/event-stream
        self.closed_by_envoy = False  # the response ended at its headers: wait for Envoy to close the stream
        self.response_bytes = 0
        self.reader: ResponseReader | None = None
        self.restorer: ModelNameRestorer | None = None
        self.status = 0  # the HTTP status answered (for the trace)
        self.trace: RequestTrace | None = None
        self.trace_token: Token[RequestTrace | None] | None = None


class ExtProcServicer:
    """`max_request_body_bytes` bounds one request body (413 above it); `max_held_request_bytes` bounds the
    request body bytes held across all streams at once (503 with Retry-After above it), counted in `held`.
    `tracer` defaults to the director's, so the trace the servicer starts is the one the director reports
    phases to."""

    def __init__(
        self,
        director: Director,
        max_request_body_bytes: int = 16 << 20,
        enable_explain: bool = False,
        *,
        max_held_request_bytes: int = DEFAULT_MAX_HELD_BYTES,
        emit_endpoint_scores: bool = False,
        tracer: Tracer | None = None,
        close_wait_s: float = CLOSE_WAIT_S,
        stream_wait_s: float = STREAM_WAIT_S,
    ) -> None:
        self.director = director
        self.max_body = max_request_body_bytes
        self.enable_explain = enable_explain
        self.emit_endpoint_scores = emit_endpoint_scores
        self.tracer = tracer if tracer is not None else director.tracer  # one tracer for both halves
        self.held = HeldBytes(max_held_request_bytes)  # request bytes held by all streams now
        self.close_wait_s = close_wait_s
        self.stream_wait_s = stream_wait_s
        # How the peer ends a stream once a response without bodies is over: True = it resets the stream (Envoy,
        # after a half-close), False = a wait for the reset ran out, None = not seen yet.
        self.peer_resets: bool | None = None

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Process": grpc.stream_stream_rpc_method_handler(
                    self.process,
                    request_deserializer=pb.ProcessingRequest.FromString,
                    response_serializer=None,
                )
            },
        )

    async def process(self, _requests: Any, ctx: grpc.aio.ServicerContext) -> None:
        st = _Stream()
        try:
            await self._loop(st, ctx)
        except asyncio.CancelledError:
            if st.saw_response_headers and st.resp_mode == ProcessingMode.NONE:
                self._learn_peer(resets=True)  # the peer reset the stream once the response had passed
            raise
        finally:
            self._release(st)
            handle = st.handle
            if handle is not None and not handle.finished:
                complete = st.response_done
                if not complete and st.saw_response_headers and st.resp_mode == ProcessingMode.NONE:
                    # Without response bodies Envoy keeps the stream (trailer mode SEND) until the response
                    # is over, then cancels it: a stream ending after the response headers is a completion.
                    complete = True
                self.director.finish(handle, self._outcome(st, complete))
            if st.trace is not None:
                st.trace.end(st.status)
            if st.trace_token is not None:
                CURRENT_TRACE.reset(st.trace_token)

    async def _loop(self, st: _Stream, ctx: grpc.aio.ServicerContext) -> None:
        """Runs until the stream ends. `st.response_done` is set *before* the last answer is written: Envoy
        may cancel the stream as soon as it has that answer, interrupting the write."""
        eof = grpc.aio.EOF
        write = ctx.write
        while True:
            handle = st.handle
            try:
                if handle is not None and handle.eviction is not None and not st.response_done:
                    req = await _read_unless_evicted(ctx, handle.eviction)
                else:
                    req = await ctx.read()
            except HeldBytesExceeded as e:  # the transport could not gather the next message within the bound
                if log.isEnabledFor(VERBOSE):
                    log.log(VERBOSE, "request_rejected request_id=%s: %s", st.request_id, e)
                await _write_last(write, self._reject(st, self._overloaded(), ((h.RETRY_AFTER, RETRY_AFTER_S),)))
                return
            if req is _EVICTED:
                log.info("request_evicted request_id=%s", st.request_id)
                st.status = 429
                await _write_last(write, codec.evicted_response(st.request_id))
                return
            if req is eof:
                if st.saw_response_headers and st.resp_mode == ProcessingMode.NONE and not st.response_done:
                    # The response is over. Envoy half-closes and then resets: end the request now, then wait
                    # for the reset on a timer (a status sent into the reset would leak like a read).
                    st.response_done = True
                    handle = st.handle
                    if handle is not None and not handle.finished:
                        await self._end(handle, self._outcome(st, True))
                    if self.peer_resets is not False:
                        await self._wait_for_close()
                return
            kind = req.WhichOneof("request")
            if kind == "request_body":
                if st.routed:  # a second end of the body would route the request again and lose the first pick
                    raise RuntimeError("ext_proc protocol error: request body after the request was routed")
                rb = req.request_body
                chunk = rb.body
                if chunk:
                    size = len(chunk)
                    if st.body_len + size > self.max_body:
                        await _write_last(write, self._reject(st, self._too_large()))
                        return
                    if not self.held.take(size):
                        await _write_last(
                            write, self._reject(st, self._overloaded(), ((h.RETRY_AFTER, RETRY_AFTER_S),))
                        )
                        return
                    st.body.append(chunk)
                    st.body_len += size
                    st.held += size
                if rb.end_of_stream:
                    if not await self._route(st, write, trailers=False):
                        return
                elif st.req_mode == STREAMED:
                    await write(codec.EMPTY_REQUEST_BODY)
            elif kind == "response_body":
                rb = req.response_body
                if await self._on_response_body(st, write, rb.body, rb.end_of_stream):
                    return
            elif kind == "request_headers":
                if req.HasField("protocol_config"):
                    st.req_mode = req.protocol_config.request_body_mode
                    st.resp_mode = req.protocol_config.response_body_mode
                self._on_request_headers(st, req)
                if self.tracer.enabled and st.headers is not None:
                    st.trace = self.tracer.start_request(st.request_id, st.headers)
                    st.trace_token = CURRENT_TRACE.set(st.trace)
                if req.request_headers.end_of_stream:
                    if not await self._route(st, write, trailers=False, bodyless=True):
                        return
                elif st.req_mode != FDS:
                    await write(codec.EMPTY_REQUEST_HEADERS)
            elif kind == "response_headers":
                st.saw_response_headers = True
                if req.response_headers.end_of_stream:
                    st.response_done = True
                answer = await self._on_response_headers(st, req)
                waits = st.event_stream and st.resp_mode == ProcessingMode.NONE and self.peer_resets
                if st.response_done or waits:
                    await _write_last(write, answer)  # nothing more to send: Envoy resets the stream next
                else:
                    await write(answer)
                if st.response_done:
                    if st.closed_by_envoy:
                        await self._wait_for_close()
                    return
                if waits:
                    await self._wait_for_reset(st)  # then read on (an eviction is seen at the loop's top)
            elif kind == "request_trailers":
                if not st.routed:
                    if not await self._route(st, write, trailers=True):
                        return
                await write(codec.REQUEST_TRAILERS)
            elif kind == "response_trailers":
                st.response_done = True
                await _write_last(write, codec.RESPONSE_TRAILERS + await self._finish(st))
                return

    def _learn_peer(self, resets: bool) -> None:
        if self.peer_resets is not resets:
            self.peer_resets = resets
            log.info(
                "ext_proc_peer_ends_streams by=%s: event streams %s",
                "reset" if resets else "half-close",
                "wait for the reset without a read" if resets else "keep a read in flight",
            )

    async def _wait_for_close(self) -> None:
        """Waits (no read in flight) for the peer to reset a stream whose response is over; the reset cancels
        the wait. A peer that has not reset it within `close_wait_s` is taken not to reset streams."""
        await asyncio.sleep(self.close_wait_s)
        self._learn_peer(resets=False)

    async def _wait_for_reset(self, st: _Stream) -> None:
        """Waits, with no read in flight, for the peer to reset the stream at the end of an event stream (the
        reset cancels this wait), for flow control to evict the request, or for `stream_wait_s`."""
        handle = st.handle
        eviction = handle.eviction if handle is not None else None
        if eviction is None:
            await asyncio.sleep(self.stream_wait_s)
        elif not eviction.done():
            await asyncio.wait((eviction,), timeout=self.stream_wait_s)

    # --- request side ---------------------------------------------------------------------------------
    def _on_request_headers(self, st: _Stream, req: Any) -> None:
        headers = codec.read_headers(req.request_headers)
        request_id = headers.get(h.REQUEST_ID)
        if not request_id:
            request_id = str(uuid.uuid4())
            headers[h.REQUEST_ID] = request_id
            st.request_id_generated = True
        st.request_id = request_id
        st.headers = headers
        st.subset = codec.read_subset(req)

    async def _route(self, st: _Stream, write: Any, trailers: bool, bodyless: bool = False) -> bool:
        """Runs the director and writes the routing answer (and the body). False = an error was sent."""
        headers = st.headers
        if headers is None:
            raise RuntimeError("ext_proc protocol error: request body before request headers")
        body = None if bodyless else b"".join(st.body)
        st.body = []
        inp = RequestInput(st.request_id, headers, body, st.subset, st.request_id_generated)
        try:
            decision = await self.director.route(inp)
        except EppError as e:
            if log.isEnabledFor(VERBOSE):
                log.log(VERBOSE, "request_rejected request_id=%s code=%s: %s", st.request_id, e.code.value, e.message)
            extra = ((h.DROPPED_REASON, e.reason),) if isinstance(e, RequestDropped) else ()
            await _write_last(write, self._reject(st, e, extra))
            return False
        st.routed = True
        st.handle = decision.handle
        if self.enable_explain and headers.get(h.EXPLAIN_REQUEST) in _YES:
            st.explain = explain_scores(decision)
        if decision.model_rewritten:
            req = decision.request
            st.restorer = ModelNameRestorer(req.target_model, req.incoming_model)
        if decision.result is not None and log.isEnabledFor(logging.DEBUG):
            log.debug("scores request_id=%s %s", st.request_id, explain_scores(decision))
        if log.isEnabledFor(VERBOSE):
            log.log(
                VERBOSE,
                "endpoint_picked request_id=%s model=%s target_model=%s endpoint=%s",
                st.request_id,
                decision.request.incoming_model,
                decision.request.target_model,
                decision.destination,
            )
        extra_headers, remove = _upstream_mutation(st, headers, decision)
        scores = decision.endpoint_scores() if self.emit_endpoint_scores else None
        destination = decision.destination
        if body is None:
            await write(codec.route_headers_response(destination, None, extra_headers, remove, scores))
        else:
            out = decision.body if decision.body is not None else body
            del decision  # the stream keeps the handle only: no body stays referenced
            if st.req_mode == FDS:
                await write(codec.route_headers_response(destination, len(out) or None, extra_headers, remove, scores))
                for msg in codec.streamed_request_body(out, eos=not trailers):
                    await write(msg)
            else:
                new_body = out if out is not body else None
                await write(codec.route_body_response(destination, new_body, extra_headers, remove, scores))
        self._release(st)
        return True

    def _reject(self, st: _Stream, err: EppError, headers: tuple[tuple[str, str], ...] = ()) -> bytes:
        """The answer to a request the EPP refuses; the held body is let go first."""
        st.body = []
        self._release(st)
        st.status = err.code.http_status
        return codec.immediate_response(err, st.request_id, headers)

    def _release(self, st: _Stream) -> None:
        if st.held:
            self.held.give(st.held)
            st.held = 0

    def _too_large(self) -> EppError:
        err = EppError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"request body is larger than the limit of {self.max_body} bytes (--max-request-body-bytes)",
        )
        self.director.recorder.request_error("", "", err.code.value)
        return err

    def _overloaded(self) -> EppError:
        err = EppError(
            ErrorCode.SERVICE_UNAVAILABLE,
            "the endpoint picker holds too many request bytes right now (--max-held-request-bytes): retry later",
        )
        self.director.recorder.request_error("", "", err.code.value)
        return err

    # --- response side --------------------------------------------------------------------------------
    async def _on_response_headers(self, st: _Stream, req: Any) -> bytes:
        """The answer to the response headers. Without response bodies (mode NONE), a response whose headers
        carry its length and that is neither an event stream nor gRPC is over: its body was complete before
        its headers went out (vLLM and SGLang answer a non-streamed request once it has finished), and a
        response with a length has no trailers to send. The request ends here, on this answer; the stream
        then waits (no read in flight) for Envoy to close it, which it does once the body has passed."""
        handle = st.handle
        if handle is None:
            return codec.response_headers_response({}, ())
        headers = codec.read_some_headers(req.response_headers, _RESPONSE_HEADERS)
        status_text = headers.get(":status", "")
        status = int(status_text) if status_text.isdigit() else 0
        st.status = status
        served = codec.read_metadata(req, h.LB_NAMESPACE, h.DESTINATION_SERVED)
        if not isinstance(served, str) or not served:
            served = headers.get(h.DESTINATION_SERVED, "")
        content_type = headers.get(h.CONTENT_TYPE, "")
        streaming = "text/event-stream" in content_type
        st.event_stream = streaming
        if (
            st.resp_mode == ProcessingMode.NONE
            and not st.response_done
            and h.CONTENT_LENGTH in headers
            and not streaming
            and not content_type.startswith("application/grpc")
        ):
            st.response_done = st.closed_by_envoy = True  # before the answer is written (see _loop)
        seen = ResponseSeen(status=status, served_endpoint=served, streaming=streaming, headers=headers)
        plan = await self._response_plan(handle, seen)
        set_headers: dict[str, str] = dict(plan.headers)
        remove: list[str] = []
        if h.DESTINATION_SERVED in headers:
            remove.append(h.DESTINATION_SERVED)
        if st.explain:
            set_headers[h.EXPLAIN_RESPONSE] = st.explain
        if st.resp_mode == FDS:
            st.reader = plan.reader
            if st.restorer is not None and h.CONTENT_LENGTH in headers:
                remove.append(h.CONTENT_LENGTH)  # restoring the model name may change the length
        else:
            st.restorer = None
        metadata = await self._end(handle, self._outcome(st, True)) if st.response_done else None
        return codec.response_headers_response(set_headers, remove, metadata)

    async def _on_response_body(self, st: _Stream, write: Any, body: bytes, eos: bool) -> bool:
        """Echoes (and restores) one response chunk; True when the response is over."""
        st.response_bytes += len(body)
        if st.reader is not None:
            st.reader.feed(body, eos)
        tail = b""
        if eos:
            st.response_done = True
            tail = await self._finish(st)
        if st.resp_mode == FDS:
            restorer = st.restorer
            if restorer is not None:
                body = restorer.feed(body) if body else b""
                if eos:
                    body += restorer.flush()
            answers = codec.streamed_response_body(body, eos)
            if tail:
                answers[-1] += tail
            last = len(answers) - 1
            for i, msg in enumerate(answers):
                await (_write_last(write, msg) if eos and i == last else write(msg))
        elif eos:
            await _write_last(write, codec.EMPTY_RESPONSE_BODY + tail)
        else:
            await write(codec.EMPTY_RESPONSE_BODY + tail)
        return eos

    async def _finish(self, st: _Stream) -> bytes:
        """Ends the request in the director before the last answer is written, so the response metadata the
        ResponseComplete hooks produce rides on that answer."""
        handle = st.handle
        if handle is None or handle.finished:
            return b""
        return codec.dynamic_metadata(await self._end(handle, self._outcome(st, True)))

    async def _response_plan(self, handle: RequestHandle, seen: ResponseSeen) -> ResponsePlan:
        """The director's answer to the response headers (awaitable, so a director in another process fits)."""
        return self.director.response_received(handle, seen)

    async def _end(self, handle: RequestHandle, outcome: Outcome) -> Mapping[str, Mapping[str, object]]:
        """Ends the request in the director; returns the response metadata (awaitable, as above)."""
        return self.director.finish(handle, outcome)

    @staticmethod
    def _outcome(st: _Stream, complete: bool) -> Outcome:
        reader = st.reader
        return Outcome(
            complete=complete,
            usage=reader.usage if reader is not None else None,
            response_bytes=st.response_bytes,
        )


_EVICTED = object()


def _write_last(write: Any, message: bytes) -> asyncio.Future[None]:
    """Writes a stream's last answer so that Envoy's reset cannot interrupt gRPC's own write; await the result.

    Envoy resets the stream as soon as it has the last answer. When the event loop is busy, the reset can reach
    the handler before it resumes from the write that has already completed: grpcio then throws the
    cancellation into its write coroutine, which never frees that write's native op array (grpc/grpc issue
    43360; a few dozen bytes per request under load). The write runs in a task of its own, which the reset does
    not cancel, so it always completes; the handler waits on a separate future and sees the cancellation at
    once. The write's outcome is always retrieved: a write that fails after the handler has gone (the reset
    came first) is dropped, not reported as an unhandled task exception (which `asyncio.shield` does when its
    waiter is cancelled before the write ends)."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()
    loop.create_task(write(message)).add_done_callback(functools.partial(_relay_write, waiter))
    return waiter


def _relay_write(waiter: asyncio.Future[None], task: asyncio.Task[None]) -> None:
    if task.cancelled():
        if not waiter.done():
            waiter.cancel()
        return
    error = task.exception()  # retrieved, whoever still waits
    if waiter.done():  # the handler was cancelled (the reset): nobody wants the outcome
        return
    if error is None:
        waiter.set_result(None)
    else:
        waiter.set_exception(error)


async def _read_unless_evicted(ctx: grpc.aio.ServicerContext, eviction: asyncio.Future[None]) -> Any:
    """The next message from Envoy, or `_EVICTED` once flow control evicts the request first.

    An evicted request's read is left to end with the stream rather than cancelled: cancelling grpcio's read
    while it waits leaks its batch like an interrupted write (see `_write_last`). The stream ends right after
    the eviction's answer, and the read with it; its outcome is dropped."""
    if eviction.done():
        return _EVICTED
    read = asyncio.ensure_future(ctx.read())
    await asyncio.wait((read, eviction), return_when=asyncio.FIRST_COMPLETED)
    if read.done():
        return read.result()
    _LEFT_READS.add(read)
    read.add_done_callback(_drop_outcome)
    return _EVICTED


_LEFT_READS: set[asyncio.Future[Any]] = set()
"""Reads of evicted requests until their stream ends (a task nothing references may be collected while pending)."""


def _drop_outcome(task: asyncio.Future[Any]) -> None:
    _LEFT_READS.discard(task)
    if not task.cancelled():
        task.exception()  # marks a failure seen: the stream it belonged to is over


def _upstream_mutation(
    st: _Stream, headers: Mapping[str, str], decision: RoutingDecision
) -> tuple[list[tuple[str, str]], list[str]]:
    """Headers to set on the routed request, and client-sent headers to remove (control headers, and copies
    of the headers the EPP sets)."""
    extra = list(decision.upstream_headers.items())
    if st.request_id_generated:
        extra.append((h.REQUEST_ID, st.request_id))
    if _FORBIDDEN.isdisjoint(headers):  # the usual request: the client sent none of them
        return extra, []
    setting = {name for name, _ in extra}
    setting.add(h.DESTINATION)
    remove = [name for name in h.CLIENT_FORBIDDEN if name in headers and name not in setting]
    return extra, remove


_FORBIDDEN = frozenset(h.CLIENT_FORBIDDEN) - {h.DESTINATION}  # the EPP sets the destination header itself


def explain_scores(decision: RoutingDecision) -> str:
    """`ip:port;total=T;<plugin>=<weighted score>;...` per candidate, best first, comma-separated."""
    primary = decision.result.primary if decision.result is not None else None
    if primary is None:
        return ""
    hostports = {e.key: e.hostport for e in decision.candidates}
    rows = []
    for key, parts in primary.scores.items():
        hostport = hostports.get(key) or str(key)
        detail = ";".join(f"{name}={value:.4g}" for name, value in parts.items() if name != "total")
        rows.append(
            (
                parts.get("total", 0.0),
                f"{hostport};total={parts.get('total', 0.0):.4g}" + (";" + detail if detail else ""),
            )
        )
    rows.sort(key=lambda r: -r[0])
    return ", ".join(text for _, text in rows)
