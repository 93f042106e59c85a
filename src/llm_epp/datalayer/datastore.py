"""The endpoint store: discovery sources apply changes, scrapers swap metrics, the request path takes an
immutable snapshot. All mutation happens on the event loop thread, so no locks are needed.

The snapshot is kept across metric updates: an update marks its endpoint, and the next `snapshot()` copies
the previous tuple and replaces only the marked endpoints (copy-on-write), so a pool scraped every 50 ms
does not rebuild every Endpoint for every request. A tuple once returned never changes; a scheduling cycle
holding it sees one consistent pool. Membership changes rebuild the snapshot in full.

In-flight load (`InFlightLoad`) belongs to the endpoint's key and outlives the endpoint while requests
still hold it: a pod removed and added back (a readiness flap) continues counting its running requests
instead of restarting at 0.

Endpoint attributes (values data-layer extractors publish for scheduling plugins, by name) are kept per
endpoint like metrics: an update merges the new values into the endpoint's attributes (other producers'
values stay) and marks the endpoint for the copy-on-write snapshot; they leave with the endpoint."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

from llm_epp.framework.types import EMPTY_METRICS, Endpoint, EndpointKey, EndpointMetadata, InFlightLoad, Metrics

_NO_ATTRIBUTES: Mapping[str, Any] = MappingProxyType({})


class Datastore:
    def __init__(self, pool_name: str = "") -> None:
        self.pool_name = pool_name
        self._metadata: dict[EndpointKey, EndpointMetadata] = {}
        self._metrics: dict[EndpointKey, Metrics] = {}
        self._attributes: dict[EndpointKey, Mapping[str, Any]] = {}
        self._load: dict[EndpointKey, InFlightLoad] = {}
        self._snapshot: tuple[Endpoint, ...] | None = ()
        self._position: dict[EndpointKey, int] = {}  # index of each endpoint in the current snapshot
        self._updated: set[EndpointKey] = set()  # endpoints whose metrics changed since the snapshot was made
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
                self._attributes.pop(key, None)
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
            self._attributes.pop(key, None)
            self._changed()

    def clear(self) -> None:
        self.replace_all(())

    # --- metrics --------------------------------------------------------------------------------------
    def update_metrics(self, key: EndpointKey, metrics: Metrics) -> None:
        """Swap in an endpoint's latest metrics (what the data-layer runtime calls after every scrape)."""
        if key in self._metadata:
            self._metrics[key] = metrics
            if self._snapshot is not None:
                self._updated.add(key)

    # --- attributes -----------------------------------------------------------------------------------
    def update_attributes(self, key: EndpointKey, values: Mapping[str, object]) -> None:
        """Merge `values` into an endpoint's attributes (what attribute extractors publish); a value of
        None removes that attribute. Unknown endpoints are ignored."""
        if key not in self._metadata or not values:
            return
        current = self._attributes.get(key, _NO_ATTRIBUTES)
        merged = dict(current)
        for name, value in values.items():
            if value is None:
                merged.pop(name, None)
            else:
                merged[name] = value
        if merged == current:
            return
        self._attributes[key] = MappingProxyType(merged)
        if self._snapshot is not None:
            self._updated.add(key)

    def attributes(self, key: EndpointKey) -> Mapping[str, Any]:
        return self._attributes.get(key, _NO_ATTRIBUTES)

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
        """All reachable endpoints with their latest metrics. The same tuple until something changes; after
        metric updates a new tuple that shares every unchanged Endpoint with the previous one."""
        snap = self._snapshot
        if snap is None:
            snap = tuple(
                Endpoint(
                    m,
                    self._metrics.get(k, EMPTY_METRICS),
                    self._load_of(k),
                    self._attributes.get(k, _NO_ATTRIBUTES),
                )
                for k, m in self._included()
            )
            self._snapshot = snap
            self._position = {e.key: i for i, e in enumerate(snap)}
            self._by_hostport = {e.hostport: e for e in snap}
            self._updated.clear()
        elif self._updated:
            endpoints = list(snap)
            position, by_hostport, metrics, attributes = (
                self._position,
                self._by_hostport,
                self._metrics,
                self._attributes,
            )
            for key in self._updated:
                i = position.get(key)
                if i is None:  # left out of the snapshot (unreachable): its metrics wait for its return
                    continue
                old = endpoints[i]
                endpoint = Endpoint(
                    old.metadata, metrics.get(key, EMPTY_METRICS), old.load, attributes.get(key, _NO_ATTRIBUTES)
                )
                endpoints[i] = endpoint
                by_hostport[endpoint.hostport] = endpoint
            self._updated.clear()
            snap = self._snapshot = tuple(endpoints)
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
        # Loads of removed endpoints are kept while requests hold them (they come back with the endpoint);
        # the idle ones are dropped here, so the table is bounded by the pool plus the draining endpoints.
        load = self._load
        for key in [k for k, v in load.items() if k not in self._metadata and v.requests <= 0 and v.tokens <= 0]:
            del load[key]
        self._snapshot = None
        self._unreachable &= self._metadata.keys()  # an endpoint that leaves and returns starts reachable
        self._updated.clear()
        for cb in self._listeners:
            cb()
