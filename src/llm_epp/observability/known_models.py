"""The model names `PrometheusRecorder` may show as label values: those the rewrite rules name (matched
and target models) and the adapters pods report running or waiting. Everything else a client writes into
`model` is recorded as `other` (or learnt once served, see `PrometheusRecorder`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from llm_epp.datalayer.objectives import ObjectivesStore
from llm_epp.framework.types import Endpoint


class ConfiguredAndServedModels:
    """A `KnownModels` over the live objectives store and endpoint snapshot; nothing is copied, so rule
    and pod changes count at once. Membership costs a few dictionary lookups plus one pass over the
    endpoints, and runs only for names not already admitted."""

    def __init__(self, objectives: ObjectivesStore, endpoints: Callable[[], Iterable[Endpoint]]) -> None:
        self._objectives = objectives
        self._endpoints = endpoints

    def __contains__(self, model: object, /) -> bool:
        if not isinstance(model, str) or not model:
            return False
        config = self._objectives.config
        if model in config.exact_rules:
            return True
        rules = [*config.exact_rules.values(), *([config.generic_rule] if config.generic_rule else [])]
        if any(model == target for rule in rules for target, _ in rule.targets):
            return True
        return any(model in e.metrics.active_models or model in e.metrics.waiting_models for e in self._endpoints())
