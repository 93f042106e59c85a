"""The ext_proc stream state machine, driven by scripted Envoy messages."""

from __future__ import annotations

import asyncio
import gc
import json

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from llm_epp.framework import Metrics
from tests.unit.extproc.fake_envoy import (
    BUFFERED,
    FDS,
    NONE,
    FakeContext,
    Harness,
    body_msg,
    headers_msg,
    request_trailers_msg,
    response_body_msg,
    response_headers_msg,
    response_trailers_msg,
)

POST = {":method": "POST", ":path": "/v1/completions", "content-type": "application/json"}
ENDPOINTS = {"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8001"}


def body(**kw: object) -> bytes:
    payload = {"model": "m", "prompt": "hello"}
    payload.update(kw)
    return json.dumps(payload).encode()


def set_headers(resp: pb.ProcessingResponse, field: str = "request_headers") -> dict[str, str]:
    common = getattr(resp, field).response
    return {o.header.key: o.header.raw_value.decode() for o in common.header_mutation.set_headers}


def removed(resp: pb.ProcessingResponse, field: str = "request_headers") -> list[str]:
    return list(getattr(resp, field).response.header_mutation.remove_headers)


def metadata_destination(resp: pb.ProcessingResponse) -> str:
    return resp.dynamic_metadata.fields["envoy.lb"].struct_value.fields["x-gateway-destination-endpoint"].string_value


def streamed(resp: pb.ProcessingResponse, field: str = "request_body") -> tuple[bytes, bool]:
    sr = getattr(resp, field).response.body_mutation.streamed_response
    return sr.body, sr.end_of_stream


async def test_fds_withholds_headers_until_body_complete_then_routes(harness: Harness) -> None:
    data = body()
    ctx = await harness.run(
        [headers_msg(POST), body_msg(data[:10], False), body_msg(data[10:], False), body_msg(b"", True)]
    )
    assert ctx.kinds() == ["request_headers", "request_body"]
    hdrs = set_headers(ctx.sent[0])
    dest = hdrs["x-gateway-destination-endpoint"]
    assert dest in ENDPOINTS
    assert metadata_destination(ctx.sent[0]) == dest
    assert hdrs["content-length"] == str(len(data))
    assert ctx.sent[0].request_headers.response.clear_route_cache
    assert streamed(ctx.sent[1]) == (data, True)


async def test_generated_request_id_is_injected_and_kept_when_present(harness: Harness) -> None:
    ctx = await harness.run([headers_msg(POST), body_msg(body(), True)])
    assert len(set_headers(ctx.sent[0])["x-request-id"]) == 36
    ctx = await harness.run([headers_msg({**POST, "x-request-id": "abc"}), body_msg(body(), True)])
    assert "x-request-id" not in set_headers(ctx.sent[0])


async def test_large_body_is_rechunked_below_62000_bytes(harness: Harness) -> None:
    data = body(prompt="x" * 200_000)
    ctx = await harness.run([headers_msg(POST), body_msg(data, True)])
    chunks = [streamed(m) for m in ctx.sent[1:]]
    assert all(len(c) <= 62_000 for c, _ in chunks)
    assert b"".join(c for c, _ in chunks) == data
    assert [eos for _, eos in chunks] == [False] * (len(chunks) - 1) + [True]


async def test_buffered_mode_answers_headers_then_routes_on_body(harness: Harness) -> None:
    ctx = await harness.run([headers_msg(POST, req_mode=BUFFERED), body_msg(body(), True)])
    assert ctx.kinds() == ["request_headers", "request_body"]
    assert not ctx.sent[0].request_headers.response.header_mutation.set_headers
    hdrs = set_headers(ctx.sent[1], "request_body")
    assert hdrs["x-gateway-destination-endpoint"] in ENDPOINTS
    assert metadata_destination(ctx.sent[1]) == hdrs["x-gateway-destination-endpoint"]
    assert not ctx.sent[1].request_body.response.body_mutation.body  # unchanged body is not resent


