"""The ext_proc stream handler: one coroutine per HTTP request, a read()/write() loop over pre-serialised
answers (cheaper than an async generator; see docs/performance.md).

Body modes: FULL_DUPLEX_STREAMED (the reference's mode: the headers answer is withheld until the body is
complete) and BUFFERED (the routing mutation rides on the body answer). Response bodies may be
FULL_DUPLEX_STREAMED (every chunk echoed; usage read) or NONE (no per-chunk round trips; completion is
learnt when Envoy closes the stream)."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import grpc
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from llm_epp.extproc import codec
from llm_epp.extproc import headers as h
from llm_epp.framework import EppError, ErrorCode
from llm_epp.framework.requestcontrol import RESPONSE_HEADERS_KEY, ResponseInfo
from llm_epp.requestcontrol.director import Director
from llm_epp.requestcontrol.lifecycle import RequestRecord
from llm_epp.requestcontrol.usage import SseUsageReader, usage_from_json

log = logging.getLogger(__name__)

VERBOSE = 15  # the reference's -v 3: one line per request

SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
FDS = ProcessingMode.FULL_DUPLEX_STREAMED
BUFFERED = ProcessingMode.BUFFERED
STREAMED = ProcessingMode.STREAMED
_MAX_USAGE_BODY = 4 << 20
_RESPONSE_HEADERS = frozenset(
    (":status", h.CONTENT_TYPE, h.CONTENT_LENGTH, h.DESTINATION_SERVED)
)  # non-streamed responses larger than this are not parsed for usage


class _Stream:
    """State of one ext_proc stream."""

    __slots__ = (
        "body",
        "body_len",
        "forbidden_present",
        "json_body",
        "record",
        "req_mode",
        "resp_mode",
        "response_done",
        "routed",
        "saw_response_headers",
        "sse",
        "subset",
    )

    def __init__(self) -> None:
        self.req_mode: int = FDS
        self.resp_mode: int = ProcessingMode.NONE
        self.record: RequestRecord | None = None
        self.body: list[bytes] = []
        self.body_len = 0
        self.subset: list[str] | None = None
        self.routed = False
        self.saw_response_headers = False
        self.response_done = False
        self.forbidden_present: list[str] = []
        self.sse: SseUsageReader | None = None
        self.json_body: list[bytes] | None = None


class ExtProcServicer:
    def __init__(
        self, director: Director, max_request_body_bytes: int = 16 << 20, enable_explain: bool = False
    ) -> None:
        self.director = director
        self.max_body = max_request_body_bytes
        self.enable_explain = enable_explain

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
        complete = False
        try:
            await self._loop(st, ctx)
        finally:
            if st.record is not None:
                complete = st.response_done
                if not complete and st.saw_response_headers and st.resp_mode == ProcessingMode.NONE:
                    # Without response bodies Envoy keeps the stream (trailer mode SEND) until the response
                    # is over, then cancels it: a stream ending after the response headers is a completion.
                    complete = True
                self.director.finish(st.record, complete)

    async def _loop(self, st: _Stream, ctx: grpc.aio.ServicerContext) -> None:
        """Runs until the stream ends. `st.response_done` is set *before* the last answer is written: Envoy
        may cancel the stream as soon as it has that answer, interrupting the write."""
        eof = grpc.aio.EOF
        write = ctx.write
        while True:
            req = await ctx.read()
            if req is eof:
                return
            kind = req.WhichOneof("request")
            if kind == "request_body":
                rb = req.request_body
                if rb.body:
                    st.body.append(rb.body)
                    st.body_len += len(rb.body)
                    if st.body_len > self.max_body:
                        await write(self._too_large(st))
                        return
                if rb.end_of_stream:
                    if not await self._route(st, write, trailers=False):
                        return
                elif st.req_mode == STREAMED:
                    await write(codec.EMPTY_REQUEST_BODY)
            elif kind == "response_body":
                rb = req.response_body
                done = self._on_response_body(st, rb.body, rb.end_of_stream)
                if done:
                    self._finish_usage(st)
                    st.response_done = True
                if st.resp_mode == FDS:
                    body = rb.body
                    if st.record is not None and st.record.model_rewritten and body:
                        body = _reverse_rewrite(body, st.record)
                    for msg in codec.streamed_response_body(body, rb.end_of_stream):
                        await write(msg)
                else:
                    await write(codec.EMPTY_RESPONSE_BODY)
                if done:
                    return
            elif kind == "request_headers":
                if req.HasField("protocol_config"):
                    st.req_mode = req.protocol_config.request_body_mode
                    st.resp_mode = req.protocol_config.response_body_mode
                self._on_request_headers(st, req)
                if req.request_headers.end_of_stream:
                    if not await self._route(st, write, trailers=False, bodyless=True):
                        return
                elif st.req_mode != FDS:
                    await write(codec.EMPTY_REQUEST_HEADERS)
            elif kind == "response_headers":
                st.saw_response_headers = True
                answer = self._on_response_headers(st, req)
                if req.response_headers.end_of_stream:
                    st.response_done = True
                await write(answer)
                if st.response_done:
                    return
            elif kind == "request_trailers":
                if not st.routed:
                    if not await self._route(st, write, trailers=True):
                        return
                await write(codec.REQUEST_TRAILERS)
            elif kind == "response_trailers":
                self._finish_usage(st)
                st.response_done = True
                await write(codec.RESPONSE_TRAILERS)
                return

    # --- request side ---------------------------------------------------------------------------------
    def _on_request_headers(self, st: _Stream, req: Any) -> None:
        headers = codec.read_headers(req.request_headers)
        request_id = headers.get(h.REQUEST_ID)
        generated = not request_id
        if not request_id:
            request_id = str(uuid.uuid4())
            headers[h.REQUEST_ID] = request_id
        st.record = RequestRecord(request_id, headers, request_id_generated=generated)
        st.forbidden_present = [name for name in h.CLIENT_FORBIDDEN if name in headers]
        st.subset = codec.read_subset(req)

    async def _route(self, st: _Stream, write: Any, trailers: bool, bodyless: bool = False) -> bool:
        """Runs the director and writes the routing answer (and the body). False = an error was sent."""
        record = st.record
        if record is None:
            raise RuntimeError("ext_proc protocol error: request body before request headers")
        body = None if bodyless else b"".join(st.body)
        st.body = []
        try:
            await self.director.handle_request(record, body, st.subset)
        except EppError as e:
            if log.isEnabledFor(VERBOSE):
                log.log(
                    VERBOSE, "request_rejected request_id=%s code=%s: %s", record.request_id, e.code.value, e.message
                )
            await write(codec.immediate_response(e, record.request_id))
            return False
        st.routed = True
        extra = [(h.REQUEST_ID, record.request_id)] if record.request_id_generated else []
        remove = [n for n in st.forbidden_present if n != h.DESTINATION]
        if record.result is not None and log.isEnabledFor(logging.DEBUG):
            log.debug("scores request_id=%s %s", record.request_id, explain_scores(record))
        if log.isEnabledFor(VERBOSE):
            log.log(
                VERBOSE,
                "endpoint_picked request_id=%s model=%s target_model=%s endpoint=%s",
                record.request_id,
                record.incoming_model,
                record.target_model,
                record.destination,
            )
        if bodyless:
            await write(codec.route_headers_response(record.destination, None, extra, remove))
            return True
        out = record.body_out if record.body_out is not None else body
        assert out is not None
        if st.req_mode == FDS:
            await write(codec.route_headers_response(record.destination, len(out) or None, extra, remove))
            for msg in codec.streamed_request_body(out, eos=not trailers):
                await write(msg)
        else:
            await write(codec.route_body_response(record.destination, record.body_out, extra, remove))
        return True

    def _too_large(self, st: _Stream) -> bytes:
        err = EppError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"request body is larger than the limit of {self.max_body} bytes (--max-request-body-bytes)",
        )
        record = st.record
        rid = record.request_id if record else ""
        if record is not None:
            self.director.recorder.request_error(record.incoming_model, record.target_model, err.code.value)
        return codec.immediate_response(err, rid)

    # --- response side --------------------------------------------------------------------------------
    def _on_response_headers(self, st: _Stream, req: Any) -> bytes:
        record = st.record
        if record is None:
            return codec.EMPTY_RESPONSE_HEADERS
        headers = codec.read_some_headers(req.response_headers, _RESPONSE_HEADERS)
        status = headers.get(":status", "")
        record.response_status = int(status) if status.isdigit() else 0
        record.response_streaming = "text/event-stream" in headers.get(h.CONTENT_TYPE, "")
        served = codec.read_metadata(req, h.LB_NAMESPACE, h.DESTINATION_SERVED)
        if not isinstance(served, str) or not served:
            served = headers.get(h.DESTINATION_SERVED, "")
        record.served_endpoint = served or record.destination.split(",", 1)[0]
        if st.resp_mode == FDS:
            if record.response_streaming:
                st.sse = SseUsageReader()
            else:
                st.json_body = []
        set_headers: dict[str, str] = {}
        remove: list[str] = []
        if h.DESTINATION_SERVED in headers:
            remove.append(h.DESTINATION_SERVED)
        if record.served_endpoint:
            set_headers[h.CONFORMANCE_SERVED] = record.served_endpoint
        if self.enable_explain and record.headers.get(h.EXPLAIN_REQUEST) in _YES and record.result is not None:
            set_headers[h.SCORES] = explain_scores(record)
        if record.model_rewritten and st.resp_mode == FDS and h.CONTENT_LENGTH in headers:
            remove.append(h.CONTENT_LENGTH)  # the reverse rewrite may change the length
        self.director.response_received(record, _response_info(record))
        plugin_headers = record.cycle.read(RESPONSE_HEADERS_KEY)
        if plugin_headers:
            set_headers.update(plugin_headers)
        return codec.response_headers_response(set_headers, remove)

    def _on_response_body(self, st: _Stream, body: bytes, eos: bool) -> bool:
        record = st.record
        if record is None:
            return eos
        record.response_bytes += len(body)
        if st.sse is not None:
            st.sse.feed(body)
        elif st.json_body is not None:
            if record.response_bytes <= _MAX_USAGE_BODY:
                st.json_body.append(body)
            else:
                st.json_body = None
        return eos

    def _finish_usage(self, st: _Stream) -> None:
        record = st.record
        if record is None:
            return
        if st.sse is not None:
            st.sse.finish()
            record.usage = st.sse.usage
        elif st.json_body:
            record.usage = usage_from_json(b"".join(st.json_body))
            st.json_body = None


_YES = frozenset(("1", "true", "yes"))


def explain_scores(record: RequestRecord) -> str:
    """`ip:port;total=T;<plugin>=<weighted score>;...` per candidate, best first, comma-separated."""
    primary = record.result.primary if record.result is not None else None
    if primary is None:
        return ""
    hostports = {e.key: e.hostport for e in record.candidates}
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


def _response_info(record: RequestRecord) -> ResponseInfo:
    return ResponseInfo(
        status=record.response_status,
        served_endpoint=record.served_endpoint,
        streaming=record.response_streaming,
    )


def _reverse_rewrite(body: bytes, record: RequestRecord) -> bytes:
    """Put the client's model name back into response bytes (both JSON spacings)."""
    target = record.target_model.encode()
    incoming = record.incoming_model.encode()
    for pattern in (b'"model":"%s"', b'"model": "%s"'):
        old = pattern % target
        if old in body:
            body = body.replace(old, pattern % incoming)
    return body
