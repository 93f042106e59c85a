"""Extension points of flow control (the `flowControl` feature gate): how a priority band chooses the flow
to serve next (FairnessPolicy), the order of requests inside one flow (OrderingPolicy) and the saturation
ceiling of each band (UsageLimitPolicy); with `enableEviction`, which dispatched requests may be evicted
(EvictionFilterPolicy) and in which order (EvictionOrderingPolicy).

Policies are ordinary plugins: registered by type, built from `plugins:` entries and referenced by name
from the `flowControl` section. One instance may serve many bands, so a fairness policy keeps per-band
state in the object its `new_state()` returns (handed back as `band.policy_state`). Every method is called
on the event loop from the dispatch cycle: synchronous and cheap."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from llm_epp.framework.plugin import TypedName
from llm_epp.framework.records import record
from llm_epp.framework.types import InferenceRequest


@dataclass(frozen=True, slots=True, order=True)
class FlowKey:
    """A flow: the requests of one fairness id at one priority."""

    id: str
    priority: int


class QueueItem(Protocol):
    """One queued request as policies see it. Times are event-loop seconds (`loop.time()`)."""

    @property
    def request(self) -> InferenceRequest: ...

    @property
    def enqueued_at(self) -> float: ...

    @property
    def received_at(self) -> float:
        """When the EPP received the request (on the same clock as `enqueued_at`)."""
        ...

    @property
    def ttl(self) -> float | None:
        """The queueing budget in seconds, None when the request may wait until the client leaves."""
        ...


class FlowQueueView(Protocol):
    @property
    def key(self) -> FlowKey: ...

    @property
    def ordering(self) -> OrderingPolicy: ...

    def __len__(self) -> int: ...

    def peek(self) -> QueueItem | None:
        """The request the ordering policy serves next, or None when the queue is empty."""
        ...


class BandView(Protocol):
    @property
    def priority(self) -> int: ...

    @property
    def policy_state(self) -> object:
        """What the band's fairness policy returned from `new_state()` for this band."""
        ...

    def flow_keys(self) -> Sequence[FlowKey]:
        """Every flow of the band that has queued requests, in no particular order."""
        ...

    def queue(self, flow_id: str) -> FlowQueueView | None: ...

    def queues(self) -> Sequence[FlowQueueView]: ...


@runtime_checkable
class OrderingPolicy(Protocol):
    @property
    def typed_name(self) -> TypedName: ...

    def less(self, a: QueueItem, b: QueueItem) -> bool:
        """True when `a` is to be dispatched before `b`."""
        ...


@runtime_checkable
class FairnessPolicy(Protocol):
    @property
    def typed_name(self) -> TypedName: ...

    def new_state(self) -> object:
        """Fresh per-band state (a cursor, counters); None when the policy keeps none."""
        ...

    def pick_flow(self, band: BandView) -> FlowQueueView | None:
        """The non-empty flow queue to serve next, or None when nothing is eligible."""
        ...


@runtime_checkable
class UsageLimitPolicy(Protocol):
    @property
    def typed_name(self) -> TypedName: ...

    def compute_limit(self, saturation: float, priorities: Sequence[int], ceilings: list[float]) -> None:
        """Writes the saturation ceiling of `priorities[i]` (highest priority first) into `ceilings[i]`,
        which arrive filled with 1.0. A band is dispatched from only while saturation < its ceiling, and
        the cycle stops at the first band that is not: ceilings must not increase down the list."""
        ...


@record
class EvictionItem:
    """A request dispatched to a model server that flow control may evict to free capacity for queued
    higher-priority work. `dispatched_at` is event-loop seconds (`loop.time()`)."""

    request_id: str
    priority: int
    dispatched_at: float
    target: str
    """The endpoint serving it, `ip:port`."""
    request: InferenceRequest


@runtime_checkable
class EvictionOrderingPolicy(Protocol):
    @property
    def typed_name(self) -> TypedName: ...

    def evict_before(self, a: EvictionItem, b: EvictionItem) -> bool:
        """True when `a` is to be evicted before `b` (a method name of its own, so that an ordering policy of
        queued requests is never taken for an eviction order, or the other way round)."""
        ...


@runtime_checkable
class EvictionFilterPolicy(Protocol):
    @property
    def typed_name(self) -> TypedName: ...

    def accept(self, item: EvictionItem) -> bool:
        """True when the dispatched request may be evicted at all."""
        ...
