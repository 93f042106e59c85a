"""In-tree plugins. `builtin_registry()` is the one explicit table of plugin types."""

from __future__ import annotations

from llm_epp.framework import Registry
from llm_epp.framework.tokenization import TOKENIZED_PROMPT_KEY
from llm_epp.plugins.datalayer import core_metrics_extractor, metrics_data_source
from llm_epp.plugins.parsers import openai_parser, passthrough_parser
from llm_epp.plugins.requestcontrol import (
    approx_prefix_cache_producer,
    inflight_load_producer,
    precise_prefix_cache_producer,
    token_producer,
    tokenizer,
)
from llm_epp.plugins.scheduling import (
    active_request_scorer,
    by_label,
    by_label_selector,
    concurrency_detector,
    header_based_testing_filter,
    kv_cache_utilization_scorer,
    label_selector_filter,
    load_aware_scorer,
    lora_affinity_scorer,
    max_score_picker,
    no_hit_lru_scorer,
    precise_prefix_cache_scorer,
    prefix_cache_affinity_filter,
    prefix_cache_scorer,
    prefix_hash_scorer,
    queue_scorer,
    random_picker,
    running_requests_size_scorer,
    session_affinity_scorer,
    single_profile_handler,
    token_load_scorer,
    utilization_detector,
    weighted_random_picker,
)

_MODULES = (
    single_profile_handler,
    max_score_picker,
    random_picker,
    queue_scorer,
    kv_cache_utilization_scorer,
    header_based_testing_filter,
    active_request_scorer,
    by_label,
    by_label_selector,
    concurrency_detector,
    label_selector_filter,
    load_aware_scorer,
    lora_affinity_scorer,
    running_requests_size_scorer,
    session_affinity_scorer,
    token_load_scorer,
    utilization_detector,
    weighted_random_picker,
    approx_prefix_cache_producer,
    inflight_load_producer,
    prefix_cache_scorer,
    no_hit_lru_scorer,
    prefix_cache_affinity_filter,
    prefix_hash_scorer,
    metrics_data_source,
    core_metrics_extractor,
    openai_parser,
    passthrough_parser,
    precise_prefix_cache_producer,
    precise_prefix_cache_scorer,
    token_producer,
    tokenizer,
)


def builtin_registry() -> Registry:
    registry = Registry()
    for module in _MODULES:
        registry.register(module.TYPE, module.Params, module.factory)
    # as in llm-d: a plugin consuming these keys with no producer configured gets one of these types
    registry.set_default_producer(
        precise_prefix_cache_producer.PRECISE_MATCH_KEY.name, precise_prefix_cache_producer.TYPE
    )
    registry.set_default_producer(TOKENIZED_PROMPT_KEY.name, token_producer.TYPE)
    return registry
