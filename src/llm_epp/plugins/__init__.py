"""In-tree plugins. `builtin_registry()` is the one explicit table of plugin types."""

from __future__ import annotations

from llm_epp.framework import Registry
from llm_epp.plugins.scheduling import (
    header_based_testing_filter,
    kv_cache_utilization_scorer,
    max_score_picker,
    queue_scorer,
    random_picker,
    single_profile_handler,
)

_MODULES = (
    single_profile_handler,
    max_score_picker,
    random_picker,
    queue_scorer,
    kv_cache_utilization_scorer,
    header_based_testing_filter,
)


def builtin_registry() -> Registry:
    registry = Registry()
    for module in _MODULES:
        registry.register(module.TYPE, module.Params, module.factory)
    return registry
