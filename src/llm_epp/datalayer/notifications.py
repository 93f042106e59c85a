"""Event-driven data sources: endpoint lifecycle events from the datastore's membership, and Kubernetes
object events (posted by a watch in `k8s/`), each handed to its notification source and then to the
extractors listed under it; the endpoint attributes they return are merged into the datastore.

Everything runs on the event loop: endpoint events are computed in a datastore listener (right after
discovery changed the pool, so an extractor reading the pool sees the new one), object events are posted
to the loop by the watch thread. An extractor that raises is logged and counted
(`datalayer_extract_errors_total`) and the others still run."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from llm_epp.datalayer.datastore import Datastore
from llm_epp.datalayer.sources import DataLayerErrors
from llm_epp.framework.datalayer import (
    EVENT_ADD_OR_UPDATE,
    EVENT_DELETE,
    AttributeUpdates,
    EndpointEvent,
    EndpointEventExtractor,
    EndpointEventSource,
    ObjectEvent,
    ObjectEventExtractor,
    ObjectEventSource,
)
from llm_epp.framework.plugin import TypedName
from llm_epp.framework.types import EndpointKey, EndpointMetadata

log = logging.getLogger(__name__)


class _Dispatch:
    def __init__(self, datastore: Datastore, errors: DataLayerErrors | None) -> None:
        self._datastore = datastore
        self._errors = errors
        self.events = 0

    def _apply(self, source: TypedName, extractor: TypedName, updates: AttributeUpdates) -> None:
        for key, values in updates.items():
            self._datastore.update_attributes(key, values)

    def _failed(self, source: TypedName, extractor: TypedName) -> None:
        log.exception("event_extractor_failed source=%s extractor=%s", source, extractor)
        if self._errors is not None:
            self._errors.datalayer_extract_error(source.type, extractor.type)


class EndpointEvents(_Dispatch):
    """Turns the datastore's membership changes into endpoint events for the endpoint notification sources."""

    def __init__(
        self,
        datastore: Datastore,
        bindings: Sequence[tuple[EndpointEventSource, Sequence[EndpointEventExtractor]]],
        errors: DataLayerErrors | None = None,
    ) -> None:
        super().__init__(datastore, errors)
        self.bindings = [(src, tuple(exs)) for src, exs in bindings]
        self._known: dict[EndpointKey, EndpointMetadata] = {}
        self._started = False

    def start(self) -> None:
        """Subscribes to the datastore and announces every endpoint already known."""
        if self._started:
            return
        self._started = True
        self._datastore.add_listener(self._sync)
        self._sync()

    def _sync(self) -> None:
        current = {m.key: m for m in self._datastore.metadata()}
        events = [EndpointEvent(EVENT_DELETE, md) for key, md in self._known.items() if key not in current]
        events += [EndpointEvent(EVENT_ADD_OR_UPDATE, md) for key, md in current.items() if self._known.get(key) != md]
        self._known = current
        for event in events:
            self.dispatch(event)

    def dispatch(self, event: EndpointEvent) -> None:
        self.events += 1
        for source, extractors in self.bindings:
            processed = source.notify_endpoint(event)
            if processed is None:
                continue
            for ex in extractors:
                try:
                    updates = ex.extract_endpoint_event(processed)
                except Exception:
                    self._failed(source.typed_name, ex.typed_name)
                    continue
                self._apply(source.typed_name, ex.typed_name, updates)


class ObjectEvents(_Dispatch):
    """One Kubernetes notification source and its extractors; `dispatch` runs on the event loop."""

    def __init__(
        self,
        datastore: Datastore,
        source: ObjectEventSource,
        extractors: Sequence[ObjectEventExtractor],
        errors: DataLayerErrors | None = None,
    ) -> None:
        super().__init__(datastore, errors)
        self.source = source
        self.extractors = tuple(extractors)

    def dispatch(self, event: ObjectEvent) -> None:
        self.events += 1
        processed = self.source.notify_object(event)
        if processed is None:
            return
        for ex in self.extractors:
            try:
                updates = ex.extract_object_event(processed)
            except Exception:
                self._failed(self.source.typed_name, ex.typed_name)
                continue
            self._apply(self.source.typed_name, ex.typed_name, updates)
