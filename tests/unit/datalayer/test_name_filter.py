"""Asking model servers for only the samples the extractor reads (`name[]`), against the real
prometheus_client serving vLLM's metric names and types over HTTP on loopback: the runtime gets the same
metrics as from the full page; a multiprocess registry (which answers nothing when filtered), a server
that ignores the parameter and one that answers the filtered URL with an error all go back to the full
page and stay fresh; a configured query string is kept; the flag turns it off."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from llm_epp.datalayer.datastore import Datastore
from llm_epp.datalayer.exposition import parse
from llm_epp.datalayer.name_filter import MAX_ADDED_QUERY, RECHECK_SECONDS, NameFilter, filtered_url
from llm_epp.datalayer.runtime import EndpointState, MetricsRuntime
from llm_epp.framework import EndpointKey, EndpointMetadata, Metrics
from llm_epp.framework.types import EMPTY_METRICS
from llm_epp.plugins.datalayer.core_metrics_extractor import CoreMetricsExtractor
from llm_epp.plugins.datalayer.metrics_data_source import MetricsDataSource
from tests.unit.datalayer.page_server import PageServer, Route
from tests.unit.datalayer.prom_servers import PromServer, multiprocess_registry, vllm_registry

LOGGER = "llm_epp.datalayer.name_filter"
VLLM_NAMES = frozenset(
    {
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:lora_requests_info",
        "vllm:cache_config_info",
    }
)


def endpoint(port: int) -> EndpointMetadata:
    return EndpointMetadata(EndpointKey("ns", "pod"), "127.0.0.1", port)


def scraped(md: EndpointMetadata, ds: Datastore) -> Metrics:
    return next(e.metrics for e in ds.snapshot() if e.key == md.key)


def from_full_page(registry: CollectorRegistry, md: EndpointMetadata) -> Metrics:
    """What the extractor makes of the registry's full page (no filtering anywhere)."""
    extractor = CoreMetricsExtractor()
    result = extractor.extract(parse(generate_latest(registry), extractor.families(md)), md, EMPTY_METRICS, 1.0)
    assert result.metrics is not None and not result.problems
    return result.metrics


def same_signals(a: Metrics, b: Metrics) -> bool:
    return (
        a.waiting_queue_size,
        a.running_requests,
        a.kv_cache_usage,
        a.active_models,
        a.waiting_models,
        a.max_active_models,
        a.cache_block_size,
        a.cache_num_blocks,
    ) == (
        b.waiting_queue_size,
        b.running_requests,
        b.kv_cache_usage,
        b.active_models,
        b.waiting_models,
        b.max_active_models,
        b.cache_block_size,
        b.cache_num_blocks,
    )


@asynccontextmanager
async def polling(md: EndpointMetadata, **kw: object) -> AsyncIterator[tuple[MetricsRuntime, Datastore]]:
    ds = Datastore()
    ds.upsert(md)
    options: dict[str, object] = {"interval": 0.02, "poll_timeout": 1.0, "staleness": 0.5, "rng": random.Random(3)}
    options.update(kw)
    source = options.pop("source", MetricsDataSource())
    runtime = MetricsRuntime(ds, source, CoreMetricsExtractor(), **options)  # type: ignore[arg-type]
    task = asyncio.create_task(runtime.run())
    try:
        yield runtime, ds
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def polls_of(runtime: MetricsRuntime, md: EndpointMetadata, count: int) -> EndpointState:
    """Waits until the endpoint has had `count` more successful polls."""
    async with asyncio.timeout(10.0):
        while (state := runtime.state(md.key)) is None or state.polls - state.failures < count:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    return state


# --- the URL -------------------------------------------------------------------------------------------
def test_filtered_url_lists_each_name_percent_encoded_as_prometheus_client_reads_it() -> None:
    url = filtered_url("http://10.0.0.1:8000/metrics", VLLM_NAMES)
    assert url is not None
    parts = urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path) == ("http", "10.0.0.1:8000", "/metrics")
    assert "name%5B%5Dvllm%3Anum_requests_waiting" in parts.query.replace("=", "")
    assert "[" not in parts.query and ":" not in parts.query
    assert sorted(parse_qs(parts.query)["name[]"]) == sorted(VLLM_NAMES)  # what prometheus_client's apps do


def test_filtered_url_keeps_a_configured_query_and_leaves_a_restricted_one_alone() -> None:
    url = filtered_url("https://pod:8443/stats/prometheus?usedonly=true#x", {"a:b"})
    assert url == "https://pod:8443/stats/prometheus?usedonly=true&name%5B%5D=a%3Ab#x"
    assert filtered_url("http://pod/metrics?name[]=x", {"a"}) is None
    assert filtered_url("http://pod/metrics?name%5B%5D=x", {"a"}) is None
    assert filtered_url("http://pod/metrics", set()) is None


