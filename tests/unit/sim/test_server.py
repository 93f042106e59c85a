"""Live simulated pods over real loopback HTTP (tiny profile, fast time scale; no timing assertions)."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from llm_epp.datalayer.exposition import parse
from llm_epp.datalayer.static import parse_endpoints_file
from llm_epp.framework import EndpointKey, EndpointMetadata
from llm_epp.framework.types import EMPTY_METRICS
from llm_epp.plugins.datalayer.core_metrics_extractor import CoreMetricsExtractor
from llm_epp.sim import cli
from llm_epp.sim.live import LivePod
from llm_epp.sim.profiles import TINY
from llm_epp.sim.server import SimServer

PROMPT = "The quick brown fox jumps over the lazy dog. " * 10  # 450 chars = 113 tokens


@pytest.fixture
async def server() -> AsyncIterator[SimServer]:
    pod = LivePod("pod-a", TINY, model="m", loras=("ad1", "ad2"), time_scale=0.01)
    async with SimServer(pod) as srv:
        yield srv


async def test_sse_completions_format(client: httpx.AsyncClient) -> None:
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["x-sim-pod"] == "pod-a"
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = b"".join([chunk async for chunk in r.aiter_raw()])
    events = raw.split(b"\n\n")
    assert events[-1] == b"" and events[-2] == b"data: [DONE]"
    objs = [json.loads(e.removeprefix(b"data: ")) for e in events[:-2]]
    assert all(e.startswith(b"data: ") for e in events[:-1])
    assert len(objs) == 4
    for i, obj in enumerate(objs[:3]):
        assert obj["object"] == "text_completion" and obj["model"] == "m" and isinstance(obj["created"], int)
        assert obj["id"] == objs[0]["id"]
        (choice,) = obj["choices"]
        assert choice["text"] == f" t{i}"
        assert choice["finish_reason"] == ("length" if i == 2 else None)
    assert objs[3]["choices"] == []
    assert objs[3]["usage"] == {
        "prompt_tokens": 113,
        "total_tokens": 116,
        "completion_tokens": 3,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


async def test_sse_chat_format_without_usage(client: httpx.AsyncClient) -> None:
    body = {"model": "ad1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200
    lines = r.content.split(b"\n")
    # every event is one data line followed by a blank line
    assert lines[1::2] == [b""] * (len(lines) // 2) and lines[-1] == b""
    assert lines[-3] == b"data: [DONE]"
    objs = [json.loads(line.removeprefix(b"data: ")) for line in lines[0:-3:2]]
    assert [o["object"] for o in objs] == ["chat.completion.chunk"] * 3
    assert objs[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [o["choices"][0]["delta"] for o in objs[1:]] == [{"content": " t0"}, {"content": " t1"}]
    assert [o["choices"][0]["finish_reason"] for o in objs] == [None, None, "length"]
    assert all(o["model"] == "ad1" and "usage" not in o for o in objs)


async def test_non_streaming_usage_and_cached_prefix(client: httpx.AsyncClient) -> None:
    body = {"prompt": PROMPT, "max_tokens": 4}
    first = (await client.post("/v1/completions", json=body)).json()
    assert first["object"] == "text_completion" and first["model"] == "m"
    assert first["choices"][0]["text"] == " t0 t1 t2 t3" and first["choices"][0]["finish_reason"] == "length"
    assert first["usage"]["prompt_tokens"] == 113 and first["usage"]["completion_tokens"] == 4
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    second = (await client.post("/v1/completions", json={**body, "prompt": PROMPT + "more"})).json()
    assert second["usage"]["prompt_tokens_details"] == {"cached_tokens": 112}  # 7 full blocks of 16
    chat = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert chat.json()["object"] == "chat.completion"
    assert chat.json()["choices"][0]["message"]["role"] == "assistant"
    assert chat.json()["usage"]["completion_tokens"] == 16


async def test_metrics_parse_and_extract(client: httpx.AsyncClient) -> None:
    slow = LivePod("pod-slow", TINY, model="m", loras=("ad1", "ad2"), time_scale=1000.0)
    async with SimServer(slow) as srv, httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
        slow.submit(tuple(range(100)), 50, "ad2", stream=False)
        slow.engine.next_event_time()  # plan the first step: admitted
        slow.submit(tuple(range(1000, 1100)), 50, None, stream=False)  # these two wait for the next step
        slow.submit(tuple(range(2000, 2100)), 50, "ad1", stream=False)
        r = await c.get("/metrics")
        assert r.status_code == 200 and r.headers["x-sim-pod"] == "pod-slow"
        md = EndpointMetadata(EndpointKey("", "pod-slow"), "127.0.0.1", srv.port)
        extractor = CoreMetricsExtractor()
        page = parse(r.content, extractor.families(md))
        assert not page.problems
        result = extractor.extract(page, md, EMPTY_METRICS, 1.0)
        m = result.metrics
        assert m is not None and not result.problems
        assert m.running_requests == 1 and m.waiting_queue_size == 2 and m.kv_cache_usage > 0
        assert m.active_models == frozenset({"ad2"}) and m.waiting_models == frozenset({"ad1"})
        assert m.max_active_models == 2 and m.cache_block_size == 16 and m.cache_num_blocks == 256

    await client.post("/v1/completions", json={"model": "ad2", "prompt": PROMPT, "max_tokens": 200})
    names = [
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_bucket",
    ]
    text = (await client.get("/metrics")).content
    page = parse(text, names)
    assert not page.problems and all(page.samples.get(n) for n in names)
    assert page.samples["vllm:generation_tokens_total"][0].value == 200
    assert page.samples["vllm:prompt_tokens_total"][0].value == 113
    assert page.samples["vllm:inter_token_latency_seconds_count"][0].value == 199
    assert page.samples["vllm:e2e_request_latency_seconds_bucket"][-1].labels["le"] == "+Inf"
    assert page.samples["vllm:e2e_request_latency_seconds_bucket"][-1].value == 1
    assert b"# TYPE vllm:time_to_first_token_seconds histogram" in text
    assert b"# TYPE vllm:prefix_cache_hits_total counter" in text


async def test_errors(client: httpx.AsyncClient) -> None:
    bad = await client.post("/v1/completions", content=b"{nope", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == 400 and bad.headers["x-sim-pod"] == "pod-a"
    assert (await client.post("/v1/completions", json={"model": "m"})).status_code == 400
    assert (await client.post("/v1/chat/completions", json={"messages": []})).status_code == 400
    too_long = await client.post("/v1/completions", json={"prompt": "abcd" * 4090, "max_tokens": 10})
    assert too_long.status_code == 400 and "maximum context length is 4096" in too_long.json()["error"]["message"]
    unknown = await client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "NotFoundError"
    assert (
        await client.post("/v1/chat/completions", json={"model": "ad9", "messages": [{"content": "x"}]})
    ).status_code == 404
    assert (await client.get("/nowhere")).status_code == 404


async def test_tokenize_render_and_info(client: httpx.AsyncClient) -> None:
    tok = (await client.post("/tokenize", json={"model": "m", "prompt": "abcdefgh"})).json()
    assert tok["count"] == 2 and len(tok["tokens"]) == 2 and tok["max_model_len"] == 4096
    render = (await client.post("/v1/completions/render", json={"model": "m", "prompt": "abcdefgh"})).json()
    assert isinstance(render, list) and render[0]["token_ids"] == tok["tokens"] and render[0]["model"] == "m"
    chat = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
    rc = (await client.post("/v1/chat/completions/render", json=chat)).json()
    tc = (await client.post("/tokenize", json=chat)).json()
    assert rc["token_ids"] == tc["tokens"] and len(rc["token_ids"]) == 6  # 23 chars
    models = (await client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == ["m", "ad1", "ad2"]
    assert (await client.get("/get_load")).json() == {"load": 0}
    assert (await client.get("/server_info")).json()["served_model_name"] == "m"
    assert (await client.get("/model_info")).json()["is_generation"] is True
    health = await client.get("/health")
    assert health.status_code == 200 and health.headers["x-sim-pod"] == "pod-a"


async def test_chunked_request_body(server: SimServer) -> None:
    reader, writer = await asyncio.open_connection(server.host, server.port)
    body = json.dumps({"prompt": "hello world", "max_tokens": 1}).encode()
    head = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    writer.write(head + b"%x\r\n%s\r\n" % (5, body[:5]) + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body) - 5, body[5:]))
    data = await reader.read()
    writer.close()
    assert data.startswith(b"HTTP/1.1 200 OK\r\n") and b"x-sim-pod: pod-a\r\n" in data
    assert b'"completion_tokens":1' in data


async def test_cli_endpoints_file(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--pods", "2", "--time-scale", "0.01", "--lora", "a,b"])
    servers = await cli.start_pods(args)
    try:
        path = tmp_path / "endpoints.yaml"
        path.write_text(cli.endpoints_yaml(servers))
        _pool, endpoints = parse_endpoints_file(path.read_text(), str(path))
        assert [(e.key.name, e.address, e.port, e.engine) for e in endpoints] == [
            (s.name, "127.0.0.1", s.port, "vllm") for s in servers
        ]
        async with httpx.AsyncClient(timeout=10) as c:
            for s in servers:
                r = await c.post(f"{s.url}/v1/completions", json={"model": "b", "prompt": "hi", "max_tokens": 2})
                assert r.status_code == 200 and r.headers["x-sim-pod"] == s.name
    finally:
        for s in servers:
            await s.stop()


@pytest.mark.parametrize("flags", [["--kv-events-encoding", "map"], ["--engine", "sglang"]], ids=["vllm-map", "sglang"])
async def test_cli_pods_publish_kv_events_where_the_rank_convention_finds_them(
    tmp_path: Path, flags: list[str]
) -> None:
    """vLLM's or SGLang's events (SGLang's page hashes and layout) reach the EPP's real subscriber."""
    import socket

    from llm_epp.kvcache.index import KVBlockIndex
    from llm_epp.kvcache.request_keys import RequestKeyHasher
    from llm_epp.kvcache.subscriber import KVEventsRunner, sources_for

    with socket.socket() as s1, socket.socket() as s2:  # probe two free ports for the bases
        s1.bind(("127.0.0.1", 0))
        s2.bind(("127.0.0.1", 0))
        base, replay = s1.getsockname()[1], s2.getsockname()[1]
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(
        ["--pods", "1", "--time-scale", "0.01", "--kv-events-port", str(base), "--kv-events-replay-port", str(replay),
         *flags]
    )  # fmt: skip
    servers = await cli.start_pods(args)
    index = KVBlockIndex(RequestKeyHasher(16))
    runner = KVEventsRunner(index)
    try:
        path = tmp_path / "endpoints.yaml"
        path.write_text(cli.endpoints_yaml(servers, args.engine))
        _pool, endpoints = parse_endpoints_file(path.read_text(), str(path))
        assert [e.key.name for e in endpoints] == ["sim-rank-0"]
        from llm_epp.framework.types import Endpoint

        runner.set_sources(sources_for([Endpoint(e) for e in endpoints], base, replay))
        runner.start()
        prompt = "kv events " * 40
        async with httpx.AsyncClient(timeout=10) as c:
            for _ in range(100):  # until the subscription is through and a batch arrived
                await c.post(f"{servers[0].url}/v1/completions", json={"prompt": prompt, "max_tokens": 2})
                if runner.stats.messages:
                    break
                await asyncio.sleep(0.05)
        from llm_epp.sim import tokenizer

        keys = index.hasher.keys(tokenizer.encode(prompt), "sim-model")
        for _ in range(100):
            if len(index.lookup(keys)) == len(keys):
                break
            await asyncio.sleep(0.05)
        assert len(index.lookup(keys)) == len(keys) and index.pods() == [f"127.0.0.1:{servers[0].port}"]
        assert runner.stats.decode.malformed_events == 0 and runner.stats.decode.malformed_messages == 0
    finally:
        runner.stop()
        for s in servers:
            await s.stop()


def test_cli_refuses_vllm_event_flags_on_sglang_pods(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--engine", "sglang", "--kv-events-port", "5557", "--python-hash-seed", "42"])
    assert cli.run(args) == 2
    err = capsys.readouterr().err
    assert "--python-hash-seed shape vLLM's KV events" in err and "SGLang's" in err
