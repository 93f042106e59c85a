"""Tests for the metrics runtime against real loopback model-server stand-ins: metrics flow into the
datastore per engine, broken endpoints go stale with one logged reason while the others keep updating,
pollers follow membership changes, pool gauges, and clean cancellation."""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llm_epp.datalayer.datastore import Datastore
from llm_epp.datalayer.runtime import EndpointState, MetricsRuntime, ReachabilityProbe
from llm_epp.datalayer.scrape import unreachable
from llm_epp.framework import EndpointKey, EndpointMetadata, Metrics, TypedName
from llm_epp.framework.datalayer import Extraction, ScrapedPage, is_stale
from llm_epp.plugins.datalayer.core_metrics_extractor import CoreMetricsExtractor
from llm_epp.plugins.datalayer.metrics_data_source import MetricsDataSource
from tests.unit.datalayer.page_server import PageServer, Route

TESTDATA = Path(__file__).parent / "testdata"
ENGINE_LABEL = "inference.networking.k8s.io/engine-type"
LOGGER = "llm_epp.datalayer.runtime"


def page(name: str) -> bytes:
    return (TESTDATA / name).read_bytes()


def endpoint(name: str, port: int, engine: str | None = None) -> EndpointMetadata:
    labels = {ENGINE_LABEL: engine} if engine else {}
    return EndpointMetadata(EndpointKey("ns", name), "127.0.0.1", port, labels=labels)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def eventually(check: Callable[[], bool]) -> None:
    """Waits up to 5 s for `check()`; the conditions are other tasks' side effects, so poll them."""
    async with asyncio.timeout(5.0):
        while not check():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


def state_of(runtime: MetricsRuntime, name: str) -> EndpointState:
    return runtime.state(EndpointKey("ns", name)) or EndpointState()


def metrics_of(ds: Datastore, name: str) -> Metrics:
    return next(e.metrics for e in ds.snapshot() if e.key.name == name)


@dataclass
class FakeGauges:
    calls: list[tuple[str, float, float, float, int, dict[str, float]]] = field(default_factory=list)

    def set_pool_gauges(
        self,
        pool_name: str,
        avg_kv: float,
        avg_queue: float,
        avg_running: float,
        ready_pods: int,
        per_pod_queue: Mapping[str, float],
    ) -> None:
        self.calls.append((pool_name, avg_kv, avg_queue, avg_running, ready_pods, dict(per_pod_queue)))


@asynccontextmanager
async def running(runtime: MetricsRuntime) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(runtime.run())
    try:
        yield task
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def make_runtime(ds: Datastore, **kw: object) -> MetricsRuntime:
    options: dict[str, object] = {"interval": 0.02, "poll_timeout": 0.3, "staleness": 0.5, "rng": random.Random(7)}
    options.update(kw)
    return MetricsRuntime(ds, MetricsDataSource(), CoreMetricsExtractor(), **options)  # type: ignore[arg-type]


@pytest.fixture
async def servers() -> AsyncIterator[Callable[[Route], Awaitable[PageServer]]]:
    started: list[PageServer] = []

    async def start(route: Route) -> PageServer:
        srv = await PageServer({"/metrics": route}).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        await srv.stop()


async def test_each_engine_page_lands_in_the_datastore(servers: Callable[[Route], Awaitable[PageServer]]) -> None:
    pages = {
        "vllm": "vllm.txt",
        "sglang": "sglang.txt",
        "trtllm-serve": "trtllm_serve.txt",
        "triton-tensorrt-llm": "triton.txt",
    }
    ds = Datastore("pool")
    for engine, name in pages.items():
        srv = await servers(Route(page(name)))
        ds.upsert(endpoint(engine, srv.port, None if engine == "vllm" else engine))
    runtime = make_runtime(ds)
    before = time.monotonic()
    async with running(runtime):
        await eventually(lambda: all(e.metrics.update_time > 0 for e in ds.snapshot()))
    got = {e.key.name: e.metrics for e in ds.snapshot()}
    assert (got["vllm"].waiting_queue_size, got["vllm"].running_requests, got["vllm"].kv_cache_usage) == (3, 7, 0.4375)
    assert got["vllm"].active_models == {"sql-lora", "tweet-lora"}
    assert (got["sglang"].waiting_queue_size, got["sglang"].cache_num_blocks) == (4, 131072)
    assert (got["trtllm-serve"].running_requests, got["trtllm-serve"].cache_block_size) == (5, 32)
    assert (got["triton-tensorrt-llm"].waiting_queue_size, got["triton-tensorrt-llm"].kv_cache_usage) == (9, 0.125)
    for m in got.values():
        assert before <= m.update_time <= time.monotonic()
        assert not is_stale(m, time.monotonic(), 2.0)


