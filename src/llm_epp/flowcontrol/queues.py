"""Priority bands, the flow queues inside them and the queued items. Pure data structures: the controller
owns them and runs them on the event loop."""

from __future__ import annotations

import asyncio
import copy
import heapq
import itertools
from collections.abc import Collection, Sequence

from llm_epp.flowcontrol.config import BandConfig
from llm_epp.framework.flowpolicy import FlowKey, FlowQueueView, OrderingPolicy
from llm_epp.framework.types import InferenceRequest

QUEUED, DISPATCHED, FINISHED = 0, 1, 2

_seq = itertools.count()


class Item:
    """A queued request and the future its caller waits on."""

    __slots__ = (
        "affinity",
        "enqueued_at",
        "future",
        "group",
        "in_window_since",
        "key",
        "received_at",
        "request",
        "seq",
        "size_bytes",
        "state",
        "timer",
        "ttl",
    )

    def __init__(
        self,
        request: InferenceRequest,
        key: FlowKey,
        enqueued_at: float,
        received_at: float,
        ttl: float | None,
        future: asyncio.Future[None],
    ) -> None:
        self.request = request
        self.key = key
        self.enqueued_at = enqueued_at
        self.received_at = received_at
        self.ttl = ttl
        self.size_bytes = request.size_bytes
        self.future = future
        self.state = QUEUED
        self.timer: asyncio.TimerHandle | None = None
        self.seq = next(_seq)
        self.affinity: object = None
        """The saturation detector's affinity key (affinity-aware dispatch only)."""
        self.group: object = None
        """The detector's prefix group (grouped dispatch only; None: no group)."""
        self.in_window_since: float | None = None
        """When the request first was among the first requests affinity-aware dispatch looks at."""


class _Entry:
    """A heap entry ordered by the flow's ordering policy, then by arrival."""

    __slots__ = ("item", "policy")

    def __init__(self, item: Item, policy: OrderingPolicy) -> None:
        self.item, self.policy = item, policy

    def __lt__(self, other: _Entry) -> bool:
        a, b = self.item, other.item
        if self.policy.less(a, b):
            return True
        if self.policy.less(b, a):
            return False
        return a.seq < b.seq


class FlowQueue:
    """One flow's requests, served in the ordering policy's order. Removed items are dropped lazily."""

    def __init__(self, key: FlowKey, ordering: OrderingPolicy) -> None:
        self._key = key
        self._ordering = ordering
        self._heap: list[_Entry] = []
        self._len = 0
        self.bytes = 0
        self._groups: dict[object, dict[int, Item]] = {}  # prefix group -> its queued items, oldest first

    @property
    def key(self) -> FlowKey:
        return self._key

    @property
    def ordering(self) -> OrderingPolicy:
        return self._ordering

    def __len__(self) -> int:
        return self._len

    def items(self) -> list[Item]:
        """The queued items, in no particular order."""
        return [e.item for e in self._heap if e.item.state == QUEUED]

    def reorder(self) -> None:
        """Restores the order after the items' deadlines changed."""
        heapq.heapify(self._heap)

    def push(self, item: Item) -> None:
        heapq.heappush(self._heap, _Entry(item, self._ordering))
        self._len += 1
        self.bytes += item.size_bytes

    def add(self, item: Item) -> None:
        """Queues a new item (and indexes it by its prefix group)."""
        self.push(item)
        if item.group is not None:
            self._groups.setdefault(item.group, {})[item.seq] = item

    def unindex(self, item: Item) -> None:
        """Forgets an item that left the queue (released, expired or cancelled) from its group's index."""
        group = item.group
        if group is None:
            return
        members = self._groups.get(group)
        if members is not None:
            members.pop(item.seq, None)
            if not members:
                del self._groups[group]

    def group_head(self, group: object, skip: Collection[int] = ()) -> Item | None:
        """The oldest queued item of `group` whose `seq` is not in `skip`, or None."""
        members = self._groups.get(group)
        if members:
            for seq, item in members.items():
                if seq not in skip:
                    return item
        return None

    @property
    def group_count(self) -> int:
        return len(self._groups)

    def groups(self) -> Collection[object]:
        return self._groups.keys()

    def _settle_head(self) -> None:
        heap = self._heap
        while heap and heap[0].item.state != QUEUED:
            heapq.heappop(heap)

    def peek(self) -> Item | None:
        self._settle_head()
        return self._heap[0].item if self._heap else None

    def pop(self) -> Item | None:
        self._settle_head()
        if not self._heap:
            return None
        item = heapq.heappop(self._heap).item
        self._forget(item)
        return item

    def pop_window(self, k: int) -> list[Item]:
        """Takes the first `k` queued items out, in order; `restore` puts back those not released."""
        out: list[Item] = []
        while len(out) < k:
            item = self.pop()
            if item is None:
                break
            out.append(item)
        return out

    def restore(self, items: Sequence[Item]) -> None:
        """Puts back items taken by `pop_window` (they keep their place: the order is the policy's, then arrival)."""
        for item in items:
            self.push(item)

    def remove(self, item: Item) -> None:
        """Takes a still-queued item out (its entry is skipped later)."""
        self._forget(item)
        if self._len == 0:
            self._heap.clear()

    def _forget(self, item: Item) -> None:
        self._len -= 1
        self.bytes -= item.size_bytes


class Band:
    """A priority band: its flows, its limits and its fairness policy's state."""

    def __init__(self, config: BandConfig) -> None:
        self.config = config
        self._priority = config.priority
        self._state = config.fairness.new_state()
        self.flows: dict[str, FlowQueue] = {}
        self.length = 0
        self.bytes = 0

    @property
    def priority(self) -> int:
        return self._priority

    @property
    def policy_state(self) -> object:
        return self._state

    def save_state(self) -> object:
        """A copy of the fairness policy's state, for `restore_state` after a look that released nothing."""
        return copy.copy(self._state)

    def restore_state(self, state: object) -> None:
        self._state = state

    def flow_keys(self) -> Sequence[FlowKey]:
        return [q.key for q in self.flows.values() if len(q)]

    def queue(self, flow_id: str) -> FlowQueueView | None:
        return self.flows.get(flow_id)

    def queues(self) -> Sequence[FlowQueueView]:
        return [q for q in self.flows.values() if len(q)]

    def flow(self, key: FlowKey) -> FlowQueue:
        q = self.flows.get(key.id)
        if q is None:
            q = self.flows[key.id] = FlowQueue(key, self.config.ordering)
        return q

    def add(self, item: Item) -> None:
        self.flow(item.key).add(item)
        self.length += 1
        self.bytes += item.size_bytes

    def take(self, item: Item) -> None:
        """Accounts for an item leaving its flow (popped or removed); drops the flow once empty."""
        self.length -= 1
        self.bytes -= item.size_bytes
        q = self.flows.get(item.key.id)
        if q is not None:
            q.unindex(item)
            if not len(q):
                del self.flows[item.key.id]
