"""Prefix consumers that name a prefix producer instance (`prefixMatchInfoProducerName`): two approximate
producers of different capacities keep independent indexes, each read by the scorer that names it."""

from __future__ import annotations

import asyncio

import pytest

from llm_epp.config.graph import consumes
from llm_epp.config.loader import ConfigError, load_config_text
from llm_epp.framework import (
    ApiKind,
    CycleState,
    Endpoint,
    EndpointMetadata,
    InferenceRequest,
    Metrics,
    NullRecorder,
    ProfileResult,
    RequestBody,
    SchedulingResult,
)
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import (
    PREFIX_MATCH_KEY,
    ApproxPrefixCacheProducer,
    prefix_match_key,
)
from llm_epp.plugins.scheduling.prefix_cache_scorer import PrefixCacheScorer
from tests.unit.builders import key

TIERED = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: token-producer
- type: approx-prefix-cache-producer
  name: cpu-prefix-cache-producer
  parameters: {autoTune: false, lruCapacityPerServer: CAPACITY}
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
  name: gpu-prefix-cache-scorer
- type: prefix-cache-scorer
  name: cpu-prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: cpu-prefix-cache-producer}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: gpu-prefix-cache-scorer, weight: 1}
  - {pluginRef: cpu-prefix-cache-scorer, weight: 1}