async def test_buffered_mode_model_rewrite_resends_body_with_length(harness: Harness) -> None:
    msgs = [
        headers_msg({**POST, "x-gateway-model-name-rewrite": "big-model"}, req_mode=BUFFERED),
        body_msg(body(), True),
    ]
    ctx = await harness.run(msgs)
    new = ctx.sent[1].request_body.response.body_mutation.body
    assert json.loads(new)["model"] == "big-model"
    assert set_headers(ctx.sent[1], "request_body")["content-length"] == str(len(new))


async def test_bodyless_request_is_routed_at_once(harness: Harness) -> None:
    ctx = await harness.run([headers_msg({":method": "GET", ":path": "/v1/models"}, eos=True)])
    assert ctx.kinds() == ["request_headers"]
    assert set_headers(ctx.sent[0])["x-gateway-destination-endpoint"] in ENDPOINTS
    assert "content-length" not in set_headers(ctx.sent[0])


@pytest.mark.parametrize(
    ("subset", "expected"),
    [
        (["10.0.0.2:8000"], {"10.0.0.2:8000"}),
        (["10.0.0.3"], {"10.0.0.3:8001"}),
        ("10.0.0.1:8000,10.0.0.2:8000", {"10.0.0.1:8000", "10.0.0.2:8000"}),
        (["10.0.0.3:8000"], set()),  # port-aware: 10.0.0.3 only serves on 8001
        ([], set()),
    ],
    ids=["exact", "ip-only", "comma-string", "wrong-port", "empty"],
)
async def test_subset_hint(harness: Harness, subset: object, expected: set[str]) -> None:
    seen = set()
    for _ in range(30):
        ctx = await harness.run([headers_msg(POST, subset=subset), body_msg(body(), True)])
        first = ctx.sent[0]
        if first.HasField("immediate_response"):
            assert first.immediate_response.status.code == 503
            assert not expected
            return
        seen.add(set_headers(first)["x-gateway-destination-endpoint"])
    assert seen == expected


async def test_subset_hint_ignored_when_disabled() -> None:
    h = Harness("10.0.0.1:8000,10.0.0.2:8000", disable_subset_filter=True)
    ctx = await h.run([headers_msg(POST, subset=[]), body_msg(body(), True)])
    assert ctx.kinds()[0] == "request_headers"


CONFORMANCE_CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: header-based-testing-filter
- type: max-score-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: header-based-testing-filter
  - pluginRef: max-score-picker
"""


async def test_conformance_selection_header_needs_the_filter_plugin(harness: Harness) -> None:
    picked = set()
    for _ in range(24):  # the default config: the header picks nothing, load spreads the requests
        ctx = await harness.run(
            [headers_msg({**POST, "test-epp-endpoint-selection": "10.0.0.3:8001"}), body_msg(body(), True)]
        )
        picked.add(set_headers(ctx.sent[0])["x-gateway-destination-endpoint"])
    assert picked == ENDPOINTS
    h = Harness("10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8001", config=CONFORMANCE_CONFIG)
    for _ in range(5):
        ctx = await h.run(
            [headers_msg({**POST, "test-epp-endpoint-selection": "10.0.0.3:8001"}), body_msg(body(), True)]
        )
        assert set_headers(ctx.sent[0])["x-gateway-destination-endpoint"] == "10.0.0.3:8001"


async def test_client_control_headers_are_removed(harness: Harness) -> None:
    control = {
        "x-gateway-destination-endpoint-served": "x",
        "x-llm-d-request-dropped-reason": "x",
        "x-llm-d-inference-objective": "o",
        "x-gateway-inference-objective": "o",
        "x-llm-d-inference-fairness-id": "f",
        "x-gateway-inference-fairness-id": "f",
        "x-llm-d-model-name-rewrite": "m",
        "x-gateway-model-name-rewrite": "m",
        "x-gateway-destination-endpoint-subset": "1.2.3.4:5",
    }
    hdrs = {**POST, "x-gateway-destination-endpoint": "6.6.6.6:1", **control}
    ctx = await harness.run([headers_msg(hdrs), body_msg(body(), True)])
    assert set_headers(ctx.sent[0])["x-gateway-destination-endpoint"] in ENDPOINTS
    assert set(removed(ctx.sent[0])) == set(control)


async def test_a_client_destination_header_is_overwritten_not_removed(harness: Harness) -> None:
    """The EPP sets the destination itself, so a client's copy is replaced by the set, and no other header goes."""
    ctx = await harness.run(
        [headers_msg({**POST, "x-gateway-destination-endpoint": "6.6.6.6:1"}), body_msg(body(), True)]
    )
    assert set_headers(ctx.sent[0])["x-gateway-destination-endpoint"] in ENDPOINTS
    assert removed(ctx.sent[0]) == []


