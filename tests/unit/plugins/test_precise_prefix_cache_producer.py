from __future__ import annotations

import asyncio
import time

import msgspec
import pytest
import zmq

from llm_epp.framework import ApiKind, CycleState, InferenceRequest, ProfileResult, RequestBody, SchedulingResult
from llm_epp.framework.kvindex import KVIndexSettings
from llm_epp.framework.registry import PluginParamsError
from llm_epp.framework.tokenization import TOKENIZED_PROMPT_KEY, MultiModalFeature, TokenizedPrompt
from llm_epp.kvcache import InMemoryKVIndex
from llm_epp.kvcache.events import SEQ, DecodeStats, decode_batch
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import PREFIX_MATCH_KEY
from llm_epp.plugins.requestcontrol.precise_prefix_cache_producer import (
    PRECISE_MATCH_KEY,
    Params,
    PrecisePrefixCacheProducer,
    mm_block_extras,
)
from llm_epp.plugins.scheduling.no_hit_lru_scorer import NoHitLruScorer
from tests.unit.builders import FakeHandle, endpoint, request

REGISTRY = builtin_registry()
MODEL = "m"
A = endpoint("a", address="10.0.0.1", port=8000)
B = endpoint("b", address="10.0.0.2", port=8000)
C = endpoint("c", address="10.0.0.3", port=8000)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(params: dict | None = None, clock: Clock | None = None, handle: FakeHandle | None = None):
    p = REGISTRY.parse_params("precise-prefix-cache-producer", params)
    assert isinstance(p, Params)
    index = InMemoryKVIndex("x", p.settings(), clock=clock or Clock())
    return PrecisePrefixCacheProducer("precise", p, handle or FakeHandle(), index=index), index


def feed(index: InMemoryKVIndex, pod: str, *events) -> None:
    batch = decode_batch(msgspec.msgpack.encode([0.0, list(events), 0]), DecodeStats())
    assert batch is not None
    index.index.apply(pod, MODEL, batch)


async def produce(plugin: PrecisePrefixCacheProducer, tokens, salt: str = "", eps=(A, B, C)) -> CycleState:
    cycle = CycleState()
    cycle.write(TOKENIZED_PROMPT_KEY, TokenizedPrompt(tuple(tokens), salt))
    await plugin.prepare_data(cycle, request(MODEL), list(eps))
    return cycle


async def test_weighted_longest_prefix_from_engine_events() -> None:
    plugin, index = make({"tokenProcessorConfig": {"blockSizeTokens": 4}})
    prompt = list(range(16))  # four blocks
    # A holds the first three blocks on GPU; B the first two, the second only on CPU
    feed(index, A.hostport, ["BlockStored", [1, 2, 3], None, prompt[:12], 4, None, "GPU"])
    feed(index, B.hostport, ["BlockStored", [1], None, prompt[:4], 4, None, "GPU"])
    feed(
        index,
        B.hostport,
        {
            "type": "BlockStored",
            "block_hashes": [2],
            "parent_block_hash": 1,
            "token_ids": prompt[4:8],
            "block_size": 4,
            "medium": "CPU",
        },
    )
    cycle = await produce(plugin, [*prompt, 99])  # the partial tail is ignored
    precise = cycle.read(PRECISE_MATCH_KEY)
    assert precise is not None and precise.total_blocks == 4
    assert dict(precise.weighted) == {A.key: 3.0, B.key: pytest.approx(1.8)}
    assert precise.score(A.key) == 0.75 and precise.score(C.key) == 0.0
    prefix = cycle.read(PREFIX_MATCH_KEY)
    assert prefix is not None and dict(prefix.matches) == {A.key: 3, B.key: 2}
    # no-hit-lru sees a warm request
    lru = NoHitLruScorer()
    assert set(lru.score(cycle, request(MODEL), [A, B, C]).values()) == {0.5}
    # engine evicts A's second block: A keeps one leading block
    feed(index, A.hostport, ["BlockRemoved", [2], "GPU"])
    cycle = await produce(plugin, prompt)
    precise = cycle.read(PRECISE_MATCH_KEY)
    assert precise is not None and precise.weighted[A.key] == 1.0


