"""Simulated SGLang pods: ``/metrics`` names, types, labels and values, read back by the EPP's own scraper.

Live pods run over real loopback HTTP (tiny profile); no timing assertions.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llm_epp.datalayer.exposition import parse
from llm_epp.datalayer.static import parse_endpoints_file
from llm_epp.framework import EndpointKey, EndpointMetadata
from llm_epp.framework.types import EMPTY_METRICS
from llm_epp.plugins.datalayer.core_metrics_extractor import CoreMetricsExtractor
from llm_epp.sim import cli, sglang_metrics, tokenizer
from llm_epp.sim.engine import Engine, SimRequest
from llm_epp.sim.live import LivePod
from llm_epp.sim.profiles import TINY
from llm_epp.sim.server import SimServer

PROMPT = "The quick brown fox jumps over the lazy dog. " * 10  # 450 chars = 113 tokens
SCHEDULER_LABELS = {"model_name": "m", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
REQUEST_LABELS = {"model_name": "m", "engine_type": "unified"}
SCHEDULER_FAMILIES = {
    "sglang:num_running_reqs": "gauge",
    "sglang:num_queue_reqs": "gauge",
    "sglang:num_used_tokens": "gauge",
    "sglang:token_usage": "gauge",
    "sglang:gen_throughput": "gauge",
    "sglang:cache_hit_rate": "gauge",
    "sglang:max_total_num_tokens": "gauge",
    "sglang:page_size": "gauge",
    "sglang:num_pages": "gauge",
    "sglang:cache_config_info": "gauge",
    "sglang:num_retracted_requests": "counter",
}
REQUEST_FAMILIES = {
    "sglang:prompt_tokens": "counter",
    "sglang:generation_tokens": "counter",
    "sglang:cached_tokens": "counter",
    "sglang:num_requests": "counter",
    "sglang:num_aborted_requests": "counter",
    "sglang:time_to_first_token_seconds": "histogram",
    "sglang:inter_token_latency_seconds": "histogram",
    "sglang:e2e_request_latency_seconds": "histogram",
}
BUCKETS = {
    "sglang:time_to_first_token_seconds": sglang_metrics.TTFT_BUCKETS,
    "sglang:inter_token_latency_seconds": sglang_metrics.ITL_BUCKETS,
    "sglang:e2e_request_latency_seconds": sglang_metrics.E2E_BUCKETS,
}


@pytest.fixture
async def server() -> AsyncIterator[SimServer]:
    pod = LivePod("pod-s", TINY, model="m", time_scale=0.01, engine="sglang")
    async with SimServer(pod) as srv:
        yield srv


def _values(text: str) -> dict[str, float]:
    """Sample name -> value of every sample on a page except histogram buckets (one series per name here)."""
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if "le" not in s.labels}


async def test_names_types_and_labels(client: httpx.AsyncClient) -> None:
    await client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3})
    r = await client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = r.text
    assert "vllm:" not in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {name: f.type for name, f in families.items()} == {**SCHEDULER_FAMILIES, **REQUEST_FAMILIES}
    for name in SCHEDULER_FAMILIES:
        (sample,) = families[name].samples
        extra = {"page_size": "16", "num_pages": "256"} if name == "sglang:cache_config_info" else {}
        assert sample.labels == {**SCHEDULER_LABELS, **extra}, name
    for name, kind in REQUEST_FAMILIES.items():
        if kind == "counter":
            (sample,) = families[name].samples
            assert sample.name == name + "_total" and sample.labels == REQUEST_LABELS
            continue
        buckets = [s for s in families[name].samples if s.name == name + "_bucket"]
        assert [s.labels.pop("le") for s in buckets] == [repr(float(b)) for b in BUCKETS[name]] + ["+Inf"]
        assert all(s.labels == REQUEST_LABELS for s in families[name].samples)
        assert {s.name for s in families[name].samples} == {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
    assert "# TYPE sglang:prompt_tokens_total counter" in text and "# TYPE sglang:token_usage gauge" in text


async def test_values_follow_requests(client: httpx.AsyncClient) -> None:
    idle = _values((await client.get("/metrics")).text)
    assert idle["sglang:num_running_reqs"] == 0 and idle["sglang:num_queue_reqs"] == 0
    assert idle["sglang:token_usage"] == 0 and idle["sglang:num_used_tokens"] == 0
    assert idle["sglang:max_total_num_tokens"] == 4096 and idle["sglang:page_size"] == 16
    assert idle["sglang:num_pages"] == 256 and idle["sglang:num_requests_total"] == 0

    await client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 20})
    first = _values((await client.get("/metrics")).text)
    assert first["sglang:prompt_tokens_total"] == 113 and first["sglang:generation_tokens_total"] == 20
    assert first["sglang:num_requests_total"] == 1 and first["sglang:cached_tokens_total"] == 0
    assert first["sglang:cache_hit_rate"] == 0 and first["sglang:gen_throughput"] > 0
    assert first["sglang:num_running_reqs"] == 0 and first["sglang:token_usage"] == 0
    assert first["sglang:time_to_first_token_seconds_count"] == 1
    assert first["sglang:inter_token_latency_seconds_count"] == 19
    assert first["sglang:e2e_request_latency_seconds_count"] == 1

    second_prompt = PROMPT + "more"
    await client.post("/v1/completions", json={"prompt": second_prompt, "max_tokens": 5})
    second = _values((await client.get("/metrics")).text)
    prompt_len = len(tokenizer.encode(second_prompt))
    assert second["sglang:cached_tokens_total"] == 112  # 7 full blocks of 16 shared with the first prompt
    assert second["sglang:cache_hit_rate"] == pytest.approx(112 / prompt_len)
    assert second["sglang:prompt_tokens_total"] == 113 + prompt_len
    assert second["sglang:generation_tokens_total"] == 25 and second["sglang:num_requests_total"] == 2
    # no admission since the last scrape: the hit rate keeps its last value
    assert _values((await client.get("/metrics")).text)["sglang:cache_hit_rate"] == second["sglang:cache_hit_rate"]


async def test_running_queue_and_usage_and_epp_extraction() -> None:
    slow = LivePod("pod-slow", TINY, model="m", loras=("ad1",), time_scale=1000.0, engine="sglang")
    async with SimServer(slow) as srv, httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
        slow.submit(tuple(range(100)), 50, None, stream=False)
        slow.engine.next_event_time()  # plan the first step: admitted
        slow.submit(tuple(range(1000, 1100)), 50, None, stream=False)  # these two wait for the next step
        slow.submit(tuple(range(2000, 2100)), 50, "ad1", stream=False)
        r = await c.get("/metrics")
        assert r.status_code == 200 and r.headers["x-sim-pod"] == "pod-slow"
        values = _values(r.text)
        assert values["sglang:num_running_reqs"] == 1 and values["sglang:num_queue_reqs"] == 2
        usage = slow.engine.metrics().kv_cache_usage_perc
        assert usage > 0 and values["sglang:token_usage"] == usage
        assert values["sglang:num_used_tokens"] == round(usage * 256) * 16 > 0

        md = EndpointMetadata(EndpointKey("", "pod-slow"), "127.0.0.1", srv.port, engine="sglang")
        extractor = CoreMetricsExtractor()
        assert extractor.engine_of(md) == "sglang"
        page = parse(r.content, extractor.families(md))
        assert page.complete
        result = extractor.extract(page, md, EMPTY_METRICS, 1.0)
        m = result.metrics
        assert m is not None and not result.problems
        assert m.running_requests == 1 and m.waiting_queue_size == 2 and m.kv_cache_usage == usage
        assert m.cache_block_size == 16 and m.cache_num_blocks == 256 and m.update_time == 1.0


async def test_sglang_routes(client: httpx.AsyncClient, server: SimServer) -> None:
    assert server.load_format == "sglang"
    assert (await client.get("/get_load")).json() == [
        {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}
    ]
    info = (await client.get("/get_server_info")).json()
    assert info["served_model_name"] == "m" and info["context_length"] == 4096 and info["page_size"] == 16
    assert info["max_total_num_tokens"] == 4096 and info["max_running_requests"] == 16
    assert isinstance(info["internal_states"], list) and isinstance(info["version"], str)
    assert (await client.get("/server_info")).json() == info
    model = (await client.get("/get_model_info")).json()
    assert model["is_generation"] is True and model["model_path"] == model["tokenizer_path"]
    assert (await client.get("/model_info")).json() == model
    # the OpenAI side is the vLLM one
    chat = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] == 16
    body = {"prompt": "hi", "max_tokens": 2, "stream": True}
    stream = await client.post("/v1/completions", json=body)
    assert stream.content.endswith(b"data: [DONE]\n\n")


async def test_load_format_can_be_overridden() -> None:
    pod = LivePod("pod-o", TINY, model="m", time_scale=0.01, engine="sglang")
    async with SimServer(pod, load_format="vllm-router") as srv, httpx.AsyncClient(base_url=srv.url) as c:
        assert (await c.get("/get_load")).json() == {"load": 0}


def test_exporter_windows_follow_the_engine() -> None:
    engine = Engine(TINY, 0.0)
    exporter = sglang_metrics.SGLangExporter("m")
    pod = sglang_metrics.new_pod_metrics()
    engine.submit(SimRequest("a", tuple(range(64)), 10), 0.0)
    while (t := engine.next_event_time()) is not None:
        engine.advance(t)
    end = engine.clock
    first = _values(exporter.render(engine.metrics(), pod, now=end))
    assert first["sglang:gen_throughput"] == pytest.approx(10 / end)
    assert first["sglang:cache_hit_rate"] == 0
    # nothing new: no tokens in the window, hit rate unchanged
    idle = _values(exporter.render(engine.metrics(), pod, now=end + 1.0))
    assert idle["sglang:gen_throughput"] == 0 and idle["sglang:cache_hit_rate"] == 0
    engine.submit(SimRequest("b", tuple(range(64)), 4), end + 1.0)
    while (t := engine.next_event_time()) is not None:
        engine.advance(t)
    again = _values(exporter.render(engine.metrics(), pod, now=engine.clock))
    assert again["sglang:cache_hit_rate"] == pytest.approx(48 / 64)  # 3 of 4 blocks (one token is always computed)
    assert again["sglang:gen_throughput"] == pytest.approx(4 / (engine.clock - end - 1.0))
    assert again["sglang:num_retracted_requests_total"] == 0


def test_unknown_engine_is_rejected() -> None:
    with pytest.raises(ValueError, match="engine"):
        LivePod("p", TINY, engine="trtllm")


async def test_cli_sglang_pods_read_by_the_epp(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--pods", "2", "--engine", "sglang", "--time-scale", "0.01", "--model", "m"])
    servers = await cli.start_pods(args)
    try:
        path = tmp_path / "endpoints.yaml"
        path.write_text(cli.endpoints_yaml(servers, args.engine))
        _pool, endpoints = parse_endpoints_file(path.read_text(), str(path))
        assert [e.engine for e in endpoints] == ["sglang", "sglang"]
        extractor = CoreMetricsExtractor()
        async with httpx.AsyncClient(timeout=10) as c:
            for s, md in zip(servers, endpoints, strict=True):
                assert s.load_format == "sglang"
                r = await c.post(f"{s.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2})
                assert r.status_code == 200 and r.headers["x-sim-pod"] == s.name
                page = parse((await c.get(f"http://{md.hostport}{md.metrics_path}")).content, extractor.families(md))
                result = extractor.extract(page, md, EMPTY_METRICS, 2.0)
                assert result.metrics is not None and not result.problems
                assert result.metrics.cache_num_blocks == 256 and result.metrics.waiting_queue_size == 0
    finally:
        for s in servers:
            await s.stop()
    assert cli.run(parser.parse_args(["--engine", "sglang", "--pods", "0"])) == 2
