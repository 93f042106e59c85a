"""The `name[]` query parameter on the simulated pods' `/metrics`: the page filter gives what
prometheus_client's own restricted registry answers for the same metrics, and the pods serve it."""

from __future__ import annotations

from collections.abc import Collection
from urllib.parse import quote

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llm_epp.datalayer.exposition import parse
from llm_epp.datalayer.name_filter import filtered_url
from llm_epp.framework import EndpointKey, EndpointMetadata
from llm_epp.framework.types import EMPTY_METRICS
from llm_epp.plugins.datalayer.core_metrics_extractor import CoreMetricsExtractor
from llm_epp.sim.live import LivePod
from llm_epp.sim.metric_names import requested_names, restrict
from llm_epp.sim.profiles import TINY
from llm_epp.sim.server import SimServer
from llm_epp.sim.stub import Backend
from tests.unit.datalayer.prom_servers import vllm_registry

NAME_SETS = [
    # what the EPP asks a vLLM server for
    {
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:lora_requests_info",
        "vllm:cache_config_info",
    },
    # suffixed samples of counters and histograms, a counter's family name (no sample has it), unknown names
    {"vllm:prompt_tokens_total", "vllm:prompt_tokens_created", "vllm:time_to_first_token_seconds_bucket"},
    {"vllm:e2e_request_latency_seconds_count", "vllm:e2e_request_latency_seconds_sum", "vllm:prompt_tokens"},
    {"nope", "vllm:num_requests_waiting_total"},
    set(),
]


def families(text: str) -> dict[str, tuple[str, list[tuple[str, tuple[tuple[str, str], ...], float]]]]:
    """Family name -> (type, samples), order-free (prometheus_client's restricted answer has no set order)."""
    return {
        f.name: (f.type, sorted((s.name, tuple(sorted(s.labels.items())), s.value) for s in f.samples))
        for f in text_string_to_metric_families(text)
    }


@pytest.mark.parametrize("names", NAME_SETS, ids=lambda n: ",".join(sorted(n))[:40] or "none")
def test_restrict_answers_what_prometheus_client_answers(names: Collection[str]) -> None:
    registry: CollectorRegistry = vllm_registry()
    full = generate_latest(registry).decode()
    theirs = generate_latest(registry.restricted_registry(names)).decode()
    ours = restrict(full, names)
    assert families(ours) == families(theirs)
    assert (ours == "") == (theirs == "")


def test_restrict_keeps_headers_with_their_own_samples_only() -> None:
    page = "# HELP a A.\n# TYPE a gauge\na 1\nb 2\n# TYPE c counter\nc_total 3\n\n"
    assert restrict(page, {"b"}) == "b 2\n"
    assert restrict(page, {"a", "c_total"}) == "# HELP a A.\n# TYPE a gauge\na 1\n# TYPE c counter\nc_total 3\n"


def test_requested_names_are_read_as_prometheus_client_reads_them() -> None:
    url = filtered_url("http://pod/metrics", {"vllm:a", "vllm:b"})
    assert url is not None
    assert requested_names(url.split("pod", 1)[1]) == frozenset({"vllm:a", "vllm:b"})
    assert requested_names("/metrics?name[]=x&name[]=y&other=1") == frozenset({"x", "y"})
    assert requested_names("/metrics") is None
    assert requested_names("/metrics?other=1") is None


def metadata(port: int) -> EndpointMetadata:
    return EndpointMetadata(EndpointKey("", "pod"), "127.0.0.1", port)


async def test_vllm_pod_serves_the_filtered_page_with_the_same_metrics() -> None:
    pod = LivePod("pod", TINY, model="m", loras=("ad1",), time_scale=1000.0)
    extractor = CoreMetricsExtractor()
    async with SimServer(pod) as srv, httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
        pod.submit(tuple(range(100)), 50, "ad1", stream=False)
        pod.engine.next_event_time()  # plan the first step: admitted; the next one waits
        pod.submit(tuple(range(1000, 1100)), 50, None, stream=False)
        md = metadata(srv.port)
        wanted = extractor.families(md)
        query = "&".join(f"name%5B%5D={quote(n, safe='')}" for n in sorted(wanted))
        full = (await c.get("/metrics")).content
        small = await c.get(f"/metrics?{query}")
    assert small.status_code == 200 and small.headers["content-type"].startswith("text/plain")
    assert len(small.content) * 5 < len(full)
    assert set(families(small.text)) == wanted
    got = extractor.extract(parse(small.content, wanted), md, EMPTY_METRICS, 1.0)
    expected = extractor.extract(parse(full, wanted), md, EMPTY_METRICS, 1.0)
    assert got.metrics is not None and not got.problems
    assert got.metrics == expected.metrics
    assert got.metrics.waiting_queue_size == 1 and got.metrics.active_models == {"ad1"}


async def test_sglang_pod_answers_a_filtered_request_with_an_empty_page() -> None:
    pod = LivePod("pod", TINY, model="m", engine="sglang", time_scale=1000.0)
    async with SimServer(pod) as srv, httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
        full = await c.get("/metrics")
        small = await c.get("/metrics?name%5B%5D=sglang%3Anum_queue_reqs")
    assert b"sglang:num_queue_reqs" in full.content
    assert small.status_code == 200 and small.content == b""


async def test_stub_backend_honours_the_parameter() -> None:
    async with Backend("b") as backend, httpx.AsyncClient(timeout=10) as c:
        backend.queue = 4
        full = (await c.get(backend.url + "/metrics")).text
        small = (await c.get(backend.url + "/metrics?name%5B%5D=vllm%3Anum_requests_waiting")).text
    assert set(families(full)) == {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"}
    assert families(small) == {"vllm:num_requests_waiting": families(full)["vllm:num_requests_waiting"]}
