"""Real bands, flows and queued items for policy tests (no controller)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping

from llm_epp.flowcontrol import BandConfig
from llm_epp.flowcontrol.queues import Band, Item
from llm_epp.framework.flowpolicy import FairnessPolicy, FlowKey, OrderingPolicy
from llm_epp.plugins.flowcontrol.fcfs_ordering_policy import FcfsOrderingPolicy
from llm_epp.plugins.flowcontrol.global_strict_fairness_policy import GlobalStrictFairnessPolicy
from tests.unit.builders import request

_LOOP = asyncio.new_event_loop()  # only makes futures; never runs


def item(
    rid: str,
    flow: str = "f",
    enqueued_at: float = 0.0,
    ttl: float | None = None,
    headers: Mapping[str, str] | None = None,
    received_at: float | None = None,
    priority: int = 0,
) -> Item:
    r = dataclasses.replace(request(request_id=rid, headers=headers, priority=priority), fairness_id=flow)
    return Item(
        r,
        FlowKey(flow, priority),
        enqueued_at,
        enqueued_at if received_at is None else received_at,
        ttl,
        _LOOP.create_future(),
    )


def band(fairness: FairnessPolicy | None = None, ordering: OrderingPolicy | None = None, priority: int = 0) -> Band:
    return Band(BandConfig(priority, fairness or GlobalStrictFairnessPolicy(), ordering or FcfsOrderingPolicy()))


def drain(b: Band) -> list[str]:
    """Dispatch order: the fairness policy picks a flow, its queue gives its head, until the band is empty."""
    out = []
    while b.length:
        view = b.config.fairness.pick_flow(b)
        assert view is not None
        q = b.flows[view.key.id]
        it = q.pop()
        assert it is not None
        b.take(it)
        out.append(it.request.request_id)
    return out
