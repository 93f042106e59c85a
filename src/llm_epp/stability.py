"""`--allow-experimental-plugins`: plugin types the reference marks experimental (Alpha stability in
llm-d-router v0.10's registry) load only with this flag, as there: a configuration naming one without it is
refused at start, naming the plugin and the flag."""

from __future__ import annotations

from collections.abc import Mapping

EXPERIMENTAL_PLUGIN_TYPES = frozenset(
    {
        "agent-identity",
        "burst-prefix-cache-producer",
        "dcgm-data-source",
        "dcgm-extractor",
        "disaggregatedset-rollout-screener",
        "endpoint-attribute-filter",
        "endpoint-attribute-scorer",
        "header-label-affinity-scorer",
        "header-profile-handler",
        "multicluster-approx-prefix-cache-producer",
        "multicluster-file-discovery",
        "multicluster-kv-cache-utilization-scorer",
        "multicluster-metrics-data-source",
        "multicluster-metrics-extractor",
        "multicluster-prefix-cache-scorer",
        "multicluster-queue-scorer",
        "multicluster-session-affinity-filter",
        "p2p-source-producer",
        "priority-holdback-policy",
        "priority-then-time-eviction-order-policy",
        "session-affinity-filter",
        "sheddable-eviction-filter",
        "soft-reflective-ceiling-policy",
        "topology-affinity-filter",
        "topology-affinity-scorer",
        "topology-extractor",
        "utilization-filter",
    }
)


def experimental_plugin_problem(plugin_types: Mapping[str, str], allow: bool) -> str:
    """The refusal for the first experimental plugin (by name) in `plugin_types` (name -> type), "" if none
    or when allowed."""
    if allow:
        return ""
    for name in sorted(plugin_types):
        if plugin_types[name] in EXPERIMENTAL_PLUGIN_TYPES:
            return (
                f"plugin {name!r} (type {plugin_types[name]!r}) is experimental: start with "
                "--allow-experimental-plugins to use it"
            )
    return ""