"""


def tiered(capacity: int = 1000) -> str:
    return TIERED.replace("CAPACITY", str(capacity))


def ep(name: str, i: int) -> Endpoint:
    return Endpoint(EndpointMetadata(key(name), f"10.0.3.{i}", 8000), Metrics())


def completion(text: str) -> InferenceRequest:
    return InferenceRequest("r", "m", "m", RequestBody(ApiKind.COMPLETIONS, {"model": "m", "prompt": text}))


def test_the_tiered_config_gets_a_default_producer_beside_the_named_one() -> None:
    loaded = load_config_text(tiered(), builtin_registry(), NullRecorder())
    producers = {n: t for n, t in loaded.plugin_types.items() if t == "approx-prefix-cache-producer"}
    assert producers == {
        "approx-prefix-cache-producer": "approx-prefix-cache-producer",  # created for the unparameterised scorer
        "cpu-prefix-cache-producer": "approx-prefix-cache-producer",
    }
    default = loaded.plugins["approx-prefix-cache-producer"]
    cpu = loaded.plugins["cpu-prefix-cache-producer"]
    assert isinstance(default, ApproxPrefixCacheProducer) and isinstance(cpu, ApproxPrefixCacheProducer)
    assert default.index is not cpu.index
    assert (cpu.params.auto_tune, cpu.params.lru_capacity_per_server) == (False, 1000)
    assert default.params.lru_capacity_per_server == 31250
    gpu_scorer = loaded.plugins["gpu-prefix-cache-scorer"]
    cpu_scorer = loaded.plugins["cpu-prefix-cache-scorer"]
    assert isinstance(gpu_scorer, PrefixCacheScorer) and isinstance(cpu_scorer, PrefixCacheScorer)
    assert gpu_scorer.consumes == {PREFIX_MATCH_KEY.name}
    assert cpu_scorer.consumes == {"prefix-cache-match-info/cpu-prefix-cache-producer"}
    assert default.produces == gpu_scorer.consumes and cpu.produces == cpu_scorer.consumes


def test_each_scorer_reads_its_own_producers_index() -> None:
    # the named producer's LRU holds 2 blocks per endpoint, the default one the reference's 31250
    loaded = load_config_text(tiered(capacity=2), builtin_registry(), NullRecorder())
    gpu_scorer = loaded.plugins["gpu-prefix-cache-scorer"]
    cpu_scorer = loaded.plugins["cpu-prefix-cache-scorer"]
    assert isinstance(gpu_scorer, PrefixCacheScorer) and isinstance(cpu_scorer, PrefixCacheScorer)
    a, b = ep("a", 1), ep("b", 2)
    result = SchedulingResult({"default": ProfileResult((a,))}, "default")

    def serve(prompt: str) -> CycleState:
        cycle = CycleState()
        for p in loaded.prepare_data:
            asyncio.run(p.prepare_data(cycle, completion(prompt), [a, b]))
        for q in loaded.pre_request:
            q.pre_request(cycle, completion(prompt), result)
        return cycle

    def scores(cycle: CycleState, prompt: str) -> tuple[dict[object, float], dict[object, float]]:
        request = completion(prompt)
        return dict(gpu_scorer.score(cycle, request, [a, b])), dict(cpu_scorer.score(cycle, request, [a, b]))

    short = "y" * 64 * 2  # 2 blocks of 16 tokens x 4 characters: fits both LRUs
    serve(short)
    assert scores(serve(short), short) == ({key("a"): 1.0, key("b"): 0.0}, {key("a"): 1.0, key("b"): 0.0})

    long = "x" * 64 * 5  # 5 blocks: the small LRU keeps only the last 2, so its prefix walk stops at once
    serve(long)
    cycle = serve(long)
    gpu_match = cycle.read(PREFIX_MATCH_KEY)
    cpu_match = cycle.read(prefix_match_key("cpu-prefix-cache-producer"))
    assert gpu_match is not None and cpu_match is not None
    assert (gpu_match.matches, cpu_match.matches) == ({key("a"): 5}, {})
    assert scores(cycle, long) == ({key("a"): 1.0, key("b"): 0.0}, {key("a"): 0.0, key("b"): 0.0})


CONSUMERS = {
    "prefix-cache-scorer": "",
    "no-hit-lru-scorer": "",
    "prefix-cache-affinity-filter": "",
    "p2p-source-producer": "",
    "pd-profile-handler": ", threshold: 10",
}


def consumer_config(plugin_type: str, producer_name: str, extra: str = "") -> str:
    profiles = (
        "schedulingProfiles:\n- {name: decode, plugins: [{pluginRef: queue-scorer}]}\n"
        "- {name: prefill, plugins: [{pluginRef: queue-scorer}]}\n"
        if plugin_type == "pd-profile-handler"
        else ""
    )
    return (
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
        "- type: queue-scorer\n"
        "- type: approx-prefix-cache-producer\n  name: small\n"
        f"- type: {plugin_type}\n  name: consumer\n"
        f"  parameters: {{prefixMatchInfoProducerName: {producer_name}{CONSUMERS[plugin_type]}}}\n"
        f"{extra}{profiles}"
    )


@pytest.mark.parametrize("plugin_type", sorted(CONSUMERS))
def test_a_consumer_runs_after_the_producer_it_names(plugin_type: str) -> None:
    loaded = load_config_text(consumer_config(plugin_type, "small"), builtin_registry(), NullRecorder())
    consumer = loaded.plugins["consumer"]
    assert consumes(consumer) == {"prefix-cache-match-info/small"}
    assert "approx-prefix-cache-producer" not in loaded.plugin_types  # nothing reads the default match
    if plugin_type == "p2p-source-producer":  # a PrepareData consumer is ordered after its producer
        names = [p.typed_name.name for p in loaded.prepare_data]
        assert names.index("small") < names.index("consumer")


@pytest.mark.parametrize("plugin_type", sorted(CONSUMERS))
@pytest.mark.parametrize("producer_name", ["nowhere", "queue-scorer", "precise-prefix-cache-producer"])
def test_a_name_no_declared_prefix_producer_has_is_rejected(plugin_type: str, producer_name: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config_text(consumer_config(plugin_type, producer_name), builtin_registry(), NullRecorder())
    assert f"no declared plugin named {producer_name!r} produces it" in str(err.value)
    assert f"name: {producer_name}" in str(err.value)


@pytest.mark.parametrize("plugin_type", sorted(CONSUMERS))
def test_the_default_producers_type_name_reads_the_default_match(plugin_type: str) -> None:
    loaded = load_config_text(
        consumer_config(plugin_type, "approx-prefix-cache-producer"), builtin_registry(), NullRecorder()
    )
    assert consumes(loaded.plugins["consumer"]) == {PREFIX_MATCH_KEY.name}
    assert loaded.plugin_types["approx-prefix-cache-producer"] == "approx-prefix-cache-producer"