@pytest.mark.parametrize(
    ("path", "payload", "fragment"),
    [
        ("/v1/completions", b"{not json", "not valid JSON"),
        ("/v1/completions", b"[1, 2]", "JSON object"),
        ("/v1/completions", b'{"prompt": "x"}', "model not found"),
        ("/v1/completions", b'{"model": "m"}', "prompt"),
        ("/v1/chat/completions", b'{"model": "m", "messages": []}', "messages"),
        ("/v1/embeddings", b'{"model": "m"}', "input"),
    ],
    ids=["bad-json", "not-object", "no-model", "no-prompt", "no-messages", "no-input"],
)
async def test_bad_requests_get_400_with_openai_error(
    harness: Harness, path: str, payload: bytes, fragment: str
) -> None:
    ctx = await harness.run([headers_msg({**POST, ":path": path}), body_msg(payload, True)])
    assert ctx.kinds() == ["immediate_response"]
    ir = ctx.sent[0].immediate_response
    assert ir.status.code == 400
    err = json.loads(ir.body)["error"]
    assert fragment in err["message"]
    assert err["type"] == "invalid_request_error" and err["code"] == "BadRequest"
    assert harness.recorder.errors == ["BadRequest"]


async def test_body_over_limit_gets_413_and_stops_reading() -> None:
    h = Harness("10.0.0.1:8000", max_body=1000)
    ctx = await h.run(
        [headers_msg(POST), body_msg(b"x" * 600, False), body_msg(b"x" * 600, False), body_msg(b"", True)]
    )
    assert ctx.kinds() == ["immediate_response"]
    assert ctx.sent[0].immediate_response.status.code == 413
    assert "1000 bytes" in json.loads(ctx.sent[0].immediate_response.body)["error"]["message"]


async def test_empty_pool_gets_503() -> None:
    h = Harness("10.0.0.1:8000")
    h.datastore.clear()
    ctx = await h.run([headers_msg(POST), body_msg(body(), True)])
    assert ctx.sent[0].immediate_response.status.code == 503


async def test_request_trailers_end_the_body(harness: Harness) -> None:
    data = body()
    ctx = await harness.run([headers_msg(POST), body_msg(data, False), request_trailers_msg()])
    assert ctx.kinds() == ["request_headers", "request_body", "request_trailers"]
    assert streamed(ctx.sent[1]) == (data, False)


async def test_streamed_response_is_echoed_and_usage_read_across_split_lines(harness: Harness) -> None:
    usage_line = b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}\n\n'
    chunks = [b'data: {"choices":[{"text":"a"}]}\n\n' + usage_line[:25], usage_line[25:], b"data: [DONE]\n\n"]
    msgs = [
        headers_msg(POST, resp_mode=FDS),
        body_msg(body(stream=True), True),
        response_headers_msg({":status": "200", "content-type": "text/event-stream"}),
        response_body_msg(chunks[0], False),
        response_body_msg(chunks[1], False),
        response_body_msg(chunks[2], True),
    ]
    ctx = await harness.run(msgs)
    assert ctx.kinds() == ["request_headers", "request_body", "response_headers"] + ["response_body"] * 3
    echoed = [streamed(m, "response_body") for m in ctx.sent[3:]]
    assert b"".join(c for c, _ in echoed) == b"".join(chunks)
    assert echoed[-1][1] is True
    (completed,) = harness.recorder.completed
    assert completed[-3:] == (7, 3, 0)
    assert harness.recorder.running == 0


