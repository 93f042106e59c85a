"""slo-deadline-ordering-policy

Scheduling intent:
    Serve first the request whose time-to-first-token objective expires first: deadline = when the EPP
    received it + its TTFT SLO. Requests without an SLO come last; ties go to the earlier arrival.

Inputs consumed:
    The `x-llm-d-slo-ttft-ms` request header (or its older name `x-slo-ttft-ms`): milliseconds, a
    non-negative integer; anything else counts as no SLO. The request's receive time.

Configuration:
    No parameters.
"""

from __future__ import annotations

import math

from llm_epp.framework import Handle, PluginParams, TypedName
from llm_epp.framework.flowpolicy import QueueItem

TYPE = "slo-deadline-ordering-policy"
SLO_TTFT_HEADERS = ("x-llm-d-slo-ttft-ms", "x-slo-ttft-ms")
_MAX_MS = 2**63 // 1_000_000  # the largest millisecond count a Go duration holds


class Params(PluginParams):
    pass


def slo_deadline(item: QueueItem) -> float:
    headers = item.request.headers
    raw = None
    for name in SLO_TTFT_HEADERS:
        raw = headers.get(name)
        if raw is not None:
            break
    if raw is None:
        return math.inf
    text = raw.strip()
    if not text.lstrip("+-").isdigit():
        return math.inf
    ms = int(text)
    if ms < 0 or ms > _MAX_MS:
        return math.inf
    return item.received_at + ms / 1000.0


class SloDeadlineOrderingPolicy:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def less(self, a: QueueItem, b: QueueItem) -> bool:
        da, db = slo_deadline(a), slo_deadline(b)
        if da != db:
            return da < db
        return a.received_at < b.received_at


def factory(name: str, params: Params, handle: Handle) -> SloDeadlineOrderingPolicy:
    return SloDeadlineOrderingPolicy(name)
