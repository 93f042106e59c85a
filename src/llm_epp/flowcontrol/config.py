"""The resolved flow-control settings (the `flowControl` section with its policies built)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from llm_epp.framework.flowpolicy import (
    EvictionFilterPolicy,
    EvictionOrderingPolicy,
    FairnessPolicy,
    OrderingPolicy,
    UsageLimitPolicy,
)

BAND_MAX_BYTES = 1_000_000_000
"""A band's byte limit when none is configured (both upstreams)."""
ROUTER_BAND_MAX_REQUESTS = 5000
"""llm-d-router's per-band request limit when none is configured (GIE v1.5.0 has none)."""
ROUTER_REQUEST_TTL = 60.0
"""llm-d-router's queueing budget when `defaultRequestTTL` is unset (GIE v1.5.0 waits for the client)."""


@dataclass(frozen=True, slots=True)
class BandConfig:
    """One priority band. Limits of 0 mean unlimited."""

    priority: int
    fairness: FairnessPolicy
    ordering: OrderingPolicy
    max_bytes: int = BAND_MAX_BYTES
    max_requests: int = 0

    def at(self, priority: int) -> BandConfig:
        """This band as the template of a band provisioned for `priority`."""
        return replace(self, priority=priority)


@dataclass(frozen=True, slots=True)
class EvictionPolicies:
    """`enableEviction`: which dispatched requests may be evicted, and in which order."""

    ordering: EvictionOrderingPolicy
    filter: EvictionFilterPolicy


@dataclass(frozen=True, slots=True)
class FlowControlConfig:
    """Global limits (0 = unlimited), TTLs in seconds (None = wait until the client goes away), the
    configured bands by priority and the templates for priorities not configured."""

    default_band: BandConfig
    usage_limit: UsageLimitPolicy
    bands: Mapping[int, BandConfig] = field(default_factory=dict)
    default_negative_band: BandConfig | None = None
    max_bytes: int = 0
    max_requests: int = 0
    request_ttl: float | None = None
    no_endpoint_request_ttl: float | None = None
    eviction: EvictionPolicies | None = None
    """Set when `enableEviction` is on."""

    def band_for(self, priority: int) -> BandConfig:
        configured = self.bands.get(priority)
        if configured is not None:
            return configured
        if priority < 0 and self.default_negative_band is not None:
            return self.default_negative_band.at(priority)
        return self.default_band.at(priority)

    def longest_wait(self) -> float | None:
        """The longest a request may stay queued, None when unbounded."""
        ttls = (self.request_ttl, self.no_endpoint_request_ttl)
        if any(t is None for t in ttls):
            return None
        return max(t for t in ttls if t is not None)