async def test_cache_salt_and_lora_isolate_prefixes() -> None:
    plugin, index = make({"tokenProcessorConfig": {"blockSizeTokens": 4}})
    feed(index, A.hostport, ["BlockStored", [1], None, [1, 2, 3, 4], 4, None, "GPU", None, [["salt-1"]]])
    salted = (await produce(plugin, [1, 2, 3, 4], salt="salt-1")).read(PRECISE_MATCH_KEY)
    plain = (await produce(plugin, [1, 2, 3, 4])).read(PRECISE_MATCH_KEY)
    other = (await produce(plugin, [1, 2, 3, 4], salt="salt-2")).read(PRECISE_MATCH_KEY)
    assert salted is not None and salted.weighted == {A.key: 1.0}
    assert plain is not None and not plain.weighted
    assert other is not None and not other.weighted


async def test_image_blocks_match_only_requests_with_the_same_image() -> None:
    """vLLM lists the image's identifier in the extra keys of the blocks its placeholder tokens cover; the
    request side puts the render endpoint's mm hash on the same blocks, so the same tokens with another
    image do not match past the text before it."""
    plugin, index = make({"tokenProcessorConfig": {"blockSizeTokens": 4}})
    prompt = list(range(16))  # the image's placeholder tokens are 5..10: blocks 1 and 2
    extra = [None, [["img-a", 0]], [["img-a", 3]], None]
    feed(index, A.hostport, ["BlockStored", [1, 2, 3, 4], None, prompt, 4, None, "GPU", None, extra])

    async def held(image: str | None, salt: str = "") -> float:
        cycle = CycleState()
        features = (MultiModalFeature("image", image, 5, 6),) if image else ()
        cycle.write(TOKENIZED_PROMPT_KEY, TokenizedPrompt(tuple(prompt), salt, mm_features=features))
        await plugin.prepare_data(cycle, request(MODEL), [A, B])
        match = cycle.read(PRECISE_MATCH_KEY)
        assert match is not None
        return match.weighted.get(A.key, 0.0)

    assert await held("img-a") == 4.0
    assert await held("img-b") == 1.0  # the text block before the image only
    assert await held(None) == 1.0
    assert mm_block_extras((MultiModalFeature("image", "x", 5, 6),), 4, 16) == [None, ["x"], ["x"], None]
    assert mm_block_extras((MultiModalFeature("image", "x", 0, 0),), 4, 16) is None  # no placeholder range


@pytest.mark.parametrize(("backends", "weight"), [(None, 1.0), ([{"name": "CPU_PINNED", "weight": 0.5}], 0.5)])
async def test_sglang_tiers_weigh_as_configured(backends: list[dict] | None, weight: float) -> None:
    """SGLang's host tier is `CPU_PINNED`: not a default backend, so it weighs 1.0 (as upstream) until a
    kvCacheBackendConfigs entry names it (matched case-insensitively)."""
    indexer = {"kvCacheBackendConfigs": backends} if backends else {}
    plugin, index = make({"tokenProcessorConfig": {"blockSizeTokens": 4}, "indexerConfig": indexer})
    feed(index, A.hostport, ["BlockStored", [-5, -6], None, list(range(8)), 4, None, "CPU_PINNED"])
    match = (await produce(plugin, range(8))).read(PRECISE_MATCH_KEY)
    assert match is not None and match.weighted == {A.key: pytest.approx(2 * weight)}


async def test_no_tokens_no_match_info() -> None:
    plugin, _ = make()
    cycle = CycleState()
    await plugin.prepare_data(cycle, request(MODEL), [A])
    assert cycle.read(PRECISE_MATCH_KEY) is None and cycle.read(PREFIX_MATCH_KEY) is None


async def test_speculative_entries_route_a_burst_together_until_the_ttl() -> None:
    clock = Clock()
    plugin, _index = make(
        {"tokenProcessorConfig": {"blockSizeTokens": 4}, "speculativeIndexing": True, "speculativeTTL": "2s"},
        clock=clock,
    )
    prompt = list(range(8))
    cycle = await produce(plugin, prompt)
    result = SchedulingResult(
        {"decode": ProfileResult((B,)), "prefill": ProfileResult((C,))}, primary_profile_name="decode"
    )
    plugin.pre_request(cycle, request(MODEL), result)
    follow = (await produce(plugin, prompt)).read(PRECISE_MATCH_KEY)
    assert follow is not None and follow.weighted == {B.key: 2.0, C.key: 2.0}
    clock.t += 2.5
    gone = (await produce(plugin, prompt)).read(PRECISE_MATCH_KEY)
    assert gone is not None and not gone.weighted


