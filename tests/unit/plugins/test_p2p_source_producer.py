"""Tests for p2p-source-producer: a peer caching within one block of the most prompt tokens is named in
`x-kv-cache-source-host-port` when it out-caches the computing endpoint."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from llm_epp.config.loader import load_config_text
from llm_epp.framework import CycleState, Endpoint, EndpointMetadata, Metrics, ProfileResult, SchedulingResult
from llm_epp.framework.registry import PluginParamsError
from llm_epp.framework.requestcontrol import REQUEST_HEADERS_KEY
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.requestcontrol import p2p_source_producer as mod
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import PREFIX_MATCH_KEY, PrefixMatch
from llm_epp.plugins.requestcontrol.p2p_source_producer import HEADER, P2pSourceProducer, Params, spread_fraction
from tests.unit.builders import FakeRecorder, key, request


def pool(**queues: int) -> list[Endpoint]:
    return [
        Endpoint(EndpointMetadata(key(n), f"10.0.9.{i}", 8000), Metrics(waiting_queue_size=q, update_time=1))
        for i, (n, q) in enumerate(queues.items(), start=1)
    ]


def run(
    producer: P2pSourceProducer,
    eps: list[Endpoint],
    blocks: dict[str, int],
    picked: str,
    request_id: str = "r1",
    profiles: dict[str, str] | None = None,
) -> str | None:
    """PrepareData, then PreRequest with `picked` as the primary pick; the header written, if any."""
    cycle = CycleState()
    cycle.write(PREFIX_MATCH_KEY, PrefixMatch(list(range(100)), {key(n): b for n, b in blocks.items()}, 16))
    req = request(request_id=request_id)
    asyncio.run(producer.prepare_data(cycle, req, eps))
    by_name = {e.key.name: e for e in eps}
    results = {"decode": ProfileResult((by_name[picked],))}
    for profile, name in (profiles or {}).items():
        results[profile] = ProfileResult((by_name[name],))
    producer.pre_request(cycle, req, SchedulingResult(results, "decode"))
    return (cycle.read(REQUEST_HEADERS_KEY) or {}).get(HEADER)


def test_names_the_best_cached_peer() -> None:
    eps = pool(a=0, b=0, c=0)
    assert run(P2pSourceProducer(), eps, {"a": 40, "b": 2}, picked="c") == "10.0.9.1:8000"


def test_no_header_when_the_computing_endpoint_is_the_peer_or_caches_as_much() -> None:
    eps = pool(a=0, b=0)
    assert run(P2pSourceProducer(), eps, {"a": 40}, picked="a") is None
    # b caches as much as a: whichever of the two is drawn, it does not out-cache b
    assert all(run(P2pSourceProducer(), eps, {"a": 40, "b": 40}, "b", f"r{i}") is None for i in range(20))


def test_min_cached_token_delta() -> None:
    eps = pool(a=0, b=0)
    # a holds 10 blocks = 160 tokens, the computing b 8 blocks = 128: delta 32
    assert run(P2pSourceProducer(params=Params(min_cached_token_delta=32)), eps, {"a": 10, "b": 8}, "b")
    assert run(P2pSourceProducer(params=Params(min_cached_token_delta=33)), eps, {"a": 10, "b": 8}, "b") is None


def test_no_prefix_data_no_header() -> None:
    eps = pool(a=0, b=0)
    assert run(P2pSourceProducer(), eps, {}, picked="b") is None


def test_the_prefill_pick_is_the_computing_endpoint() -> None:
    eps = pool(a=0, b=0, c=0)
    # decode picked c (no cache), prefill picked a, the best peer: header unset since a computes
    assert run(P2pSourceProducer(), eps, {"a": 40}, picked="c", profiles={"prefill": "a"}) is None
    custom = P2pSourceProducer(params=Params(prefill_profile_name="pf"))
    assert run(custom, eps, {"a": 40}, picked="c", profiles={"pf": "b"}) == "10.0.9.1:8000"


def test_peers_within_one_block_share_the_pulls_weighted_by_queue() -> None:
    eps = pool(a=0, b=3, c=0, d=0)
    # a: 40 blocks, b: 40, c: 39 (within one block), d: 30 (outside the band); d computes
    picks = Counter(
        run(P2pSourceProducer(), eps, {"a": 40, "b": 40, "c": 39, "d": 30}, "d", f"req-{i}") for i in range(900)
    )
    assert set(picks) == {"10.0.9.1:8000", "10.0.9.2:8000", "10.0.9.3:8000"}
    # weights 1 : 1/4 : 1 -> b gets about a ninth
    assert picks["10.0.9.2:8000"] < picks["10.0.9.1:8000"] / 2
    assert picks["10.0.9.2:8000"] < picks["10.0.9.3:8000"] / 2


def test_spread_fraction_is_fnv1a_32() -> None:
    assert spread_fraction("") == 0x811C9DC5 / 2**32
    assert spread_fraction("a") == 0xE40C292C / 2**32


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"minCachedTokenDelta": 0}, "greater than or equal to 1"),
        ({"prefixMatchInfoProducerName": "cpu/prefix"}, "is not a plugin name"),
    ],
    ids=["delta", "precise"],
)
def test_bad_parameters(raw: dict[str, object], problem: str) -> None:
    with pytest.raises(PluginParamsError, match=problem):
        builtin_registry().parse_params(mod.TYPE, raw)


CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: p2p-source-producer
- type: queue-scorer
"""


def test_a_configuration_with_only_this_consumer_gets_the_prefix_producer() -> None:
    loaded = load_config_text(CONFIG, builtin_registry(), FakeRecorder())
    assert "approx-prefix-cache-producer" in loaded.plugin_types.values()
    assert any(isinstance(p, P2pSourceProducer) for p in loaded.pre_request)
