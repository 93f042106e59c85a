"""The endpoint store: discovery sources apply changes, scrapers swap metrics, the request path takes an
immutable snapshot. All mutation happens on the event loop thread, so no locks are needed."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

from llm_epp.framework.types import EMPTY_METRICS, Endpoint, EndpointKey, EndpointMetadata, InFlightLoad, Metrics


class Datastore:
    def __init__(self, pool_name: str = "") -> None:
        self.pool_name = pool_name
        self._metadata: dict[EndpointKey, EndpointMetadata] = {}
        self._metrics: dict[EndpointKey, Metrics] = {}
        self._load: dict[EndpointKey, InFlightLoad] = {}
        self._snapshot: tuple[Endpoint, ...] | None = ()
        self._by_hostport: dict[str, Endpoint] = {}
        self.synced = False
        self._listeners: list[Callable[[], None]] = []
        self._unreachable: set[EndpointKey] = set()

    # --- discovery ----------------------------------------------------------------------------------
    def replace_all(self, endpoints: Iterable[EndpointMetadata]) -> None:
        """Make the store hold exactly `endpoints`; metrics of endpoints that stay are kept."""
        new = {m.key: m for m in endpoints}
        for key in list(self._metadata):
            if key not in new:
                self._metrics.pop(key, None)
                self._load.pop(key, None)
        self._metadata = new
        self.synced = True
        self._changed()

    def upsert(self, metadata: EndpointMetadata) -> None:
        if self._metadata.get(metadata.key) != metadata:
            self._metadata[metadata.key] = metadata
            self._changed()

    def delete(self, key: EndpointKey) -> None:
        if self._metadata.pop(key, None) is not None:
            self._metrics.pop(key, None)
            self._load.pop(key, None)
            self._changed()

    def clear(self) -> None:
        self.replace_all(())

    # --- metrics --------------------------------------------------------------------------------------
    def update_metrics(self, key: EndpointKey, metrics: Metrics) -> None:
        if key in self._metadata:
            self._metrics[key] = metrics
            self._snapshot = None

    # --- reachability ---------------------------------------------------------------------------------
    def set_reachable(self, key: EndpointKey, ok: bool) -> None:
        """Marks an endpoint the data layer cannot connect to (refused, connect timeout): it leaves the
        snapshot, so no request is sent to it, until it is marked reachable again. While every endpoint is
        unreachable the snapshot keeps them all (better a chance than certain failure)."""
        changed = (key in self._unreachable) != (not ok)
        if ok:
            self._unreachable.discard(key)
        elif key in self._metadata:
            self._unreachable.add(key)
        else:
            changed = False
        if changed:
            self._snapshot = None

    def is_reachable(self, key: EndpointKey) -> bool:
        return key not in self._unreachable

    def _included(self) -> Iterable[tuple[EndpointKey, EndpointMetadata]]:
        items = self._metadata.items()
        if not self._unreachable or len(self._unreachable) >= len(self._metadata):
            return items
        return [(k, m) for k, m in items if k not in self._unreachable]

    # --- reads ----------------------------------------------------------------------------------------
    def snapshot(self) -> tuple[Endpoint, ...]:
        """All reachable endpoints with their latest metrics; cached until something changes."""
        snap = self._snapshot
        if snap is None:
            snap = tuple(
                Endpoint(m, self._metrics.get(k, EMPTY_METRICS), self._load_of(k)) for k, m in self._included()
            )
            self._snapshot = snap
            self._by_hostport = {e.hostport: e for e in snap}
        return snap

    def _load_of(self, key: EndpointKey) -> InFlightLoad:
        load = self._load.get(key)
        if load is None:
            load = self._load[key] = InFlightLoad()
        return load

    def by_hostport(self, hostport: str) -> Endpoint | None:
        self.snapshot()
        return self._by_hostport.get(hostport)

    def metadata(self) -> list[EndpointMetadata]:
        return list(self._metadata.values())

    def random_endpoint(self, rng: random.Random | None = None) -> Endpoint | None:
        snap = self.snapshot()
        if not snap:
            return None
        return (rng or random).choice(snap)

    def __len__(self) -> int:
        return len(self._metadata)

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Called after every membership change (not on metric updates)."""
        self._listeners.append(callback)

    def _changed(self) -> None:
        self._snapshot = None
        self._unreachable &= self._metadata.keys()  # an endpoint that leaves and returns starts reachable
        for cb in self._listeners:
            cb()
