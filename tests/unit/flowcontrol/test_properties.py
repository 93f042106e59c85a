"""Properties of the dispatch order over random arrivals (hypothesis), on a real asyncio loop."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from llm_epp.plugins.flowcontrol.round_robin_fairness_policy import RoundRobinFairnessPolicy
from tests.unit.flowcontrol.support import Saturation, config, controller, req, settle_loop

arrivals = st.lists(st.tuples(st.sampled_from("xyz"), st.integers(-2, 3)), min_size=1, max_size=25)


async def _release_order(entries: list[tuple[str, int]], round_robin: bool) -> list[int]:
    sat = Saturation(1.0)
    cfg = config(fairness=RoundRobinFairnessPolicy()) if round_robin else config()
    fc = controller(sat, cfg)
    released: list[int] = []

    async def one(i: int, flow: str, priority: int) -> None:
        (await fc.enqueue_and_wait(req(str(i), fairness=flow, priority=priority))).settle()
        released.append(i)

    tasks = [asyncio.create_task(one(i, f, p)) for i, (f, p) in enumerate(entries)]
    await settle_loop()
    sat.value = 0.0
    fc.notify()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert fc.length == 0 and fc.unsettled == 0
    return released


@settings(max_examples=60, deadline=None)
@given(arrivals, st.booleans())
def test_strict_priority_never_inverts(entries: list[tuple[str, int]], round_robin: bool) -> None:
    order = asyncio.run(_release_order(entries, round_robin))
    priorities = [entries[i][1] for i in order]
    assert priorities == sorted(priorities, reverse=True), "a lower band never goes before a waiting higher one"
    if not round_robin:  # global strict + FCFS: arrival order inside each band
        for p in set(priorities):
            same = [i for i in order if entries[i][1] == p]
            assert same == sorted(same)