async def test_speculative_indexing_is_off_by_default() -> None:
    plugin, _ = make({"tokenProcessorConfig": {"blockSizeTokens": 4}})
    cycle = await produce(plugin, list(range(8)))
    plugin.pre_request(cycle, request(MODEL), SchedulingResult({"d": ProfileResult((A,))}, "d"))
    after = (await produce(plugin, list(range(8)))).read(PRECISE_MATCH_KEY)
    assert after is not None and not after.weighted


async def test_end_to_end_with_a_real_publisher_following_the_pool() -> None:
    """The pool's endpoint publishes on 127.0.0.1; the producer subscribes on its first request."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    pod = endpoint("p", address="127.0.0.1", port=8000)
    handle = FakeHandle(pool=[pod])
    plugin, index = make(
        {
            "tokenProcessorConfig": {"blockSizeTokens": 4},
            "kvEventsConfig": {"podDiscoveryConfig": {"socketPort": port}},
        },
        handle=handle,
    )
    try:
        prompt = list(range(8))
        await produce(plugin, prompt, eps=[pod])  # starts the subscriber
        payload = msgspec.msgpack.encode([0.0, [["BlockStored", [5, 6], None, prompt, 4]], 0])
        deadline = time.monotonic() + 10
        weighted: dict = {}
        while not weighted:
            assert time.monotonic() < deadline, "events never arrived"
            pub.send_multipart([b"kv@127.0.0.1:8000@m", SEQ.pack(0), payload])
            await asyncio.sleep(0.05)
            match = (await produce(plugin, prompt, eps=[pod])).read(PRECISE_MATCH_KEY)
            weighted = dict(match.weighted) if match else {}
        assert weighted == {pod.key: 2.0}
        assert index.runner.subscribed() == ["127.0.0.1:8000"]
    finally:
        index.stop()
        pub.close(0)
        ctx.destroy(0)


def test_settings_follow_the_upstream_parameters() -> None:
    p = Params.model_validate(
        {
            "tokenProcessorConfig": {"blockSize": 64, "hashSeed": "42"},
            "indexerConfig": {
                "kvBlockIndexConfig": {"inMemoryConfig": {"size": 1000, "podCacheSize": 3}},
                "kvCacheBackendConfigs": [{"name": "GPU", "weight": 1.0}, {"name": "cpu", "weight": 0.5}],
            },
            "kvEventsConfig": {
                "topicFilter": "kv@",
                "concurrency": 8,
                "engineType": "sglang",
                "podDiscoveryConfig": {"socketPort": 5556, "replaySocketPort": 5558},
            },
            "speculativeIndexing": True,
            "speculativeTTL": "500ms",
        }
    )
    assert p.settings() == KVIndexSettings(
        block_size=64,
        hash_seed="42",
        size=1000,
        pod_cache_size=3,
        medium_weights={"gpu": 1.0, "cpu": 0.5},
        engine_type="sglang",
        socket_port=5556,
        replay_socket_port=5558,
        concurrency=8,
    )
    assert p.ttl() == 0.5
    assert Params().settings().concurrency == 4  # upstream's default; 0 (Go's unset) means the same
    assert Params.model_validate({"kvEventsConfig": {"concurrency": 0}}).settings().concurrency == 4
    enabled = {"indexerConfig": {"kvBlockIndexConfig": {"enableMetrics": True}}}
    assert Params.model_validate(enabled).settings().enable_metrics and not Params().settings().enable_metrics
    for interval, seconds in ((6_000_000_000, 6.0), ("1m", 60.0), (0, 0.0)):  # Go nanoseconds or a duration
        logged = {"indexerConfig": {"kvBlockIndexConfig": {"metricsLoggingInterval": interval}}}
        assert Params.model_validate(logged).settings().metrics_logging_interval == seconds
    assert Params().settings().block_size == 16 and Params().ttl() == 2.0
    central = Params.model_validate({"kvEventsConfig": {"zmqEndpoint": "tcp://*:5557"}}).settings()
    assert central.zmq_endpoint == "tcp://*:5557" and not central.discover_pods


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"indexerConfig": {"kvBlockIndexConfig": {"redisConfig": {"address": "redis://x"}}}}, "not supported yet"),
        ({"indexerConfig": {"kvBlockIndexConfig": {"costAwareMemoryConfig": {"size": "2GiB"}}}}, "not supported yet"),
        ({"indexerConfig": {"tokenizersPoolConfig": {"modelName": "m"}}}, "configure a token-producer"),
        ({"tokenProcessorConfig": {"hashAlgorithm": "sha1"}}, "unsupported hashAlgorithm"),
        ({"tokenProcessorConfig": {"blockSizeTokens": -1}}, "greater than 0"),
        ({"speculativeTTL": "soon"}, "invalid duration"),
        ({"kvEventsConfig": {"engineType": "trt"}}, "engineType"),
        ({"kvEventsConfig": {"unknown": 1}}, "unknown"),
        ({"kvEventsConfig": {"concurrency": -1}}, "concurrency"),
        ({"kvEventsConfig": {"concurrency": 10_000}}, "concurrency"),
        ({"indexerConfig": {"kvBlockIndexConfig": {"metricsLoggingInterval": "soon"}}}, "invalid duration"),
    ],
    ids=[
        "redis",
        "cost-aware",
        "tokenizers-pool",
        "hash-algorithm",
        "block-size",
        "ttl",
        "engine",
        "unknown-key",
        "negative-concurrency",
        "huge-concurrency",
        "metrics-logging",
    ],
)
def test_unsupported_or_bad_parameters_are_rejected(params: dict, message: str) -> None:
    with pytest.raises(PluginParamsError, match=message):
        REGISTRY.parse_params("precise-prefix-cache-producer", params)


async def test_prefix_cache_scorer_reads_the_precise_match_and_no_approx_producer_is_added() -> None:
    from llm_epp.config import load_config_text
    from tests.unit.builders import FakeRecorder

    text = """
