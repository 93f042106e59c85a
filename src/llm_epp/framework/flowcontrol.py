"""Saturation detection, used by admission (shedding sheddable requests) and by flow control (dispatch)."""

from __future__ import annotations

import enum
from collections.abc import Collection, Hashable, Sequence
from typing import Protocol, runtime_checkable

from llm_epp.framework.plugin import TypedName
from llm_epp.framework.types import Endpoint, InferenceRequest


@runtime_checkable
class SaturationDetector(Protocol):
    """How saturated the given endpoints are: 0 = idle, >= 1.0 = saturated (sheddable requests are refused).
    Stale or missing metrics count as saturated. Synchronous and cheap: called once per request."""

    @property
    def typed_name(self) -> TypedName: ...

    def saturation(self, endpoints: Sequence[Endpoint]) -> float: ...


class Placement(enum.IntEnum):
    """Where a queued request would go if released now (see `DispatchAffinity`)."""

    HOME_FITS = 0
    """Requests in flight on an endpoint hold its prefix, and that endpoint has room for it."""
    NO_HOME = 1
    """No endpoint holds its prefix: it costs its whole prompt wherever it goes."""
    HOME_FULL = 2
    """Endpoints hold its prefix, but none of them has room for it: released now, it would copy the prefix."""


@runtime_checkable
class DispatchAffinity(Protocol):
    """Optional for a saturation detector: lets flow control release, within the flow its fairness policy
    picked, a queued request that fits where its prefix is held instead of strictly the first in order.

    `dispatch_window` is how many of the flow's first requests (in the ordering policy's order) are looked at;
    0 turns the step off (flow control releases strictly in order, as upstream). A request that has been in
    that window for `dispatch_max_wait` seconds is released before any other (age beats affinity).
    `affinity_key` runs once per queued request; `placement` on every dispatch cycle, synchronous and cheap.
    `placement` answers where the request would go and what it would add there (KV tokens: its prompt not
    shared at its home plus its expected output; only compared between requests placed `HOME_FITS`, the
    cheapest of which goes first). A `HOME_FITS` request may be released while the pool is saturated for a
    typical request (with a full band ceiling, see `flowcontrol/dispatch.py`): `placement` judges it on its
    real size at its home."""

    @property
    def dispatch_window(self) -> int: ...

    @property
    def dispatch_max_wait(self) -> float: ...

    def affinity_key(self, request: InferenceRequest) -> object: ...

    def placement(self, key: object, endpoints: Sequence[Endpoint]) -> tuple[Placement, float]: ...


@runtime_checkable
class DispatchGroups(Protocol):
    """Optional for a `DispatchAffinity` detector: lets flow control release a queued request from anywhere in
    its flow's queue (not only the first `dispatch_window`) when requests of its prefix group are in flight.

    `group_key` names the request's prefix group (requests that share the group's leading prefix; None: no
    group), once per queued request; `hot_groups` the groups of the requests in flight now. On every dispatch
    cycle the oldest queued request of each hot group in the picked flow joins the window as a candidate for
    release at its home (never by age)."""

    def group_key(self, key: object) -> Hashable | None: ...

    def hot_groups(self) -> Collection[Hashable]: ...
