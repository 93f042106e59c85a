"""endpoint-notification-source

Scheduling intent:
    Hand endpoint lifecycle events (an endpoint joined, changed or left the pool) to the extractors listed
    under it, so plugins that keep per-endpoint state follow the pool at once: e.g.
    `precise-prefix-cache-producer` starts a pod's KV-events subscriber when the pod joins and stops it when
    it leaves, instead of at the next request.

Inputs consumed:
    The pool's membership, from whichever discovery runs (InferencePool, `--endpoints`, an endpoints file or
    `file-discovery`): each endpoint added or whose metadata changed gives an `add-or-update` event, each one
    removed a `delete` event. When the data layer starts, every endpoint already known gives an
    `add-or-update` event.

Configuration:
    No parameters. List it under `dataLayer.sources` with extractors that accept endpoint events
    (`precise-prefix-cache-producer`); any other extractor is refused.
"""

from __future__ import annotations

from llm_epp.framework import Handle, PluginParams, TypedName
from llm_epp.framework.datalayer import EndpointEvent

TYPE = "endpoint-notification-source"


class Params(PluginParams):
    pass


class EndpointNotificationSource:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def notify_endpoint(self, event: EndpointEvent) -> EndpointEvent | None:
        return event


def factory(name: str, params: Params, handle: Handle) -> EndpointNotificationSource:
    return EndpointNotificationSource(name)
