"""In-tree plugins. `builtin_registry()` is the one explicit table of plugin types."""

from __future__ import annotations

from llm_epp.framework import Registry
from llm_epp.framework.tokenization import TOKENIZED_PROMPT_KEY
from llm_epp.plugins.datalayer import (
    core_metrics_extractor,
    dcgm_data_source,
    dcgm_extractor,
    endpoint_notification_source,
    file_discovery,
    k8s_notification_source,
    metrics_data_source,
    models_data_extractor,
    models_data_source,
    topology_extractor,
)
from llm_epp.plugins.disagg import (
    always_disagg_multimodal_decider,
    always_disagg_pd_decider,
    context_length_aware,
    data_parallel_profile_handler,
    decode_filter,
    disagg_headers_handler,
    disagg_profile_handler,
    disaggregatedset_rollout_screener,
    encode_filter,
    pd_profile_handler,
    prefill_filter,
    prefill_header_handler,
    prefix_based_pd_decider,
)
from llm_epp.plugins.flowcontrol import (
    edf_ordering_policy,
    fcfs_ordering_policy,
    global_strict_fairness_policy,
    priority_holdback_policy,
    priority_then_time_eviction_order_policy,
    program_aware_fairness,
    round_robin_fairness_policy,
    sheddable_eviction_filter,
    slo_deadline_ordering_policy,
    soft_reflective_ceiling_policy,
    static_usage_limit_policy,
)
from llm_epp.plugins.parsers import (
    anthropic_parser,
    openai_parser,
    passthrough_parser,
    sglanghttp_parser,
    vertexai_parser,
    vllmgrpc_parser,
    vllmhttp_parser,
)
from llm_epp.plugins.requestcontrol import (
    agent_identity,
    approx_prefix_cache_producer,
    burst_prefix_cache_producer,
    destination_endpoint_served_verifier,
    inflight_load_producer,
    latency_slo_admitter,
    mm_embeddings_cache_producer,
    p2p_source_producer,
    precise_prefix_cache_producer,
    predicted_latency_producer,
    probabilistic_admitter,
    request_attribute_reporter,
    session_id_producer,
    token_producer,
    tokenizer,
)
from llm_epp.plugins.scheduling import (
    active_request_scorer,
    by_label,
    by_label_selector,
    concurrency_detector,
    endpoint_attribute_filter,
    endpoint_attribute_scorer,
    header_based_testing_filter,
    header_label_affinity_scorer,
    header_profile_handler,
    kv_cache_headroom_detector,
    kv_cache_utilization_scorer,
    label_selector_filter,
    latency_scorer,
    load_aware_scorer,
    lora_affinity_scorer,
    max_score_picker,
    mm_embeddings_cache_scorer,
    no_hit_lru_scorer,
    precise_prefix_cache_scorer,
    predicted_latency_scorer,
    prefix_cache_affinity_filter,
    prefix_cache_scorer,
    prefix_hash_scorer,
    queue_scorer,
    random_picker,
    running_requests_size_scorer,
    session_affinity_filter,
    session_affinity_scorer,
    single_profile_handler,
    slo_headroom_tier_filter,
    token_load_scorer,
    topology_affinity_filter,
    topology_affinity_scorer,
    utilization_detector,
    utilization_filter,
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
    kv_cache_headroom_detector,
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
    vllmhttp_parser,
    sglanghttp_parser,
    anthropic_parser,
    vertexai_parser,
    vllmgrpc_parser,
    session_affinity_filter,
    session_id_producer,
    agent_identity,
    header_label_affinity_scorer,
    header_profile_handler,
    destination_endpoint_served_verifier,
    request_attribute_reporter,
    p2p_source_producer,
    decode_filter,
    prefill_filter,
    encode_filter,
    disagg_profile_handler,
    pd_profile_handler,
    data_parallel_profile_handler,
    prefix_based_pd_decider,
    always_disagg_pd_decider,
    always_disagg_multimodal_decider,
    context_length_aware,
    disagg_headers_handler,
    prefill_header_handler,
    disaggregatedset_rollout_screener,
    global_strict_fairness_policy,
    round_robin_fairness_policy,
    fcfs_ordering_policy,
    edf_ordering_policy,
    slo_deadline_ordering_policy,
    static_usage_limit_policy,
    priority_holdback_policy,
    soft_reflective_ceiling_policy,
    program_aware_fairness,
    priority_then_time_eviction_order_policy,
    sheddable_eviction_filter,
    probabilistic_admitter,
    utilization_filter,
    precise_prefix_cache_producer,
    precise_prefix_cache_scorer,
    token_producer,
    tokenizer,
    predicted_latency_producer,
    latency_scorer,
    slo_headroom_tier_filter,
    latency_slo_admitter,
    dcgm_data_source,
    dcgm_extractor,
    models_data_source,
    models_data_extractor,
    endpoint_attribute_filter,
    endpoint_attribute_scorer,
    file_discovery,
    endpoint_notification_source,
    k8s_notification_source,
    topology_extractor,
    topology_affinity_filter,
    topology_affinity_scorer,
    predicted_latency_scorer,
    mm_embeddings_cache_producer,
    mm_embeddings_cache_scorer,
    burst_prefix_cache_producer,
)

_MULTI = "multi-cluster routing"

UNSUPPORTED: dict[str, str] = {
    "disaggregatedset-rollout-pod-extractor": "a Pod notification extractor that llm-d-router's rollout screener "
    "registers itself; llm-epp's disaggregatedset-rollout-screener counts the pool's endpoints and needs none",
    **dict.fromkeys(
        (
            "multicluster-approx-prefix-cache-producer",
            "multicluster-file-discovery",
            "multicluster-kv-cache-utilization-scorer",
            "multicluster-metrics-data-source",
            "multicluster-metrics-extractor",
            "multicluster-prefix-cache-scorer",
            "multicluster-queue-scorer",
            "multicluster-session-affinity-filter",
        ),
        _MULTI,
    ),
}
"""Plugin types of the reference EPPs (GIE v1.5.0, llm-d-router) that llm-epp does not offer yet, with
the feature each belongs to. A configuration naming one is refused with "not supported yet" and that
feature, rather than "unknown plugin type". A type registered above (or by an installed package) wins."""


def builtin_registry() -> Registry:
    registry = Registry()
    for module in _MODULES:
        registry.register(module.TYPE, module.Params, module.factory)
    for plugin_type, reason in UNSUPPORTED.items():
        registry.mark_unsupported(plugin_type, reason)
    # as in llm-d: a plugin consuming these keys with no producer configured gets one of these types
    registry.set_default_producer(
        precise_prefix_cache_producer.PRECISE_MATCH_KEY.name, precise_prefix_cache_producer.TYPE
    )
    registry.set_default_producer(TOKENIZED_PROMPT_KEY.name, token_producer.TYPE)
    mm = mm_embeddings_cache_producer
    registry.set_default_producer(mm.DEFAULT_MATCH_KEY.name, mm.TYPE)
    return registry