async def test_non_streamed_response_usage_and_served_endpoint_header(harness: Harness) -> None:
    resp = json.dumps(
        {
            "object": "text_completion",
            "model": "m",
            "usage": {
                "prompt_tokens": 5,
                "completion_tokens": 2,
                "prompt_tokens_details": {"cached_tokens": 4},
            },
        }
    ).encode()
    msgs = [
        headers_msg(POST, resp_mode=FDS),
        body_msg(body(), True),
        response_headers_msg({":status": "200", "content-type": "application/json"}, served="10.0.0.2:8000"),
        response_body_msg(resp[:20], False),
        response_body_msg(resp[20:], True),
    ]
    ctx = await harness.run(msgs)
    answered = set_headers(ctx.sent[2], "response_headers")
    assert answered == {"x-went-into-resp-headers": "true"}  # no internal address reaches the client
    assert harness.recorder.completed[0][-3:] == (5, 2, 4)


async def test_model_name_is_swapped_back_in_responses(harness: Harness) -> None:
    msgs = [
        headers_msg({**POST, "x-gateway-model-name-rewrite": "big"}, resp_mode=FDS),
        body_msg(body(), True),
        response_headers_msg({":status": "200", "content-type": "application/json", "content-length": "30"}),
        response_body_msg(b'{"model":"big","x":1}', True),
    ]
    ctx = await harness.run(msgs)
    assert json.loads(streamed(ctx.sent[1])[0])["model"] == "big"
    assert "content-length" in removed(ctx.sent[2], "response_headers")
    assert streamed(ctx.sent[3], "response_body")[0] == b'{"model":"m","x":1}'


async def test_response_trailers_are_answered(harness: Harness) -> None:
    msgs = [
        headers_msg(POST, resp_mode=FDS),
        body_msg(body(), True),
        response_headers_msg({":status": "200", "content-type": "application/grpc"}),
        response_body_msg(b"abc", False),
        response_trailers_msg(),
    ]
    ctx = await harness.run(msgs)
    assert ctx.kinds()[-1] == "response_trailers"
    assert len(harness.recorder.completed) == 1


async def test_body_mode_none_completes_when_envoy_closes_the_stream(harness: Harness) -> None:
    # Envoy half-closes the stream once the response has passed, then resets it: the request ends at the
    # half-close, and the stream waits for the reset on a timer rather than send a status the reset would catch.
    ctx = FakeContext([headers_msg(POST), body_msg(body(), True), response_headers_msg({":status": "200"})])
    task = asyncio.create_task(harness.servicer.process(None, ctx))  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    assert ctx.kinds() == ["request_headers", "request_body", "response_headers"]
    assert len(harness.recorder.completed) == 1
    assert harness.recorder.running == 0
    assert not task.done()
    task.cancel()  # the reset
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(harness.recorder.completed) == 1  # counted once
    assert harness.servicer.peer_resets is True


async def test_body_mode_none_half_close_only_peer_is_learnt_and_not_waited_for_again(harness: Harness) -> None:
    harness.servicer.close_wait_s = 0.01
    msgs = [headers_msg(POST), body_msg(body(), True), response_headers_msg({":status": "200"})]
    await asyncio.wait_for(harness.run(msgs), 1.0)  # waits for a reset that does not come
    assert harness.servicer.peer_resets is False
    harness.servicer.close_wait_s = 60.0
    await asyncio.wait_for(harness.run(msgs), 1.0)  # ends at the half-close: this peer is known not to reset
    assert len(harness.recorder.completed) == 2 and harness.recorder.running == 0