async def test_metrics_keep_updating_and_follow_the_page(servers: Callable[[Route], Awaitable[PageServer]]) -> None:
    srv = await servers(Route(b"vllm:num_requests_waiting 1\n"))
    ds = Datastore()
    ds.upsert(endpoint("a", srv.port))
    runtime = make_runtime(ds)
    async with running(runtime):
        await eventually(lambda: metrics_of(ds, "a").waiting_queue_size == 1)
        first = metrics_of(ds, "a").update_time
        srv.routes["/metrics"] = Route(b"vllm:num_requests_waiting 5\n")
        await eventually(lambda: metrics_of(ds, "a").waiting_queue_size == 5)
        assert metrics_of(ds, "a").update_time > first
        assert not runtime.is_stale(EndpointKey("ns", "a"))


@pytest.mark.parametrize(
    ("route", "reason"),
    [
        (Route(page("vllm.txt")[:50_000], mode="http10"), "truncated page"),
        (Route(b"<!DOCTYPE html><html><body>Bad Gateway</body></html>"), "HTML page, not metrics"),
        (Route(b"<html>boom</html>", status=500, content_type="text/html"), "HTTP 500"),
        (Route(page("vllm.txt"), mode="hang"), "timeout after 0.3s"),
        (None, "connection refused"),
        (Route(b"# nothing here\n"), "nothing extracted: metric family 'vllm:num_requests_waiting' not found; "),
    ],
    ids=["truncated", "html-as-text", "http-500", "timeout", "refused", "no-families"],
)
async def test_a_broken_endpoint_goes_stale_with_one_logged_reason_while_others_update(
    servers: Callable[[Route], Awaitable[PageServer]],
    caplog: pytest.LogCaptureFixture,
    route: Route | None,
    reason: str,
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    good = await servers(Route(page("vllm.txt")))
    bad_port = (await servers(route)).port if route is not None else free_port()
    ds = Datastore()
    ds.upsert(endpoint("good", good.port))
    ds.upsert(endpoint("bad", bad_port))
    runtime = make_runtime(ds, max_backoff=0.05)
    async with running(runtime):
        await eventually(lambda: state_of(runtime, "bad").failures >= 3)
        updates_before = metrics_of(ds, "good").update_time
        await eventually(lambda: metrics_of(ds, "good").update_time > updates_before)
    assert state_of(runtime, "bad").metrics.update_time == 0.0
    assert runtime.is_stale(EndpointKey("ns", "bad"))
    # only an endpoint nothing can connect to leaves the candidate set; one that answers badly stays
    assert ({e.key.name for e in ds.snapshot()} == {"good"}) is (reason == "connection refused")
    assert not runtime.is_stale(EndpointKey("ns", "good"))
    failures = [r.getMessage() for r in caplog.records if r.getMessage().startswith("scrape_failed")]
    assert len(failures) == 1, failures
    assert "endpoint=ns/bad" in failures[0]
    assert f"reason={reason}" in failures[0]
    state = runtime.state(EndpointKey("ns", "bad"))
    assert state is not None and state.failure is not None and reason in state.failure


async def test_stale_then_recovered(
    servers: Callable[[Route], Awaitable[PageServer]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    srv = await servers(Route(page("vllm.txt")))
    ds = Datastore()
    ds.upsert(endpoint("a", srv.port))
    key = EndpointKey("ns", "a")
    runtime = make_runtime(ds, staleness=0.2, max_backoff=0.05)
    async with running(runtime):
        await eventually(lambda: not runtime.is_stale(key))
        srv.routes["/metrics"] = Route(b"", status=503)
        await eventually(lambda: runtime.is_stale(key))
        runtime.refresh_pool_gauges()
        last = metrics_of(ds, "a").update_time
        assert is_stale(metrics_of(ds, "a"), time.monotonic(), 0.2)
        srv.routes["/metrics"] = Route(page("vllm.txt"))
        await eventually(lambda: not runtime.is_stale(key))
        assert metrics_of(ds, "a").update_time > last
        runtime.refresh_pool_gauges()
    messages = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("scrape_failed") for m in messages) == 1
    assert sum(m.startswith("scrape_recovered") for m in messages) == 1
    assert any(m.startswith("metrics_stale endpoint=ns/a") and "reason=HTTP 503" in m for m in messages)
    assert any(m.startswith("metrics_fresh endpoint=ns/a") for m in messages)


async def test_incomplete_pages_are_logged_once_and_still_applied(
    servers: Callable[[Route], Awaitable[PageServer]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    srv = await servers(Route(b"vllm:num_requests_waiting 2\n"))
    ds = Datastore()
    ds.upsert(endpoint("a", srv.port))
    runtime = make_runtime(ds)
    async with running(runtime):
        await eventually(lambda: state_of(runtime, "a").polls >= 5)
        assert metrics_of(ds, "a").waiting_queue_size == 2
        srv.routes["/metrics"] = Route(page("vllm.txt"))
        await eventually(lambda: metrics_of(ds, "a").waiting_queue_size == 3)
        await asyncio.sleep(0.05)
    messages = [r.getMessage() for r in caplog.records]
    incomplete = [m for m in messages if m.startswith("metrics_incomplete")]
    assert len(incomplete) == 1 and "'vllm:num_requests_running' not found" in incomplete[0]
    assert sum(m.startswith("metrics_complete") for m in messages) == 1


async def test_polls_of_one_endpoint_never_overlap_and_a_slow_one_delays_no_other(
    servers: Callable[[Route], Awaitable[PageServer]],
) -> None:
    slow = await servers(Route(page("vllm.txt"), delay=0.15))
    fast = await servers(Route(page("vllm.txt")))
    ds = Datastore()
    ds.upsert(endpoint("slow", slow.port))
    ds.upsert(endpoint("fast", fast.port))
    runtime = make_runtime(ds, interval=0.01)
    async with running(runtime):
        await eventually(lambda: slow.hits["/metrics"] >= 3)
    assert slow.max_in_flight == 1
    assert fast.hits["/metrics"] > 3 * slow.hits["/metrics"]


async def test_failing_endpoints_back_off(servers: Callable[[Route], Awaitable[PageServer]]) -> None:
    srv = await servers(Route(b"", status=500))
    ds = Datastore()
    ds.upsert(endpoint("a", srv.port))
    runtime = make_runtime(ds, interval=0.01, max_backoff=0.2)
    async with running(runtime):
        await asyncio.sleep(0.6)
    assert 3 <= srv.hits["/metrics"] <= 12  # 60 at a fixed 10 ms interval


async def test_pollers_follow_membership(servers: Callable[[Route], Awaitable[PageServer]]) -> None:
    a = await servers(Route(page("vllm.txt")))
    b = await servers(Route(page("sglang.txt")))
    ds = Datastore()
    ds.upsert(endpoint("a", a.port))
    runtime = make_runtime(ds)
    async with running(runtime):
        await eventually(lambda: a.hits["/metrics"] > 0)
        assert runtime.polled_endpoints() == {EndpointKey("ns", "a")}
        assert b.hits["/metrics"] == 0

        ds.upsert(endpoint("b", b.port, "sglang"))  # added: polled with its engine's mapping
        await eventually(lambda: metrics_of(ds, "b").waiting_queue_size == 4)

        ds.delete(EndpointKey("ns", "a"))  # removed: its poller stops
        assert runtime.polled_endpoints() == {EndpointKey("ns", "b")}
        await asyncio.sleep(0.05)
        hits = a.hits["/metrics"]
        await asyncio.sleep(0.1)
        assert a.hits["/metrics"] == hits
        assert runtime.state(EndpointKey("ns", "a")) is None

        ds.upsert(endpoint("b", a.port))  # moved to a vLLM server: restarted with the new address and engine
        await eventually(lambda: metrics_of(ds, "b").waiting_queue_size == 3)

        ds.replace_all([endpoint("c", b.port, "sglang")])
        await eventually(lambda: metrics_of(ds, "c").waiting_queue_size == 4)
        assert runtime.polled_endpoints() == {EndpointKey("ns", "c")}


async def test_pool_gauges_average_fresh_endpoints(servers: Callable[[Route], Awaitable[PageServer]]) -> None:
    a = await servers(
        Route(b"vllm:num_requests_waiting 2\nvllm:num_requests_running 4\nvllm:kv_cache_usage_perc 0.2\n")
    )
    b = await servers(
        Route(b"vllm:num_requests_waiting 6\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0.6\n")
    )
    ds = Datastore("my-pool")
    ds.upsert(endpoint("a", a.port))
    ds.upsert(endpoint("b", b.port))
    ds.upsert(endpoint("dead", free_port()))
    gauges = FakeGauges()
    runtime = make_runtime(ds, recorder=gauges, refresh_prometheus_interval=0.05)
    async with running(runtime):
        await eventually(lambda: any(c[4] == 2 for c in gauges.calls))
    pool, kv, queue, run, ready, per_pod = next(c for c in gauges.calls if c[4] == 2)
    assert pool == "my-pool"
    assert kv == pytest.approx(0.4)
    assert (queue, run, ready) == (4.0, 2.0, 2)
    assert per_pod == {"a": 2.0, "b": 6.0}  # the refused endpoint is out of the pool's candidates


async def test_pool_gauges_with_no_fresh_endpoint_and_explicit_pool_name() -> None:
    ds = Datastore("ignored")
    ds.upsert(endpoint("a", 1))
    gauges = FakeGauges()
    runtime = make_runtime(ds, recorder=gauges, pool_name="explicit")
    runtime.refresh_pool_gauges(now=100.0)
    assert gauges.calls == [("explicit", 0.0, 0.0, 0.0, 0, {"a": 0.0})]


class ExplodingExtractor(CoreMetricsExtractor):
    def extract(self, page: ScrapedPage, endpoint: EndpointMetadata, current: Metrics, now: float) -> Extraction:
        raise KeyError("bug")


async def test_an_extractor_bug_is_isolated(
    servers: Callable[[Route], Awaitable[PageServer]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, LOGGER)
    srv = await servers(Route(page("vllm.txt")))
    ds = Datastore()
    ds.upsert(endpoint("a", srv.port))
    runtime = MetricsRuntime(ds, MetricsDataSource(), ExplodingExtractor("boom"), interval=0.02, max_backoff=0.02)
    async with running(runtime):
        await eventually(lambda: state_of(runtime, "a").failures >= 3)
    state = runtime.state(EndpointKey("ns", "a"))
    assert (
        state is not None
        and state.failure == f"extractor {TypedName('core-metrics-extractor', 'boom')} raised KeyError"
    )
    assert metrics_of(ds, "a").update_time == 0.0


async def test_cancellation_stops_every_poller_and_run_can_start_again(
    servers: Callable[[Route], Awaitable[PageServer]],
) -> None:
    srv = await servers(Route(page("vllm.txt"), mode="hang"))
    ds = Datastore()
    for i in range(5):
        ds.upsert(endpoint(f"e{i}", srv.port))
    runtime = make_runtime(ds)
    async with running(runtime):
        await eventually(lambda: srv.in_flight == 5)
    assert runtime.polled_endpoints() == frozenset()
    others = [t for t in asyncio.all_tasks() if t.get_name().startswith("scrape ")]
    assert not others
    ds.upsert(endpoint("late", srv.port))  # the listener is inert while not running
    assert runtime.polled_endpoints() == frozenset()
    srv.routes["/metrics"] = Route(page("vllm.txt"))
    async with running(runtime):
        await eventually(lambda: metrics_of(ds, "late").update_time > 0)


async def test_run_twice_at_once_is_refused() -> None:
    runtime = make_runtime(Datastore())
    async with running(runtime):
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError):
            await runtime.run()


def test_invalid_intervals_are_refused() -> None:
    with pytest.raises(ValueError):
        make_runtime(Datastore(), interval=0)


async def test_first_polls_are_jittered_over_one_interval(servers: Callable[[Route], Awaitable[PageServer]]) -> None:
    srv = await servers(Route(page("vllm.txt")))
    ds = Datastore()
    for i in range(20):
        ds.upsert(endpoint(f"e{i}", srv.port))
    runtime = make_runtime(ds, interval=0.5)
    async with running(runtime):
        await asyncio.sleep(0.1)
        early = srv.hits["/metrics"]
        await eventually(lambda: srv.hits["/metrics"] >= 20)
    assert 0 < early < 20  # spread over the first interval, not all at once


class BrokenSource(MetricsDataSource):
    def url(self, endpoint: EndpointMetadata) -> str:
        if endpoint.key.name == "broken":
            raise RuntimeError("bug")
        return super().url(endpoint)


async def test_a_crashed_poller_is_logged_and_the_others_keep_going(
    servers: Callable[[Route], Awaitable[PageServer]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, LOGGER)
    srv = await servers(Route(page("vllm.txt")))
    ds = Datastore()
    ds.upsert(endpoint("broken", srv.port))
    ds.upsert(endpoint("fine", srv.port))
    runtime = MetricsRuntime(ds, BrokenSource(), CoreMetricsExtractor(), interval=0.02)
    async with running(runtime):
        await eventually(lambda: metrics_of(ds, "fine").update_time > 0)
        await eventually(lambda: any("scrape_poller_crashed" in r.getMessage() for r in caplog.records))
    assert metrics_of(ds, "broken").update_time == 0.0


# --- reachability ------------------------------------------------------------------------------------------
async def _listen(port: int, body: bytes) -> asyncio.Server:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                head = f"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {len(body)}\r\n\r\n"
                writer.write(head.encode() + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", port)


async def test_a_refused_endpoint_leaves_the_candidates_at_once_and_returns_when_it_answers(
    servers: Callable[[Route], Awaitable[PageServer]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    good = await servers(Route(page("vllm.txt")))
    port = free_port()
    ds = Datastore()
    ds.upsert(endpoint("good", good.port))
    ds.upsert(endpoint("dead", port))
    runtime = make_runtime(ds, max_backoff=0.1)
    async with running(runtime):
        await eventually(lambda: state_of(runtime, "dead").failures >= 1)
        assert {e.key.name for e in ds.snapshot()} == {"good"}  # out after its first refused scrape
        failures = state_of(runtime, "dead").failures
        await eventually(lambda: state_of(runtime, "dead").failures >= failures + 3)  # still probed
        assert {e.key.name for e in ds.snapshot()} == {"good"}
        server = await _listen(port, b"vllm:num_requests_waiting 2\n")
        try:
            await eventually(lambda: {e.key.name for e in ds.snapshot()} == {"good", "dead"})
            assert metrics_of(ds, "dead").waiting_queue_size == 2
        finally:
            server.close()
            await server.wait_closed()
    messages = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("endpoint_unreachable endpoint=ns/dead") for m in messages) == 1
    assert sum(m.startswith("endpoint_reachable endpoint=ns/dead") for m in messages) == 1


@pytest.mark.parametrize(
    ("reason", "dead"),
    [
        ("connection refused", True),
        ("connect timeout after 1s", True),
        ("cannot connect (EHOSTUNREACH)", True),
        ("timeout after 1s", False),
        ("HTTP 503", False),
        ("TLS error", False),
        ("unknown host", False),
    ],
    ids=str,
)
def test_which_scrape_failures_mean_nothing_can_connect(reason: str, dead: bool) -> None:
    assert unreachable(reason) is dead


async def test_without_metrics_a_tcp_probe_takes_dead_endpoints_out_and_back() -> None:
    live = await _listen(0, b"")
    port = free_port()
    ds = Datastore()
    ds.upsert(endpoint("live", live.sockets[0].getsockname()[1]))
    ds.upsert(endpoint("dead", port))
    probe = ReachabilityProbe(ds, interval=0.1, timeout=0.5)
    task = asyncio.create_task(probe.run())
    try:
        await eventually(lambda: {e.key.name for e in ds.snapshot()} == {"live"})
        server = await _listen(port, b"")
        try:
            await eventually(lambda: {e.key.name for e in ds.snapshot()} == {"live", "dead"})
        finally:
            server.close()
            await server.wait_closed()
        await eventually(lambda: {e.key.name for e in ds.snapshot()} == {"live"})
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        live.close()
        await live.wait_closed()
