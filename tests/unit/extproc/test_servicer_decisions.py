"""The ext_proc adapter around the director's decisions: plugin headers and metadata, drop reasons, the
held-bytes bound, model names restored across chunks, endpoint scores, trace context, unclaimed paths."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from llm_epp.extproc import servicer as servicer_module
from llm_epp.extproc.held import HeldBytes
from llm_epp.extproc.http2_server import ExtProcServer
from llm_epp.extproc.servicer import ExtProcServicer
from llm_epp.framework import CycleState, Endpoint, InferenceRequest, TypedName
from llm_epp.framework.requestcontrol import (
    REQUEST_HEADERS_KEY,
    RESPONSE_METADATA_KEY,
    ResponseInfo,
)
from llm_epp.framework.tracing import CURRENT_TRACE, AttributeValue, RequestTrace
from llm_epp.framework.types import SchedulingResult
from llm_epp.requestcontrol.director import RequestPlugins
from tests.unit.extproc.fake_envoy import (
    FDS,
    NONE,
    FakeContext,
    Harness,
    body_msg,
    headers_msg,
    response_body_msg,
    response_headers_msg,
    response_trailers_msg,
)
from tests.unit.extproc.test_http2 import GRPC_HEADERS, H2Client, grpc_message
from tests.unit.extproc.test_servicer import ENDPOINTS, POST, body, removed, set_headers, streamed

PODS = "10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8001"


class Plugin:
    typed_name = TypedName("test-hooks", "test-hooks")

    def pre_request(self, cycle: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        cycle.write(REQUEST_HEADERS_KEY, {"x-prefiller-host-port": "10.1.1.1:8000"})

    def response_complete(
        self, cycle: CycleState, request: InferenceRequest, response: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        cycle.write(RESPONSE_METADATA_KEY, {"envoy.lb": {"x-gateway-inference-request-cost": response.status}})


def with_plugin(**servicer_opts: Any) -> Harness:
    p = Plugin()
    return Harness(PODS, plugins=RequestPlugins(pre_request=[p], response_complete=[p]), servicer_opts=servicer_opts)


def cost(resp) -> float | None:
    fields = resp.dynamic_metadata.fields
    if "envoy.lb" not in fields:
        return None
    return fields["envoy.lb"].struct_value.fields["x-gateway-inference-request-cost"].number_value


async def test_plugin_request_headers_are_set_upstream_and_client_copies_replaced() -> None:
    h = with_plugin()
    ctx = await h.run([headers_msg({**POST, "x-prefiller-host-port": "6.6.6.6:1"}), body_msg(body(), True)])
    sets = [
        (o.header.key, o.header.raw_value) for o in ctx.sent[0].request_headers.response.header_mutation.set_headers
    ]
    assert ("x-prefiller-host-port", b"10.1.1.1:8000") in sets
    assert [k for k, _ in sets].count("x-prefiller-host-port") == 1


async def test_response_metadata_rides_on_the_last_response_answer() -> None:
    h = with_plugin()
    msgs = [
        headers_msg(POST, resp_mode=FDS),
        body_msg(body(), True),
        response_headers_msg({":status": "200", "content-type": "application/json"}),
        response_body_msg(b'{"a":', False),
        response_body_msg(b"1}", True),
    ]
    ctx = await h.run(msgs)
    assert ctx.kinds()[-2:] == ["response_body", "response_body"]
    assert cost(ctx.sent[-2]) is None
    assert cost(ctx.sent[-1]) == 200
    assert streamed(ctx.sent[-1], "response_body") == (b"1}", True)


async def test_response_metadata_on_a_bodiless_response_headers_answer() -> None:
    h = with_plugin()
    msgs = [
        headers_msg(POST, resp_mode=FDS),
        body_msg(body(), True),
        response_headers_msg({":status": "204"}, eos=True),
    ]
    ctx = await h.run(msgs)
    assert cost(ctx.sent[-1]) == 204
    assert set_headers(ctx.sent[-1], "response_headers")["x-went-into-resp-headers"] == "true"


async def test_without_response_bodies_a_response_with_its_length_ends_the_stream_at_its_headers() -> None:
    # Response bodies NONE: a non-streamed answer (vLLM sends it once generation has finished, with its
    # Content-Length) is complete when its headers arrive; the servicer ends the request and the stream there
    # instead of waiting for Envoy to cancel the stream after the body, so anything scripted after it is unread.
    h = with_plugin(close_wait_s=0.0)
    msgs = [
        headers_msg(POST),
        body_msg(body(), True),
        response_headers_msg({":status": "200", "content-type": "application/json", "content-length": "42"}),
        response_trailers_msg(),
    ]
    ctx = await h.run(msgs)
    assert ctx.kinds()[-1] == "response_headers"
    assert cost(ctx.sent[-1]) == 200  # the ResponseComplete hooks ran before the answer went out
    assert h.recorder.running == 0 and len(h.recorder.completed) == 1


async def test_a_response_ended_at_its_headers_waits_for_envoy_to_close_the_stream_without_reading() -> None:
    h = with_plugin()  # the default wait, far longer than this test
    ctx = FakeContext(
        [
            headers_msg(POST),
            body_msg(body(), True),
            response_headers_msg({":status": "200", "content-type": "application/json", "content-length": "42"}),
        ]
    )
    task = asyncio.create_task(h.servicer.process(None, ctx))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)  # the stream has nothing to wait for but the close
    assert ctx.kinds() == ["request_headers", "request_body", "response_headers"]
    assert not task.done()  # the stream stays open (no read in flight) until Envoy closes it
    assert len(h.recorder.completed) == 1 and h.recorder.running == 0  # the request already ended
    task.cancel()  # Envoy resets the stream once the response has passed
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(h.recorder.completed) == 1  # counted once


@pytest.mark.parametrize(
    ("resp_mode", "headers"),
    [
        (NONE, {":status": "200", "content-type": "text/event-stream"}),  # streamed: the body is still coming
        (NONE, {":status": "200", "content-type": "application/json"}),  # no length: chunked, maybe not over
        (NONE, {":status": "200", "content-type": "application/grpc", "content-length": "9"}),  # trailers follow
        (FDS, {":status": "200", "content-type": "application/json", "content-length": "42"}),  # bodies come here
    ],
    ids=["none-event-stream", "none-no-length", "none-grpc", "streamed-bodies"],
)
async def test_a_response_that_may_still_be_running_keeps_the_stream_open(
    resp_mode: int, headers: dict[str, str]
) -> None:
    h = with_plugin()
    msgs = [headers_msg(POST, resp_mode=resp_mode), body_msg(body(), True), response_headers_msg(headers)]
    ctx = await h.run([*msgs, response_trailers_msg()])
    assert ctx.kinds()[-2:] == ["response_headers", "response_trailers"]
    assert cost(ctx.sent[-2]) is None  # not ended at the headers
    assert cost(ctx.sent[-1]) == 200
    assert h.recorder.running == 0 and len(h.recorder.completed) == 1


SSE = {":status": "200", "content-type": "text/event-stream"}


class CountingContext(FakeContext):
    """Counts reads; after its script it blocks like a live stream (no EOF) until the test resets it."""

    def __init__(self, messages: Any, then_eof: bool = False) -> None:
        super().__init__(messages)
        self.reads = 0
        self.then_eof = then_eof

    async def read(self) -> Any:
        self.reads += 1
        if self._messages or self.then_eof:
            return await super().read()
        await asyncio.Event().wait()  # nothing more until Envoy resets the stream
        raise AssertionError("unreachable")


def sse_stream(then_eof: bool = False) -> CountingContext:
    return CountingContext([headers_msg(POST), body_msg(body(), True), response_headers_msg(SSE)], then_eof)


async def reset_after_headers(h: Harness, ctx: FakeContext) -> asyncio.Task[None]:
    """Runs the stream until it has answered the response headers, then resets it as Envoy does at the end."""
    task = asyncio.create_task(h.servicer.process(None, ctx))  # type: ignore[arg-type]
    for _ in range(100):
        await asyncio.sleep(0.005)
        if "response_headers" in ctx.kinds():
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return task


async def test_once_the_peer_resets_streams_an_event_stream_waits_for_the_reset_without_a_read() -> None:
    h = with_plugin()
    first = sse_stream()
    await reset_after_headers(h, first)
    assert first.reads == 4  # unknown peer: a read stays in flight after the response headers
    assert h.servicer.peer_resets is True
    second = sse_stream()
    await reset_after_headers(h, second)
    assert second.reads == 3  # the reset ended a wait on a timer, not a read
    assert len(h.recorder.completed) == 2 and h.recorder.running == 0  # each ended once, as a completion


async def test_a_peer_that_half_closes_keeps_the_reads() -> None:
    h = with_plugin(stream_wait_s=0.01, close_wait_s=0.01)
    h.servicer.peer_resets = True  # learnt from another gateway, say
    first = sse_stream(then_eof=True)
    await asyncio.wait_for(h.servicer.process(None, first), 1.0)  # type: ignore[arg-type]
    assert first.reads == 4  # the wait for a reset ran out, the read found the EOF, then no reset came ...
    assert h.servicer.peer_resets is False  # ... so this peer is taken not to reset streams
    h.servicer.stream_wait_s = h.servicer.close_wait_s = 60.0
    second = sse_stream(then_eof=True)
    await asyncio.wait_for(h.servicer.process(None, second), 1.0)  # type: ignore[arg-type]
    assert second.reads == 4  # read at once, and the stream ended at the EOF
    assert len(h.recorder.completed) == 2 and h.recorder.running == 0


async def test_the_wait_for_the_reset_is_bounded_then_the_stream_reads_on() -> None:
    h = with_plugin(stream_wait_s=0.01)
    h.servicer.peer_resets = True
    ctx = FakeContext([headers_msg(POST), body_msg(body(), True), response_headers_msg(SSE), response_trailers_msg()])
    await h.servicer.process(None, ctx)  # type: ignore[arg-type]
    assert ctx.kinds()[-1] == "response_trailers"  # read after the bound: the trailers are answered
    assert cost(ctx.sent[-1]) == 200 and len(h.recorder.completed) == 1


async def test_a_wait_for_the_reset_that_runs_out_on_a_length_response_unlearns_the_resets() -> None:
    h = with_plugin(close_wait_s=0.0)
    h.servicer.peer_resets = True
    sized = {":status": "200", "content-type": "application/json", "content-length": "42"}
    await h.run([headers_msg(POST), body_msg(body(), True), response_headers_msg(sized)])
    assert h.servicer.peer_resets is False


def evicted_on_signal(h: Harness) -> asyncio.Future[None]:
    """Routes as before, with every request evictable by flow control once the returned future is set."""
    evict: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    route = h.director.route

    async def route_with_eviction(inp: Any) -> Any:
        decision = await route(inp)
        decision.handle.eviction = evict
        return decision

    h.director.route = route_with_eviction  # type: ignore[method-assign]
    return evict


async def test_an_eviction_ends_the_wait_for_the_reset() -> None:
    h = with_plugin()
    h.servicer.peer_resets = True
    evict = evicted_on_signal(h)
    ctx = sse_stream()
    task = asyncio.create_task(h.servicer.process(None, ctx))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert ctx.reads == 3 and not task.done()
    evict.set_result(None)  # flow control takes the request back mid-response
    await asyncio.wait_for(task, 1.0)
    assert ctx.sent[-1].WhichOneof("response") == "immediate_response"
    assert ctx.sent[-1].immediate_response.status.code == 429


class EndingContext(CountingContext):
    """After its script a read waits until the stream ends (`end()`, as grpcio completes a pending read when the
    call finishes) and records whether it was cancelled instead: a cancelled grpcio read leaks its batch."""

    def __init__(self, messages: Any) -> None:
        super().__init__(messages)
        self.ended = asyncio.Event()
        self.cancelled_reads = 0
        self.finished_reads = 0

    async def read(self) -> Any:
        if self._messages:
            return await super().read()
        self.reads += 1
        try:
            await self.ended.wait()
        except asyncio.CancelledError:
            self.cancelled_reads += 1
            raise
        self.finished_reads += 1
        return grpc.aio.EOF

    def end(self) -> None:
        self.ended.set()


async def test_an_eviction_during_a_read_answers_429_and_leaves_the_read_to_end_with_the_stream() -> None:
    h = with_plugin()
    h.servicer.peer_resets = False  # a peer that half-closes: a read stays in flight during the response
    evict = evicted_on_signal(h)
    ctx = EndingContext([headers_msg(POST), body_msg(body(), True), response_headers_msg(SSE)])
    task = asyncio.create_task(h.servicer.process(None, ctx))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert ctx.reads == 4 and not task.done()  # the read after the response headers is waiting
    evict.set_result(None)
    await asyncio.wait_for(task, 1.0)
    assert ctx.sent[-1].WhichOneof("response") == "immediate_response"
    assert ctx.sent[-1].immediate_response.status.code == 429
    ctx.end()  # the call is over: grpcio completes the pending read
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert ctx.cancelled_reads == 0 and ctx.finished_reads == 1
    assert not servicer_module._LEFT_READS  # nothing is kept once the stream is over


async def test_rejections_carry_the_drop_reason() -> None:
    h = Harness(PODS)
    ctx = await h.run([headers_msg(POST, subset=["9.9.9.9:1"]), body_msg(body(), True)])
    ir = ctx.sent[0].immediate_response
    assert ir.status.code == 503
    got = {o.header.key: o.header.raw_value.decode() for o in ir.headers.set_headers}
    assert got["x-llm-d-request-dropped-reason"] == "rejected-no-endpoints"


async def test_model_name_split_across_response_chunks_is_restored() -> None:
    h = Harness(PODS)
    doc = b'{"id":"c1","model":"big-model","choices":[{"text":"hi"}]}'
    for cut in range(len(doc) + 1):
        msgs = [
            headers_msg({**POST, "x-llm-d-model-name-rewrite": "big-model"}, resp_mode=FDS),
            body_msg(body(), True),
            response_headers_msg({":status": "200", "content-type": "application/json", "content-length": "55"}),
            response_body_msg(doc[:cut], False),
            response_body_msg(doc[cut:], True),
        ]
        ctx = await h.run(msgs)
        assert "content-length" in removed(ctx.sent[2], "response_headers")
        out = b"".join(streamed(m, "response_body")[0] for m in ctx.sent[3:])
        assert json.loads(out)["model"] == "m", cut


class Gate(FakeContext):
    """A stream that stops reading after its first messages until `release` is set."""

    def __init__(self, first, rest, release: asyncio.Event) -> None:
        super().__init__(first)
        self._rest = list(rest)
        self._release = release
        self.blocked = asyncio.Event()

    async def read(self):
        if self._messages:
            return self._messages.pop(0)
        if self._rest:
            self.blocked.set()
            await self._release.wait()
            return self._rest.pop(0)
        return grpc.aio.EOF


async def test_held_request_bytes_are_bounded_across_streams_and_released() -> None:
    h = Harness(PODS, servicer_opts={"max_held_request_bytes": 3000})
    release = asyncio.Event()
    data = body(prompt="x" * 2000)
    slow = Gate([headers_msg(POST), body_msg(data[:2000], False)], [body_msg(data[2000:], True)], release)
    task = asyncio.create_task(h.servicer.process(None, slow))  # type: ignore[arg-type]
    await slow.blocked.wait()
    assert h.servicer.held.used == 2000
    # a second request that would take the EPP over the bound is refused at once, the first is unharmed
    ctx = await h.run([headers_msg(POST), body_msg(b"y" * 1500, False), body_msg(b"", True)])
    ir = ctx.sent[0].immediate_response
    assert ir.status.code == 503
    assert {o.header.key for o in ir.headers.set_headers} >= {"retry-after"}
    assert "--max-held-request-bytes" in json.loads(ir.body)["error"]["message"]
    assert h.servicer.held.used == 2000
    release.set()
    await task
    assert slow.kinds()[0] == "request_headers"
    assert h.servicer.held.used == 0
    ctx = await h.run([headers_msg(POST), body_msg(b"y" * 1500, False), body_msg(body(), True)])
    assert ctx.kinds()[0] == "immediate_response"  # 1500 bytes of junk JSON: 400, and nothing stays held
    assert ctx.sent[0].immediate_response.status.code == 400
    assert h.servicer.held.used == 0


async def test_a_message_the_transport_cannot_hold_within_the_held_bytes_gets_503_with_retry_after() -> None:
    """Over the asyncio transport, what has arrived and is not read yet counts against the same bound as the
    bodies the servicer keeps (`--max-held-request-bytes`), in a count of its own. A body chunk that would
    pass it is answered like a body the servicer cannot hold, 503 with Retry-After, before it has all arrived
    (the servicer never sees it whole); nothing stays held, and the next request is routed."""
    h = Harness(PODS, servicer_opts={"max_held_request_bytes": 20_000})
    server = ExtProcServer(
        h.servicer.process,
        pb.ProcessingRequest.FromString,
        max_recv=1 << 20,
        max_send=1 << 20,
        held=HeldBytes(20_000),
    )
    server.bind("127.0.0.1", 0)
    await server.start()
    try:
        client = await H2Client.open(server.port, window=1 << 20)
        client.conn.send_headers(1, GRPC_HEADERS)
        await client.send_all(1, grpc_message(headers_msg(POST).SerializeToString()), end_stream=False)
        chunk = grpc_message(body_msg(b"x" * 100_000, False).SerializeToString())
        await client.send_all(1, chunk[:30_000], end_stream=False)  # 30,000 bytes of a 100,000-byte chunk
        await client.until(lambda: 1 in client.ended)
        data = bytes(client.data[1])
        answer = pb.ProcessingResponse.FromString(data[5 : 5 + int.from_bytes(data[1:5], "big")])
        ir = answer.immediate_response
        assert ir.status.code == 503
        assert {o.header.key for o in ir.headers.set_headers} >= {"retry-after"}
        assert "--max-held-request-bytes" in json.loads(ir.body)["error"]["message"]
        assert client.trailers[1][b"grpc-status"] == b"0"
        assert h.servicer.held.used == 0 and server.held.used == 0

        client.conn.send_headers(3, GRPC_HEADERS)
        small = body(prompt="y" * 3000)
        for message in (headers_msg(POST), body_msg(small, True)):
            await client.send_all(3, grpc_message(message.SerializeToString()), end_stream=False)
        await client.until(lambda: len(client.data.get(3, b"")) >= 5)
        data = bytes(client.data[3])
        answer = pb.ProcessingResponse.FromString(data[5 : 5 + int.from_bytes(data[1:5], "big")])
        assert answer.WhichOneof("response") == "request_headers"  # routed
        await client.close()
    finally:
        await server.stop(None)
    assert h.servicer.held.used == 0


async def test_held_bytes_are_released_when_the_client_goes_away() -> None:
    h = Harness(PODS, servicer_opts={"max_held_request_bytes": 3000})
    try:
        await h.run([headers_msg(POST), body_msg(b"x" * 1000, False)], cancel_at_end=True)
    except asyncio.CancelledError:
        pass
    assert h.servicer.held.used == 0


async def test_endpoint_scores_in_metadata_only_when_asked() -> None:
    for emit in (False, True):
        h = Harness(PODS, servicer_opts={"emit_endpoint_scores": emit})
        ctx = await h.run([headers_msg(POST), body_msg(body(), True)])
        lb = ctx.sent[0].dynamic_metadata.fields["envoy.lb"].struct_value.fields
        assert lb["x-gateway-destination-endpoint"].string_value in ENDPOINTS
        if not emit:
            assert "x-gateway-destination-endpoint-scores" not in lb
            continue
        scores = lb["x-gateway-destination-endpoint-scores"].struct_value.fields
        assert set(scores) == ENDPOINTS
        assert all(isinstance(v.number_value, float) for v in scores.values())


async def test_unclaimed_paths_are_routed_with_the_body_unchanged() -> None:
    h = Harness(PODS)
    payload = b'{"model": "reranker", "query": "q", "documents": ["a", "b"]}'
    ctx = await h.run([headers_msg({**POST, ":path": "/v1/rerank"}), body_msg(payload, True)])
    assert ctx.kinds() == ["request_headers", "request_body"]
    assert set_headers(ctx.sent[0])["x-gateway-destination-endpoint"] in ENDPOINTS
    assert streamed(ctx.sent[1]) == (payload, True)


class Trace:
    def __init__(self) -> None:
        self.phases: list[str] = []
        self.ended: list[int] = []

    def phase(
        self, name: str, start_ns: int, end_ns: int, attributes: Mapping[str, AttributeValue] | None = None
    ) -> None:
        self.phases.append(name)

    def event(self, name: str, attributes: Mapping[str, AttributeValue] | None = None) -> None:
        pass

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        pass

    def inject(self, headers: dict[str, str]) -> None:
        headers["traceparent"] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    def end(self, status: int = 0, error: str = "") -> None:
        self.ended.append(status)


class Tracer:
    enabled = True

    def __init__(self) -> None:
        self.traces: list[Trace] = []

    def start_request(self, request_id: str, headers: Mapping[str, str]) -> RequestTrace:
        self.traces.append(Trace())
        return self.traces[-1]


async def test_trace_per_stream_context_upstream_and_ended_with_the_status() -> None:
    tracer = Tracer()
    h = Harness(PODS)
    h.director.tracer = tracer
    h.servicer = ExtProcServicer(h.director)  # takes the director's tracer
    ctx = await h.run(
        [headers_msg(POST, resp_mode=FDS), body_msg(body(), True), response_headers_msg({":status": "200"}, eos=True)]
    )
    assert set_headers(ctx.sent[0])["traceparent"].startswith("00-0af7")
    (trace,) = tracer.traces
    assert trace.phases == ["parse", "admission", "prepare_data", "schedule", "pre_request"]
    assert trace.ended == [200]
    assert CURRENT_TRACE.get() is None  # reset when the stream ends
    await h.run([headers_msg(POST), body_msg(b"{", True)])
    assert tracer.traces[1].ended == [400]