class BatchContext(FakeContext):
    """A write completes like grpcio's: its batch finishes on the loop, and only then does the write coroutine
    resume and free it. `reset_with` names the answer whose completion Envoy's reset arrives with: the handler
    task is cancelled in the same loop turn, before it resumes (a busy event loop)."""

    def __init__(self, messages: list[pb.ProcessingRequest], reset_with: str) -> None:
        super().__init__(messages)
        self.reset_with = reset_with
        self.handler: asyncio.Task[None] | None = None
        self.unfreed = 0  # batches completed whose write coroutine never resumed

    fail_last = False  # the last write's batch fails (the reset came first) instead of completing
    reset_first = False  # the reset cancels the handler a loop turn before the last write's batch ends

    async def write(self, data: bytes) -> None:
        self.sent.append(pb.ProcessingResponse.FromString(data))
        loop = asyncio.get_running_loop()
        batch: asyncio.Future[None] = loop.create_future()
        reset = self.kinds()[-1] == self.reset_with

        def end_batch() -> None:
            if reset and self.fail_last:
                batch.set_exception(RuntimeError("batch failed: the call was cancelled"))
            else:
                batch.set_result(None)

        def complete() -> None:
            if not (reset and self.reset_first):
                end_batch()
            if reset and self.handler is not None:
                self.handler.cancel()
            if reset and self.reset_first:
                loop.call_later(0.01, end_batch)  # the batch ends after the handler has seen the reset

        loop.call_soon(complete)
        self.unfreed += 1
        try:
            await batch
        except asyncio.CancelledError:
            raise  # thrown into the write: grpcio never frees this batch
        except Exception:
            self.unfreed -= 1  # a failed batch resumes the write, which frees it and raises
            raise
        self.unfreed -= 1


@pytest.mark.parametrize(
    ("resp_mode", "headers", "tail", "last"),
    [
        (NONE, {":status": "200", "content-length": "12"}, [], "response_headers"),
        (NONE, {":status": "200", "content-type": "text/event-stream"}, [], "response_headers"),
        (FDS, {":status": "200"}, [response_body_msg(b"{}", True)], "response_body"),
    ],
)
async def test_a_reset_arriving_with_the_last_answer_lets_its_write_finish(
    harness: Harness, resp_mode: int, headers: dict[str, str], tail: list[pb.ProcessingRequest], last: str
) -> None:
    harness.servicer.peer_resets = True  # Envoy, as learnt from earlier streams
    msgs = [headers_msg(POST, resp_mode=resp_mode), body_msg(body(), True), response_headers_msg(headers), *tail]
    ctx = BatchContext(msgs, reset_with=last)
    task = asyncio.create_task(harness.servicer.process(None, ctx))  # type: ignore[arg-type]
    ctx.handler = task
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 1.0)
    await asyncio.sleep(0)
    assert ctx.kinds()[-1] == last
    assert ctx.unfreed == 0, "the last write's coroutine resumed after its batch completed"
    assert len(harness.recorder.completed) == 1 and harness.recorder.running == 0


@pytest.mark.parametrize(
    ("max_body", "empty_pool", "status"),
    [(1000, False, 413), (16 << 20, True, 503)],
)
async def test_a_reset_arriving_with_a_rejection_lets_its_write_finish(
    max_body: int, empty_pool: bool, status: int
) -> None:
    h = Harness("10.0.0.1:8000", max_body=max_body)
    if empty_pool:
        h.datastore.clear()
    halves = (b"x" * 600, b"x" * 600) if not empty_pool else (body()[:10], body()[10:])  # too long, or routable
    msgs = [headers_msg(POST), body_msg(halves[0], False), body_msg(halves[1], True)]
    ctx = BatchContext(msgs, reset_with="immediate_response")
    task = asyncio.create_task(h.servicer.process(None, ctx))  # type: ignore[arg-type]
    ctx.handler = task
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 1.0)
    await asyncio.sleep(0)
    assert ctx.kinds()[-1] == "immediate_response"
    assert ctx.sent[-1].immediate_response.status.code == status
    assert ctx.unfreed == 0, "the rejection's write coroutine resumed after its batch completed"


