"""`mm-embeddings-cache-producer`'s counters exported under llm-d-router's encoder-cache metric names."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llm_epp.framework import ApiKind, CycleState, Endpoint, EndpointMetadata, InferenceRequest, Metrics, RequestBody
from llm_epp.framework.datalayer import EVENT_DELETE, EndpointEvent
from llm_epp.framework.tokenization import TOKENIZED_PROMPT_KEY, MultiModalFeature, TokenizedPrompt
from llm_epp.framework.types import ProfileResult, SchedulingResult
from llm_epp.observability.encoder_cache_metrics import encoder_cache_sources, register_encoder_cache_metrics
from llm_epp.plugins.requestcontrol.mm_embeddings_cache_producer import MmEmbeddingsCacheProducer, Params
from tests.unit.builders import FakeHandle, key

A = Endpoint(EndpointMetadata(key("a"), "10.0.7.1", 8000), Metrics())
B = Endpoint(EndpointMetadata(key("b"), "10.0.7.2", 8000), Metrics())
REQ = InferenceRequest("r", "m", "m", RequestBody(ApiKind.CHAT_COMPLETIONS, {"model": "m"}))


def serve(p: MmEmbeddingsCacheProducer, features: tuple[MultiModalFeature, ...], to: Endpoint) -> None:
    cycle = CycleState()
    cycle.write(TOKENIZED_PROMPT_KEY, TokenizedPrompt((1, 2, 3), mm_features=features))
    asyncio.run(p.prepare_data(cycle, REQ, [A, B]))
    p.pre_request(cycle, REQ, SchedulingResult({"d": ProfileResult((to,))}, "d"))


def test_queries_hits_and_hit_ratio_are_exported() -> None:
    producer = MmEmbeddingsCacheProducer("enc", Params(), FakeHandle(pool=[A, B]))
    registry = CollectorRegistry()
    assert encoder_cache_sources([producer, object()]) == [producer]
    register_encoder_cache_metrics(registry, encoder_cache_sources([producer]))
    image, clip = MultiModalFeature("image", "i1", 0, 4), MultiModalFeature("video", "v1", 4, 4)
    serve(producer, (image,), A)  # a miss everywhere
    serve(producer, (image, clip, MultiModalFeature("hologram", "h1", 8, 4)), B)  # i1 held by A
    text = generate_latest(registry).decode()
    enc = {"plugin_type": "mm-embeddings-cache-producer", "plugin_name": "enc"}
    assert value(text, "llm_d_epp_encoder_cache_queries_total", modality="image", **enc) == 2
    assert value(text, "llm_d_epp_encoder_cache_queries_total", modality="other", **enc) == 1  # unknown modality
    assert value(text, "llm_d_epp_encoder_cache_hits_total", pod="default/a", modality="image", **enc) == 1
    assert value(text, "llm_d_epp_encoder_cache_hit_ratio_count", **enc) == 4  # two candidates, two requests
    assert value(text, "llm_d_epp_encoder_cache_hit_ratio_bucket", le="0.0", **enc) == 3
    assert value(text, "llm_d_epp_encoder_cache_hit_ratio_bucket", le="0.4", **enc) == 4  # A: 1 of 3 items
    producer.extract_endpoint_event(EndpointEvent(EVENT_DELETE, A.metadata))
    assert 'pod="default/a"' not in generate_latest(registry).decode()  # series of a departed endpoint go


def value(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None
