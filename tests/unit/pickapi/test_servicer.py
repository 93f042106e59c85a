"""The direct-routing API over a real grpc.aio server and channel, driving a real Director."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from llm_epp.api.v1 import picker_pb2 as pb
from llm_epp.api.v1 import picker_pb2_grpc
from llm_epp.config import load_config_text
from llm_epp.datalayer import Datastore
from llm_epp.datalayer.static import parse_endpoint_list
from llm_epp.extproc.http2_server import ExtProcServer, UnaryMethod
from llm_epp.framework import EndpointKey, EppError, ErrorCode, Metrics, NullRecorder, TypedName
from llm_epp.pickapi import LeaseTable, PickServicer
from llm_epp.pickapi.auth import SERVICE
from llm_epp.pickapi.leases import DEFAULT_TTL_S
from llm_epp.pickapi.servicer import LeaseFinisher, grpc_code
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.parsers import default_parsers
from llm_epp.requestcontrol.decision import Outcome
from llm_epp.requestcontrol.director import Director, RequestPlugins

ENDPOINTS = "10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8001"
HOSTPORTS = {"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8001"}
BODY = json.dumps({"model": "m", "prompt": "hello there"}).encode()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recorder(NullRecorder):
    def __init__(self) -> None:
        self.errors: list[str] = []
        self.completed: list[tuple[Any, ...]] = []
        self.running = 0

    def request_error(self, model: str, target_model: str, error_code: str) -> None:
        self.errors.append(error_code)

    def running_requests(self, model: str, delta: int) -> None:
        self.running += delta

    def request_completed(self, *args: Any) -> None:
        self.completed.append(args)


class RecordingPreRequest:
    typed_name = TypedName("recording-pre-request", "recording")

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pre_request(self, cycle: Any, request: Any, result: Any) -> None:
        self.calls.append(request.request_id)


class PrefixIndexStats:
    typed_name = TypedName("fake-prefix-index", "prefix-index")

    def endpoint_stats(self, key: EndpointKey) -> dict[str, float]:
        return {"blocks": 7.0} if key.name == "10.0.0.1:8000" else {}


class BrokenStats:
    typed_name = TypedName("broken", "broken")

    def endpoint_stats(self, key: EndpointKey) -> dict[str, float]:
        raise RuntimeError("boom")


class Api:
    def __init__(self, transport: str = "grpcio") -> None:
        self.datastore = Datastore()
        self.datastore.replace_all(parse_endpoint_list(ENDPOINTS))
        self.recorder = Recorder()
        self.pre = RecordingPreRequest()
        config = load_config_text(None, builtin_registry(), self.recorder)
        self.director = Director(
            self.datastore.snapshot,
            config.scheduler,
            RequestPlugins(pre_request=[self.pre]),
            self.recorder,
            parsers=default_parsers(),
        )
        self.clock = FakeClock()
        self.leases = LeaseTable(LeaseFinisher(self.director), max_ttl_s=600, clock=self.clock)
        self.servicer = PickServicer(
            self.director,
            self.datastore.snapshot,
            plugins=[*config.plugins.values(), PrefixIndexStats(), BrokenStats()],
            leases=self.leases,
            max_request_body_bytes=1024,
            clock=self.clock,
        )
        self.server: Any
        if transport == "asyncio":  # llm-epp's own server, as `serve` runs it by default
            methods = {
                f"/{SERVICE}/{name}": UnaryMethod(deserialize, fn, serialize)
                for name, (deserialize, fn, serialize) in self.servicer.methods().items()
            }
            self.server = ExtProcServer(None, bytes, max_recv=1 << 22, max_send=1 << 22, unary=methods)
            self.port = self.server.bind("127.0.0.1", 0)
        else:
            self.server = grpc.aio.server()
            self.servicer.add_to_server(self.server)
            self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.channel: grpc.aio.Channel | None = None

    async def start(self) -> picker_pb2_grpc.EndpointPickerStub:
        await self.server.start()
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = picker_pb2_grpc.EndpointPickerStub(self.channel)  # type: ignore[no-untyped-call]
        return self.stub

    async def stop(self) -> None:
        if self.channel is not None:
            await self.channel.close()
        await self.server.stop(None)

    def load(self, hostport: str) -> tuple[int, int]:
        ep = self.datastore.by_hostport(hostport)
        assert ep is not None
        return ep.load.requests, ep.load.tokens

    def total_load(self) -> tuple[int, int]:
        loads = [self.load(hp) for hp in HOSTPORTS]
        return sum(r for r, _ in loads), sum(t for _, t in loads)

    async def pick(self, **fields: Any) -> pb.PickResponse:
        fields.setdefault("body", BODY)
        response: pb.PickResponse = await self.stub.Pick(pb.PickRequest(**fields), timeout=10)
        return response

    async def release(self, lease_id: str, **fields: Any) -> bool:
        response = await self.stub.Release(pb.ReleaseRequest(lease_id=lease_id, **fields), timeout=10)
        return bool(response.released)


@pytest.fixture(params=["grpcio", "asyncio"])
async def api(request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    a = Api(request.param)
    await a.start()
    try:
        yield a
    finally:
        await a.stop()


async def _pick_error(api: Api, **fields: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await api.pick(**fields)
    return info.value


# --- Pick ------------------------------------------------------------------------------------------------
async def test_pick_returns_an_endpoint_of_the_pool_and_scores_for_every_candidate(api: Api) -> None:
    r = await api.pick()
    assert r.endpoint in HOSTPORTS
    assert r.target_model == "m"
    assert r.request_id  # generated
    assert {s.endpoint for s in r.scores} == HOSTPORTS
    assert {s.name for s in r.scores} == HOSTPORTS  # static endpoints are named after their address
    for s in r.scores:
        assert set(s.plugins) == {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"}
        assert s.total == pytest.approx(sum(s.plugins.values()))
    totals = [s.total for s in r.scores]
    assert totals == sorted(totals, reverse=True)
    assert r.scores[0].total == max(totals)
    assert r.lease_id
    assert r.lease_expires_in_seconds == DEFAULT_TTL_S
    assert r.rewritten_body == b""


async def test_request_id_header_is_honoured(api: Api) -> None:
    r = await api.pick(headers={"X-Request-Id": "abc-123"})
    assert r.request_id == "abc-123"
    assert api.pre.calls == ["abc-123"]


async def test_path_selects_the_api(api: Api) -> None:
    chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    r = await api.pick(path="/v1/chat/completions", body=chat)
    assert r.endpoint in HOSTPORTS
    err = await _pick_error(api, path="/v1/chat/completions", body=BODY)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "messages" in (err.details() or "")


async def test_dry_run_reserves_nothing_and_runs_no_pre_request_hook(api: Api) -> None:
    r = await api.pick(dry_run=True)
    assert r.endpoint in HOSTPORTS
    assert {s.endpoint for s in r.scores} == HOSTPORTS
    assert r.lease_id == ""
    assert r.lease_expires_in_seconds == 0
    assert api.total_load() == (0, 0)
    assert api.pre.calls == []
    assert len(api.leases) == 0
    assert api.recorder.running == 0


async def test_pick_reserves_load_and_release_frees_it_exactly_once(api: Api) -> None:
    r = await api.pick(headers={"x-request-id": "r1"})
    requests, tokens = api.load(r.endpoint)
    assert requests == 1 and tokens > 0
    assert api.total_load() == (1, tokens)
    assert api.pre.calls == ["r1"]
    assert api.recorder.running == 1

    usage = pb.Usage(prompt_tokens=12, completion_tokens=30, cached_tokens=4)
    assert await api.release(r.lease_id, usage=usage, success=True) is True
    assert api.total_load() == (0, 0)
    assert api.recorder.running == 0
    assert len(api.recorder.completed) == 1
    assert api.recorder.completed[0][-3:] == (12, 30, 4)

    assert await api.release(r.lease_id, success=True) is False
    assert api.total_load() == (0, 0)
    assert api.recorder.running == 0
    assert len(api.recorder.completed) == 1


async def test_release_of_a_failed_request_counts_a_model_server_error(api: Api) -> None:
    r = await api.pick()
    assert await api.release(r.lease_id, success=False) is True
    assert api.recorder.errors == [ErrorCode.MODEL_SERVER_ERROR.value]
    assert api.total_load() == (0, 0)


async def test_release_of_an_unknown_lease_is_not_an_error(api: Api) -> None:
    assert await api.release("no-such-lease") is False
    assert await api.release("") is False


async def test_expired_lease_is_released_by_the_sweeper(api: Api) -> None:
    r = await api.pick(lease_ttl_seconds=2)
    assert r.lease_expires_in_seconds == 2
    assert api.total_load()[0] == 1
    api.clock.now += 1
    assert api.leases.sweep() == 0
    assert api.total_load()[0] == 1
    api.clock.now += 1.5
    assert api.leases.sweep() == 1
    assert api.total_load() == (0, 0)
    assert api.recorder.running == 0
    assert api.recorder.completed == []  # expired = incomplete: no completion metrics
    assert await api.release(r.lease_id, success=True) is False


async def test_lease_ttl_is_capped_at_the_server_maximum(api: Api) -> None:
    r = await api.pick(lease_ttl_seconds=1_000_000)
    assert r.lease_expires_in_seconds == 600


async def test_stopping_the_sweeper_releases_outstanding_leases(api: Api) -> None:
    sweeper = asyncio.create_task(api.leases.run())
    first = await api.pick()
    await api.pick()
    assert api.total_load()[0] == 2
    sweeper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sweeper
    assert api.total_load() == (0, 0)
    assert await api.release(first.lease_id) is False


async def test_subset_restricts_the_candidates(api: Api) -> None:
    r = await api.pick(subset=pb.EndpointSubset(endpoints=["10.0.0.3:8001"]))
    assert r.endpoint == "10.0.0.3:8001"
    assert [s.endpoint for s in r.scores] == ["10.0.0.3:8001"]
    r = await api.pick(subset=pb.EndpointSubset(endpoints=["10.0.0.2"]), dry_run=True)  # bare IP: any port
    assert r.endpoint == "10.0.0.2:8000"


async def test_explicit_empty_subset_is_unavailable(api: Api) -> None:
    request = pb.PickRequest(body=BODY)
    request.subset.SetInParent()  # present, with no entries
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await api.stub.Pick(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "subset" in (info.value.details() or "")
    assert api.total_load() == (0, 0)
    assert len(api.leases) == 0


async def test_bad_json_is_invalid_argument_with_the_message(api: Api) -> None:
    err = await _pick_error(api, body=b"{not json")
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not valid JSON" in (err.details() or "")
    assert len(api.leases) == 0


async def test_body_over_the_limit_is_invalid_argument(api: Api) -> None:
    body = json.dumps({"model": "m", "prompt": "x" * 2000}).encode()
    err = await _pick_error(api, body=body)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "limit of 1024 bytes" in (err.details() or "")
    assert api.recorder.errors == [ErrorCode.PAYLOAD_TOO_LARGE.value]
    assert api.total_load() == (0, 0)


async def test_empty_pool_is_unavailable(api: Api) -> None:
    api.datastore.clear()
    err = await _pick_error(api)
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "no endpoints" in (err.details() or "")


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (ErrorCode.BAD_REQUEST, grpc.StatusCode.INVALID_ARGUMENT),
        (ErrorCode.NOT_FOUND, grpc.StatusCode.NOT_FOUND),
        (ErrorCode.PAYLOAD_TOO_LARGE, grpc.StatusCode.INVALID_ARGUMENT),
        (ErrorCode.RESOURCE_EXHAUSTED, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (ErrorCode.SERVICE_UNAVAILABLE, grpc.StatusCode.UNAVAILABLE),
        (ErrorCode.INTERNAL, grpc.StatusCode.INTERNAL),
        (ErrorCode.UNAUTHORIZED, grpc.StatusCode.UNAUTHENTICATED),
        (ErrorCode.FORBIDDEN, grpc.StatusCode.PERMISSION_DENIED),
    ],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_error_code_mapping(code: ErrorCode, status: grpc.StatusCode) -> None:
    assert grpc_code(EppError(code, "x")) == status


# --- ListEndpoints ---------------------------------------------------------------------------------------
async def test_list_endpoints_shows_metrics_age_load_and_plugin_stats(api: Api) -> None:
    scraped = api.datastore.by_hostport("10.0.0.1:8000")
    assert scraped is not None
    api.datastore.update_metrics(
        scraped.key,
        Metrics(
            waiting_queue_size=3,
            running_requests=2,
            kv_cache_usage=0.25,
            active_models=frozenset({"lora-b", "lora-a"}),
            waiting_models=frozenset({"lora-c"}),
            max_active_models=4,
            cache_block_size=16,
            cache_num_blocks=1000,
            update_time=api.clock.now - 4.0,
        ),
    )
    picked = await api.pick(subset=pb.EndpointSubset(endpoints=["10.0.0.2:8000"]))
    listing = await api.stub.ListEndpoints(pb.ListEndpointsRequest(), timeout=10)
    by_hostport = {e.hostport: e for e in listing.endpoints}
    assert set(by_hostport) == HOSTPORTS

    one = by_hostport["10.0.0.1:8000"]
    assert (one.address, one.port, one.name) == ("10.0.0.1", 8000, "10.0.0.1:8000")
    assert one.engine == "vllm"
    assert one.has_metrics is True
    assert one.metrics_age_seconds == pytest.approx(4.0)
    m = one.metrics
    assert (m.waiting_queue_size, m.running_requests, m.kv_cache_usage) == (3, 2, 0.25)
    assert list(m.active_lora_adapters) == ["lora-a", "lora-b"]
    assert list(m.waiting_lora_adapters) == ["lora-c"]
    assert (m.max_loras, m.cache_block_size, m.cache_num_blocks) == (4, 16, 1000)
    assert dict(one.stats) == {"prefix-index/blocks": 7.0}  # the broken plugin is left out
    assert (one.in_flight_requests, one.in_flight_tokens) == (0, 0)

    two = by_hostport["10.0.0.2:8000"]
    assert two.has_metrics is False
    assert two.metrics_age_seconds == -1.0
    assert two.in_flight_requests == 1
    assert two.in_flight_tokens == api.load("10.0.0.2:8000")[1] > 0
    assert dict(two.stats) == {}

    assert await api.release(picked.lease_id, success=True)
    listing = await api.stub.ListEndpoints(pb.ListEndpointsRequest(), timeout=10)
    assert all(e.in_flight_requests == 0 and e.in_flight_tokens == 0 for e in listing.endpoints)


@pytest.mark.parametrize("method", ["Pick", "Release", "ListEndpoints"])
async def test_malformed_protobuf_is_invalid_argument_with_a_plain_message(api: Api, method: str) -> None:
    assert api.channel is not None
    call = api.channel.unary_unary(
        f"/llm_epp.v1.EndpointPicker/{method}", request_serializer=None, response_deserializer=None
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(b"\xff\xff\xff\xff\x0f not a protobuf message")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.value.details() or ""
    assert details.startswith("the request is not a valid llm_epp.v1.")
    assert "Error" not in details and "Traceback" not in details
    assert api.total_load() == (0, 0)


async def test_a_lease_keeps_no_request_bytes(api: Api) -> None:
    body = json.dumps({"model": "m", "prompt": "p" * 500}).encode()
    resp = await api.stub.Pick(pb.PickRequest(path="/v1/completions", body=body))
    handle = api.leases.take(resp.lease_id)
    assert handle is not None
    held = [getattr(handle, name) for name in type(handle).__slots__]
    assert not any(isinstance(value, bytes | bytearray) for value in held)
    api.servicer.director.finish(handle, Outcome(complete=True))
    assert api.total_load() == (0, 0)