@pytest.mark.parametrize("reset_first", [False, True], ids=["batch-then-reset", "reset-then-batch"])
async def test_a_last_write_that_fails_after_the_reset_is_not_reported_as_unhandled(
    harness: Harness, reset_first: bool
) -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        harness.servicer.peer_resets = True
        msgs = [
            headers_msg(POST),
            body_msg(body(), True),
            response_headers_msg({":status": "200", "content-length": "2"}),
        ]
        ctx = BatchContext(msgs, reset_with="response_headers")
        ctx.fail_last = True
        ctx.reset_first = reset_first
        task = asyncio.create_task(harness.servicer.process(None, ctx))  # type: ignore[arg-type]
        ctx.handler = task
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 1.0)
        await asyncio.sleep(0.05)  # the batch has ended (failed) by now
        assert ctx.unfreed == 0
        del task, ctx
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert reported == []
    assert len(harness.recorder.completed) == 1 and harness.recorder.running == 0


async def test_client_cancel_releases_without_completion(harness: Harness) -> None:
    with pytest.raises(asyncio.CancelledError):
        await harness.run([headers_msg(POST), body_msg(body(), True)], cancel_at_end=True)
    assert harness.recorder.running == 0
    assert harness.recorder.completed == []


async def test_stream_closed_before_response_is_not_a_completion(harness: Harness) -> None:
    await harness.run([headers_msg(POST), body_msg(body(), True)])
    assert harness.recorder.running == 0
    assert harness.recorder.completed == []


async def test_body_mode_none_cancel_after_response_headers_is_a_completion(harness: Harness) -> None:
    # Envoy (response trailer mode SEND, body NONE) cancels the stream when the response ends.
    with pytest.raises(asyncio.CancelledError):
        await harness.run(
            [headers_msg(POST), body_msg(body(), True), response_headers_msg({":status": "200"})], cancel_at_end=True
        )
    assert len(harness.recorder.completed) == 1
    assert harness.recorder.running == 0


async def test_completion_counts_when_envoy_resets_during_the_last_answer(harness: Harness) -> None:
    msgs = [
        headers_msg(POST, resp_mode=FDS),
        body_msg(body(), True),
        response_headers_msg({":status": "200", "content-type": "text/event-stream"}),
        response_body_msg(b'data: {"usage": {"prompt_tokens": 2, "completion_tokens": 1}}\n\n', False),
        response_body_msg(b"data: [DONE]\n\n", True),
    ]
    with pytest.raises(asyncio.CancelledError):
        await harness.run(msgs, cancel_on_write=4)  # the echo of the last chunk
    assert len(harness.recorder.completed) == 1
    assert harness.recorder.completed[0][-3:] == (2, 1, 0)
    assert harness.recorder.running == 0


@pytest.mark.parametrize(
    ("enabled", "asked", "present"), [(True, True, True), (True, False, False), (False, True, False)]
)
async def test_explain_header(enabled: bool, asked: bool, present: bool) -> None:
    h = Harness("10.0.0.1:8000,10.0.0.2:8000", explain=enabled)
    h.datastore.update_metrics(h.datastore.snapshot()[1].key, Metrics(waiting_queue_size=4, kv_cache_usage=0.5))
    hdrs = {**POST, **({"x-llm-epp-explain": "1"} if asked else {})}
    ctx = await h.run(
        [headers_msg(hdrs, resp_mode=FDS), body_msg(body(), True), response_headers_msg({":status": "200"})]
    )
    got = set_headers(ctx.sent[2], "response_headers").get("x-gateway-destination-endpoint-scores")
    if not present:
        assert got is None
        return
    assert got is not None
    first, second = got.split(", ")
    assert first == "10.0.0.1:8000;total=4;queue-scorer=2;kv-cache-utilization-scorer=2;prefix-cache-scorer=0"
    assert second == "10.0.0.2:8000;total=1;queue-scorer=0;kv-cache-utilization-scorer=1;prefix-cache-scorer=0"


async def test_an_unexpected_failure_becomes_a_stream_error_and_releases_nothing_twice(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("scheduler bug")

    monkeypatch.setattr(harness.director.scheduler, "schedule", broken)
    with pytest.raises(RuntimeError, match="scheduler bug"):  # grpc.aio turns it into a stream error
        await harness.run([headers_msg(POST), body_msg(body(), True)])
    assert harness.recorder.running == 0
    assert harness.recorder.completed == []
