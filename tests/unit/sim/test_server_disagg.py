"""Live simulated P/D pods over loopback HTTP: a prefill pod answering the prefill leg with vLLM's NIXL
parameters, a decode pod pulling the KV behind the real `llm-epp pd-sidecar` proxy, the transfer metrics, and
the role labels of `llm-epp sim --role`."""

from __future__ import annotations

import argparse
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from llm_epp.datalayer.static import parse_endpoints_file
from llm_epp.pdsidecar.allowlist import Allowlist
from llm_epp.pdsidecar.proxy import SidecarConfig
from llm_epp.sim import cli
from llm_epp.sim.disagg import KvTransfer
from llm_epp.sim.live import LivePod
from llm_epp.sim.profiles import TINY
from llm_epp.sim.server import SimServer
from tests.unit.pdsidecar.model_servers import sidecar

pytestmark = pytest.mark.timeout(30)

SCALE = 0.01
PROMPT = "abcd" * 200  # 200 tokens


@pytest.fixture
async def pods() -> AsyncIterator[tuple[SimServer, SimServer]]:
    transfer = KvTransfer(bandwidth=1e9, setup_latency=0.001)
    prefill = SimServer(LivePod("p", TINY, time_scale=SCALE, role="prefill", kv_transfer=transfer))
    decode = SimServer(LivePod("d", TINY, time_scale=SCALE, role="decode", kv_transfer=transfer))
    await prefill.start()
    await decode.start()
    try:
        yield prefill, decode
    finally:
        await prefill.stop()
        await decode.stop()


def _sample(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
    assert match, name
    return float(match.group(1))


async def test_a_prefill_leg_returns_nixl_parameters(pods: tuple[SimServer, SimServer]) -> None:
    prefill, _ = pods
    leg = {"prompt": PROMPT, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
    async with httpx.AsyncClient(timeout=10) as c:
        answer = (await c.post(f"{prefill.url}/v1/completions", json=leg)).json()
        plain = (await c.post(f"{prefill.url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 1})).json()
    params = answer["kv_transfer_params"]
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert (params["remote_host"], params["remote_port"]) == ("127.0.0.1", prefill.port)
    assert params["remote_engine_id"] == "p-engine" and len(params["remote_block_ids"]) == 13  # ceil(200 / 16)
    assert answer["usage"]["completion_tokens"] == 1
    assert "kv_transfer_params" not in plain


async def test_through_the_sidecar_the_decode_pod_pulls_the_kv_and_reports_it(
    pods: tuple[SimServer, SimServer],
) -> None:
    prefill, decode = pods
    config = SidecarConfig(decoder_url=decode.url, allowlist=Allowlist([prefill.address]))
    body = {"prompt": PROMPT, "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
    async with sidecar(config) as url, httpx.AsyncClient(timeout=10) as c:
        r = await c.post(f"{url}/v1/completions", json=body, headers={"x-prefiller-host-port": prefill.address})
        assert r.status_code == 200
        chunks = [line for line in r.text.splitlines() if line.startswith("data: {")]
        decode_metrics = (await c.get(f"{decode.url}/metrics")).text
        prefill_metrics = (await c.get(f"{prefill.url}/metrics")).text
    assert len(chunks) == 6  # five tokens and the usage chunk
    assert '"completion_tokens":5' in chunks[-1]
    assert _sample(decode_metrics, "vllm:nixl_bytes_transferred_sum") == 200 * TINY.kv_bytes_per_token
    assert _sample(decode_metrics, "vllm:nixl_xfer_time_seconds_count") == 1
    assert _sample(decode_metrics, "vllm:prefix_cache_hits_total") == 0
    assert _sample(prefill_metrics, "vllm:generation_tokens_total") == 1  # the prefill leg's one token
    assert _sample(prefill_metrics, "vllm:nixl_xfer_time_seconds_count") == 0


async def test_incomplete_parameters_are_ignored_and_the_prompt_prefilled_locally(
    pods: tuple[SimServer, SimServer],
) -> None:
    _, decode = pods
    body = {"prompt": PROMPT, "max_tokens": 2, "kv_transfer_params": {"do_remote_prefill": True, "remote_host": "x"}}
    async with httpx.AsyncClient(timeout=10) as c:
        assert (await c.post(f"{decode.url}/v1/completions", json=body)).status_code == 200
        metrics = (await c.get(f"{decode.url}/metrics")).text
    assert _sample(metrics, "vllm:nixl_xfer_time_seconds_count") == 0


async def test_cli_roles_are_labelled_in_the_endpoints_file(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--pods", "3", "--time-scale", "0.01", "--role", "prefill,decode,both"])
    servers = await cli.start_pods(args)
    try:
        text = cli.endpoints_yaml(servers)
        _pool, endpoints = parse_endpoints_file(text, str(tmp_path / "e.yaml"))
        assert [e.labels.get("llm-d.ai/role") for e in endpoints] == ["prefill", "decode", "prefill-decode"]
    finally:
        for s in servers:
            await s.stop()
    assert cli.pod_roles("decode", 2) == ["decode", "decode"]
    assert cli.pod_roles("", 2) == [None, None]
    with pytest.raises(ValueError, match="one per pod"):
        cli.pod_roles("prefill,decode", 3)
    with pytest.raises(ValueError, match="encode"):
        cli.pod_roles("encode", 1)
    bad = parser.parse_args(["--role", "encode"])
    assert cli.run(bad) == 2
