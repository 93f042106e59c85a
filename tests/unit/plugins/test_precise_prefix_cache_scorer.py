from __future__ import annotations

import pytest

from llm_epp.config import load_config_text
from llm_epp.framework import CycleState
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.requestcontrol.precise_prefix_cache_producer import (
    PRECISE_MATCH_KEY,
    PreciseMatch,
    PrecisePrefixCacheProducer,
)
from llm_epp.plugins.requestcontrol.token_producer import TokenProducer
from llm_epp.plugins.scheduling.precise_prefix_cache_scorer import PrecisePrefixCacheScorer
from tests.unit.builders import FakeRecorder, endpoints, request

A, B, C = endpoints("a", "b", "c")


def test_score_is_the_weighted_match_over_the_prompt_blocks_capped_at_one() -> None:
    cycle = CycleState()
    cycle.write(PRECISE_MATCH_KEY, PreciseMatch((1, 2, 3, 4), {A.key: 3.0, B.key: 1.6, C.key: 9.0}, 16))
    scores = PrecisePrefixCacheScorer().score(cycle, request(), [A, B, C])
    assert scores == {A.key: 0.75, B.key: pytest.approx(0.4), C.key: 1.0}


def test_no_match_info_scores_zero() -> None:
    assert PrecisePrefixCacheScorer().score(CycleState(), request(), [A, B]) == {A.key: 0.0, B.key: 0.0}
    cycle = CycleState()
    cycle.write(PRECISE_MATCH_KEY, PreciseMatch((), {}, 16))
    assert PrecisePrefixCacheScorer().score(cycle, request(), [A]) == {A.key: 0.0}


def test_configured_alone_it_gets_a_producer_with_its_parameters_and_a_token_producer() -> None:
    text = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-scorer
  parameters:
    tokenProcessorConfig:
      blockSize: 64
      hashSeed: "42"
    kvEventsConfig:
      zmqEndpoint: tcp://127.0.0.1:5557
- type: max-score-picker
- type: single-profile-handler
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
    weight: 2
  - pluginRef: max-score-picker
"""
    loaded = load_config_text(text, builtin_registry(), FakeRecorder())
    producers = [p for p in loaded.plugins.values() if isinstance(p, PrecisePrefixCacheProducer)]
    assert len(producers) == 1
    assert producers[0].index.block_size == 64
    tokenizers = [p for p in loaded.plugins.values() if isinstance(p, TokenProducer)]
    assert len(tokenizers) == 1 and tokenizers[0].backend == "estimate"
    order = [p.typed_name.type for p in loaded.prepare_data]
    assert order.index("token-producer") < order.index("precise-prefix-cache-producer")