plugins:
- type: token-producer
- type: precise-prefix-cache-producer
  parameters: {tokenProcessorConfig: {blockSizeTokens: 4}}
- type: prefix-cache-scorer
- type: max-score-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
  - pluginRef: max-score-picker
"""
    loaded = load_config_text(text, REGISTRY, FakeRecorder())
    assert "approx-prefix-cache-producer" not in loaded.plugin_types.values()
    producer = next(p for p in loaded.plugins.values() if isinstance(p, PrecisePrefixCacheProducer))
    assert isinstance(producer.index, InMemoryKVIndex)
    feed(producer.index, B.hostport, ["BlockStored", [1, 2], None, list(range(8)), 4])
    cycle = CycleState()
    # a generate request carries token ids: the token-producer passes them on, the producer looks them up
    req = InferenceRequest("r", MODEL, MODEL, RequestBody(ApiKind.GENERATE, {}, token_ids=tuple(range(8))))
    eps = [A, B, C]
    assert [p.typed_name.type for p in loaded.prepare_data] == ["token-producer", "precise-prefix-cache-producer"]
    for plugin in loaded.prepare_data:
        await plugin.prepare_data(cycle, req, eps)
    result = loaded.scheduler.schedule(req, eps, cycle)
    assert result.primary is not None and result.primary.target_endpoints[0].key == B.key
    assert result.primary.scores[B.key]["prefix-cache-scorer"] == 1.0


def test_pod_selection_other_than_the_pool_is_refused() -> None:
    from llm_epp.framework.registry import PluginParamsError
    from llm_epp.plugins import builtin_registry

    registry = builtin_registry()
    for discovery in ({"podLabelSelector": "app=vllm"}, {"podNamespace": "other"}):
        with pytest.raises(PluginParamsError, match="not supported yet"):
            registry.parse_params(
                "precise-prefix-cache-producer", {"kvEventsConfig": {"podDiscoveryConfig": discovery}}
            )
    defaults = {"podLabelSelector": "llm-d.ai/inference-serving=true", "socketPort": 5556}
    registry.parse_params("precise-prefix-cache-producer", {"kvEventsConfig": {"podDiscoveryConfig": defaults}})
