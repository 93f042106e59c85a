"""The model names `PrometheusRecorder` may show as label values: those the rewrite rules name (matched
and target models) and the adapters pods report running or waiting. Everything else a client writes into
`model` is recorded as `other` (or learnt once served, see `PrometheusRecorder`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from llm_epp.datalayer.objectives import ObjectivesConfig, ObjectivesStore
from llm_epp.framework.types import Endpoint


class ConfiguredAndServedModels:
    """A `KnownModels` over the live objectives store and endpoint snapshot: rule and pod changes count at
    once. The names the rules' targets and the endpoints' adapters give are gathered into one set, rebuilt
    on the first lookup after the rules or the endpoint snapshot changed (the store hands out the same
    immutable snapshot tuple until something changes), so a lookup is a set membership test."""

    def __init__(self, objectives: ObjectivesStore, endpoints: Callable[[], Iterable[Endpoint]]) -> None:
        self._objectives = objectives
        self._endpoints = endpoints
        self._seen: tuple[object, object] | None = None  # (rules, snapshot) the names were gathered from
        self._names: frozenset[str] = frozenset()
        self._generation = 0

    def __contains__(self, model: object, /) -> bool:
        if not isinstance(model, str) or not model:
            return False
        config = self._objectives.config
        if model in config.exact_rules:
            return True
        endpoints = self._endpoints()
        if not isinstance(endpoints, tuple):  # a mutable collection may change in place: gather every time
            return model in _gather(config, endpoints)
        self._refresh(config, endpoints)
        return model in self._names

    def generation(self) -> int | None:
        """A number that stays the same as long as every membership answer does: it changes when the rules
        change or an endpoint snapshot brings other names (a new snapshot naming the same models keeps it).
        None when the endpoints come as a mutable collection, which may change unseen."""
        config = self._objectives.config
        endpoints = self._endpoints()
        seen = self._seen
        if seen is None or seen[1] is not endpoints or seen[0] is not config:
            if not isinstance(endpoints, tuple):
                return None
            self._refresh(config, endpoints)
        return self._generation

    def _refresh(self, config: ObjectivesConfig, endpoints: tuple[Endpoint, ...]) -> None:
        seen = self._seen
        if seen is not None and seen[0] is config and seen[1] is endpoints:
            return
        names = _gather(config, endpoints)
        if seen is None or seen[0] is not config or names != self._names:
            self._generation += 1
        self._names = names
        self._seen = (config, endpoints)


def _gather(config: ObjectivesConfig, endpoints: Iterable[Endpoint]) -> frozenset[str]:
    rules = [*config.exact_rules.values(), *([config.generic_rule] if config.generic_rule else [])]
    names = {target for rule in rules for target, _ in rule.targets}
    for e in endpoints:
        names.update(e.metrics.active_models)
        names.update(e.metrics.waiting_models)
    return frozenset(names)