def test_too_many_names_leave_the_url_unfiltered() -> None:
    many = {f"custom_metric_number_{i}" for i in range(MAX_ADDED_QUERY // 30)}
    assert filtered_url("http://pod/metrics", many) is None
    assert filtered_url("http://pod/metrics", set(list(many)[:10])) is not None


def test_missing_names_are_rechecked_against_the_full_page_now_and_then() -> None:
    nf = NameFilter.for_url("http://pod/metrics", frozenset({"a", "b"}))
    assert nf is not None
    assert not nf.filtering
    nf.saw_full(frozenset(), 0.0)
    assert not nf.filtering  # nothing wanted on the page yet: the page cannot tell what the server exposes
    nf.saw_full(frozenset({"a"}), 1.0)
    assert nf.filtering
    page = b"# TYPE a gauge\na 1\n"
    assert not nf.needs_full(page, frozenset({"a"}), 2.0)  # "b" is not exposed: no refetch every poll
    assert nf.needs_full(page, frozenset({"a"}), 1.0 + RECHECK_SECONDS)  # but now and then
    assert nf.needs_full(b"", frozenset(), 2.0)  # "a" is exposed and missing: at once
    nf.compare(frozenset({"a"}), frozenset({"a"}), 3.0)
    assert nf.filtering and nf.off_reason is None
    nf.compare(frozenset({"a"}), frozenset({"a", "b"}), 4.0)  # "b" appeared, and the filtered page lost it
    assert not nf.filtering and nf.off_reason is not None and "lacks b" in nf.off_reason


# --- real prometheus_client servers ------------------------------------------------------------------
async def test_vllm_registry_filtered_pages_give_the_full_pages_metrics() -> None:
    registry = vllm_registry()
    with PromServer(registry) as srv:
        md = endpoint(srv.port)
        async with polling(md) as (runtime, ds):
            state = await polls_of(runtime, md, 6)
            got = scraped(md, ds)
    assert same_signals(got, from_full_page(registry, md))
    assert got.active_models == {"sql-lora", "tweet-lora"} and got.cache_num_blocks == 8192
    assert srv.queries[0] == ""  # the first page is the full one: it says what the server exposes
    filtered = list(srv.filtered())
    assert len(filtered) >= 4
    assert all(sorted(parse_qs(q)["name[]"]) == sorted(VLLM_NAMES) for q, _ in filtered)
    full_size = srv.sizes[0]
    assert all(size * 3 < full_size for _, size in filtered)  # histograms and counters were left out
    assert state.name_filter is not None and state.name_filter.filtering and state.name_filter.off_reason is None


async def test_multiprocess_registry_answers_nothing_filtered_and_the_endpoint_goes_back_to_full_pages(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry = multiprocess_registry(tmp_path)
    restricted = generate_latest(registry.restricted_registry(VLLM_NAMES))
    assert restricted == b""  # the collector declares no names: prometheus_client finds nothing to answer
    caplog.set_level(logging.INFO, logger=LOGGER)
    with PromServer(registry) as srv:
        md = endpoint(srv.port)
        async with polling(md) as (runtime, ds):
            state = await polls_of(runtime, md, 8)
            got = scraped(md, ds)
            assert not runtime.is_stale(md.key)
    assert same_signals(got, from_full_page(registry, md))
    assert state.failures == 0
    assert state.name_filter is not None and not state.name_filter.filtering
    assert state.name_filter.off_reason is not None and "vllm:num_requests_waiting" in state.name_filter.off_reason
    assert len(list(srv.filtered())) == 1  # one filtered try, then full pages for good
    assert all(q == "" for q in srv.queries[srv.queries.index(next(q for q, _ in srv.filtered())) + 1 :])
    off = [r for r in caplog.records if r.getMessage().startswith("metrics_name_filter_off")]
    assert len(off) == 1 and off[0].levelno == logging.INFO and "ns/pod" in off[0].getMessage()


async def test_a_server_ignoring_the_parameter_keeps_working(caplog: pytest.LogCaptureFixture) -> None:
    registry = vllm_registry()
    caplog.set_level(logging.INFO, logger=LOGGER)
    with PromServer(registry, ignore_query=True) as srv:
        md = endpoint(srv.port)
        async with polling(md) as (runtime, ds):
            state = await polls_of(runtime, md, 6)
            got = scraped(md, ds)
    assert same_signals(got, from_full_page(registry, md))
    assert state.failures == 0
    assert state.name_filter is not None and not state.name_filter.filtering
    assert "ignores name[]" in (state.name_filter.off_reason or "")
    assert len(list(srv.filtered())) == 1  # seen once to answer the full page, then no longer asked
    assert sum("metrics_name_filter_off" in r.getMessage() for r in caplog.records) == 1


async def test_a_configured_query_string_is_kept_and_filtered_pages_still_match() -> None:
    registry = vllm_registry()
    with PromServer(registry) as srv:
        md = endpoint(srv.port)
        async with polling(md, source=MetricsDataSource(path="/metrics?tenant=a")) as (runtime, ds):
            await polls_of(runtime, md, 5)
            got = scraped(md, ds)
    assert same_signals(got, from_full_page(registry, md))
    assert all(parse_qs(q)["tenant"] == ["a"] for q in srv.queries)
    assert any("name[]" in parse_qs(q) for q in srv.queries)


async def test_an_error_on_the_filtered_url_goes_back_to_the_full_page() -> None:
    body = generate_latest(vllm_registry())
    async with PageServer({"/metrics": Route(body)}) as srv:  # any other target (a query string) is a 404
        md = endpoint(srv.port)
        async with polling(md) as (runtime, _ds):
            state = await polls_of(runtime, md, 5)
            assert not runtime.is_stale(md.key)
    assert state.failures == 0
    assert state.name_filter is not None and "HTTP 404" in (state.name_filter.off_reason or "")
    assert sum(n for target, n in srv.hits.items() if "?" in target) == 1


async def test_the_filter_can_be_turned_off() -> None:
    registry = vllm_registry()
    with PromServer(registry) as srv:
        md = endpoint(srv.port)
        async with polling(md, name_filter=False) as (runtime, ds):
            state = await polls_of(runtime, md, 4)
            got = scraped(md, ds)
    assert same_signals(got, from_full_page(registry, md))
    assert state.name_filter is None
    assert set(srv.queries) == {""}
