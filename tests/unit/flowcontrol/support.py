"""A flow controller over a saturation the test sets, with upstream's default policies."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

from llm_epp.flowcontrol import BandConfig, FlowControlConfig, FlowController, Ticket
from llm_epp.framework import TypedName
from llm_epp.framework.types import Endpoint, InferenceRequest
from llm_epp.plugins.flowcontrol.fcfs_ordering_policy import FcfsOrderingPolicy
from llm_epp.plugins.flowcontrol.global_strict_fairness_policy import GlobalStrictFairnessPolicy
from llm_epp.plugins.flowcontrol.static_usage_limit_policy import StaticUsageLimitPolicy
from tests.unit.builders import endpoint, request


class Saturation:
    """A saturation detector whose value the test sets."""

    def __init__(self, value: float = 0.0) -> None:
        self.value = value

    @property
    def typed_name(self) -> TypedName:
        return TypedName("test-saturation", "test-saturation")

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        return self.value


def config(**kw: Any) -> FlowControlConfig:
    band_kw = {k: kw.pop(k) for k in ("fairness", "ordering", "band_max_requests", "band_max_bytes") if k in kw}
    band = BandConfig(
        priority=0,
        fairness=band_kw.get("fairness", GlobalStrictFairnessPolicy()),
        ordering=band_kw.get("ordering", FcfsOrderingPolicy()),
        max_requests=band_kw.get("band_max_requests", 0),
        max_bytes=band_kw.get("band_max_bytes", 1_000_000_000),
    )
    kw.setdefault("usage_limit", StaticUsageLimitPolicy())
    return FlowControlConfig(default_band=band, **kw)


def controller(sat: Saturation, cfg: FlowControlConfig | None = None, eps: int = 1) -> FlowController:
    pool = [endpoint(f"p{i}", address=f"10.0.0.{i + 1}") for i in range(eps)]
    return FlowController(cfg or config(), sat, lambda: pool, poll_interval=0.01)


def req(rid: str, fairness: str = "default-flow", priority: int = 0, size: int = 10, **kw: Any) -> InferenceRequest:
    r = request(request_id=rid, priority=priority, **kw)
    return dataclasses.replace(r, fairness_id=fairness, size_bytes=size)


async def settle_loop(rounds: int = 5) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


class Order:
    """Runs requests through the controller; records the order in which they are released."""

    def __init__(self, fc: FlowController) -> None:
        self.fc = fc
        self.released: list[str] = []
        self.tickets: dict[str, Ticket] = {}

    async def run(self, r: InferenceRequest, settle: bool = True) -> None:
        ticket = await self.fc.enqueue_and_wait(r)
        self.released.append(r.request_id)
        self.tickets[r.request_id] = ticket
        if settle:
            ticket.settle()
