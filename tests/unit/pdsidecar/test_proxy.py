"""The P/D sidecar against real loopback HTTP servers standing in for the prefill and decode model servers:
what each leg receives, what the client gets back, fallbacks and the SSRF allow-list."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from llm_epp.pdsidecar import allowlist as allowlist_mod
from llm_epp.pdsidecar.allowlist import Allowlist
from llm_epp.pdsidecar.proxy import SidecarConfig
from tests.unit.pdsidecar.model_servers import ModelServer, model_server, serving, sidecar

pytestmark = pytest.mark.timeout(30)

NIXL_REQUEST = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 50,
    "temperature": 0.2,
}


@pytest.fixture
async def decode() -> AsyncIterator[ModelServer]:
    async with model_server(ModelServer("decode", cached_tokens=40)) as server:
        yield server


@pytest.fixture
async def prefill() -> AsyncIterator[ModelServer]:
    async with model_server(ModelServer("prefill", cached_tokens=16)) as server:
        yield server


def _config(decode: ModelServer, **kw: Any) -> SidecarConfig:
    return SidecarConfig(decoder_url=f"http://{decode.hostport}", **kw)


async def _post(
    url: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, bytes, dict[str, str]]:
    async with aiohttp.ClientSession() as session:
        async with session.post(url + path, json=body, headers=headers or {}) as resp:
            return resp.status, await resp.read(), dict(resp.headers)


async def test_without_the_header_the_request_passes_through_unchanged(
    decode: ModelServer, prefill: ModelServer
) -> None:
    async with sidecar(_config(decode)) as url:
        status, raw, _ = await _post(url, "/v1/chat/completions", CHAT, {"x-request-id": "client-id"})
        async with aiohttp.ClientSession() as session, session.get(url + "/v1/models?x=1") as resp:
            models = await resp.json()
    assert status == 200
    assert orjson.loads(raw)["usage"]["prompt_tokens_details"]["cached_tokens"] == 40  # untouched
    assert [r.body for r in decode.received] == [CHAT, None]
    assert decode.received[0].headers["x-request-id"] == "client-id"
    assert (decode.received[1].method, decode.received[1].path, decode.received[1].query) == (
        "GET",
        "/v1/models",
        "x=1",
    )
    assert models["server"] == "decode"
    assert prefill.received == []


async def test_nixl_prefill_then_decode(decode: ModelServer, prefill: ModelServer) -> None:
    body = dict(CHAT, max_completion_tokens=60)
    async with sidecar(_config(decode)) as url:
        headers = {"x-prefiller-host-port": prefill.hostport, "x-request-id": "client-id"}
        status, raw, _ = await _post(url, "/v1/chat/completions", body, headers)
    assert status == 200
    [p] = prefill.received
    assert p.path == "/v1/chat/completions"
    assert p.body["kv_transfer_params"] == NIXL_REQUEST
    assert p.body["stream"] is False
    assert (p.body["max_tokens"], p.body["max_completion_tokens"], p.body["min_tokens"]) == (1, 1, 1)
    assert p.body["messages"] == CHAT["messages"] and p.body["temperature"] == 0.2
    [d] = decode.received
    assert d.body == dict(body, kv_transfer_params=prefill.kv_params)  # the client's own limits, no stream added
    assert "x-prefiller-host-port" not in d.headers and "x-prefiller-host-port" not in p.headers
    assert p.headers["x-request-id"] == d.headers["x-request-id"] != "client-id"
    answer = orjson.loads(raw)
    assert answer["server"] == "decode"
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 16  # the prefill's cache hit


async def test_streaming_is_restored_for_decode_and_usage_rewritten(decode: ModelServer, prefill: ModelServer) -> None:
    body = dict(CHAT, stream=True, stream_options={"include_usage": True})
    async with sidecar(_config(decode)) as url:
        status, raw, headers = await _post(
            url, "/v1/chat/completions", body, {"x-prefiller-host-port": prefill.hostport}
        )
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    [p] = prefill.received
    assert p.body["stream"] is False and "stream_options" not in p.body
    [d] = decode.received
    assert d.body["stream"] is True and d.body["stream_options"] == {"include_usage": True}
    assert d.body["max_tokens"] == 50 and "min_tokens" not in d.body
    events = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"]) == "Hello!"
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 16


async def test_responses_api_limits_use_max_output_tokens(decode: ModelServer, prefill: ModelServer) -> None:
    body = {"model": "m", "input": "hi", "max_output_tokens": 30}
    async with sidecar(_config(decode)) as url:
        status, _, _ = await _post(url, "/v1/responses", body, {"x-prefiller-host-port": prefill.hostport})
    assert status == 200
    [p] = prefill.received
    assert p.body["max_output_tokens"] == 1 and "max_tokens" not in p.body
    assert decode.received[0].body["max_output_tokens"] == 30


async def test_prefill_client_errors_are_returned(decode: ModelServer, prefill: ModelServer) -> None:
    prefill.status, prefill.body = 400, b'{"error": "prompt too long"}'
    async with sidecar(_config(decode)) as url:
        status, raw, _ = await _post(
            url, "/v1/completions", {"model": "m", "prompt": "x"}, {"x-prefiller-host-port": prefill.hostport}
        )
    assert (status, orjson.loads(raw)) == (400, {"error": "prompt too long"})
    assert decode.received == []


@pytest.mark.parametrize("failure", ["http-503", "no-kv-params", "down"])
async def test_other_prefill_failures_fall_back_to_local_decode(
    decode: ModelServer, prefill: ModelServer, failure: str
) -> None:
    target = prefill.hostport
    if failure == "http-503":
        prefill.status = 503
    elif failure == "no-kv-params":
        prefill.kv_params = None
    else:
        async with serving(aiohttp.web.Application()) as port:  # a port that is closed once the block ends
            target = f"127.0.0.1:{port}"
    async with sidecar(_config(decode)) as url:
        status, raw, _ = await _post(url, "/v1/chat/completions", CHAT, {"x-prefiller-host-port": target})
    assert status == 200
    [d] = decode.received
    assert d.body == CHAT  # no kv_transfer_params: the decode pod prefills itself
    assert orjson.loads(raw)["usage"]["prompt_tokens_details"]["cached_tokens"] == 40


async def test_ssrf_allow_list_rejects_other_targets(decode: ModelServer, prefill: ModelServer) -> None:
    config = _config(decode, allowlist=Allowlist(["10.1.2.3:8000", "127.0.0.2"]))
    async with sidecar(config) as url:
        status, raw, _ = await _post(url, "/v1/chat/completions", CHAT, {"x-prefiller-host-port": prefill.hostport})
    assert status == 403 and b"SSRF" in raw
    assert prefill.received == [] and decode.received == []


async def test_allow_list_from_an_endpoints_file_follows_changes(
    decode: ModelServer, prefill: ModelServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(allowlist_mod, "_RELOAD_INTERVAL_S", 0.0)
    pool = tmp_path / "endpoints.yaml"
    pool.write_text(f"endpoints:\n  - address: 127.0.0.1\n    port: {prefill.port}\n")
    config = _config(decode, allowlist=Allowlist(endpoints_file=pool))
    headers = {"x-prefiller-host-port": prefill.hostport}
    async with sidecar(config) as url:
        assert (await _post(url, "/v1/chat/completions", CHAT, headers))[0] == 200
        pool.write_text("endpoints:\n  - address: 10.0.0.7\n    port: 8000\n")
        import os

        os.utime(pool, (1, 1))  # a different mtime even within the filesystem's timestamp resolution
        assert (await _post(url, "/v1/chat/completions", CHAT, headers))[0] == 403
    assert len(prefill.received) == 1


async def test_prefiller_sampling_picks_among_the_listed_hosts(decode: ModelServer, prefill: ModelServer) -> None:
    async with model_server(ModelServer("prefill-2")) as second:
        header = f"{prefill.hostport}, {second.hostport}"
        async with sidecar(_config(decode)) as url:  # without sampling: the first host
            await _post(url, "/v1/chat/completions", CHAT, {"x-prefiller-host-port": header})
        async with sidecar(_config(decode, enable_prefiller_sampling=True, sampler=lambda n: n - 1)) as url:
            await _post(url, "/v1/chat/completions", CHAT, {"x-prefiller-host-port": header})
    assert len(prefill.received) == 1 and len(second.received) == 1


async def test_sglang_sends_both_legs_with_the_same_bootstrap_room(decode: ModelServer, prefill: ModelServer) -> None:
    config = _config(decode, kv_connector="sglang", sglang_bootstrap_port=9123)
    async with sidecar(config) as url:
        status, _, _ = await _post(url, "/v1/chat/completions", CHAT, {"x-prefiller-host-port": prefill.hostport})
        for _ in range(100):  # the prefill leg runs in the background
            if prefill.received:
                break
            import asyncio

            await asyncio.sleep(0.01)
    assert status == 200
    [p], [d] = prefill.received, decode.received
    assert p.body == d.body
    assert (d.body["bootstrap_host"], d.body["bootstrap_port"]) == ("127.0.0.1", 9123)
    assert isinstance(d.body["bootstrap_room"], int) and d.body["max_tokens"] == 50


async def test_bad_json_with_the_header_is_a_client_error(decode: ModelServer, prefill: ModelServer) -> None:
    async with sidecar(_config(decode)) as url, aiohttp.ClientSession() as session:
        async with session.post(
            url + "/v1/chat/completions", data=b"{nope", headers={"x-prefiller-host-port": prefill.hostport}
        ) as resp:
            assert resp.status == 400
    assert prefill.received == [] and decode.received == []


async def test_decoder_down_is_a_503(prefill: ModelServer) -> None:
    async with serving(aiohttp.web.Application()) as port:
        closed = f"http://127.0.0.1:{port}"
    async with sidecar(SidecarConfig(decoder_url=closed)) as url:
        status, raw, _ = await _post(url, "/v1/chat/completions", CHAT)
    assert status == 503 and b"decode node is not ready" in raw


@pytest.mark.parametrize(("retries", "prefilled"), [(0, False), (2, True)])
async def test_transient_prefill_errors_are_retried(
    decode: ModelServer, prefill: ModelServer, retries: int, prefilled: bool
) -> None:
    prefill.fail_first = 2
    config = _config(decode, prefill_max_retries=retries, prefill_retry_backoff_s=0.0)
    async with sidecar(config) as url:
        status, _, _ = await _post(url, "/v1/chat/completions", CHAT, {"x-prefiller-host-port": prefill.hostport})
    assert status == 200
    assert len(prefill.received) == (3 if prefilled else 1)
    [d] = decode.received
    assert ("kv_transfer_params" in d.body) is prefilled
