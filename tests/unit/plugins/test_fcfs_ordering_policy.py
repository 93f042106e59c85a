from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from llm_epp.plugins.flowcontrol.fcfs_ordering_policy import FcfsOrderingPolicy, Params, factory
from tests.unit.builders import FakeHandle
from tests.unit.flowcontrol.queueing import band, drain, item


@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=40))
def test_a_flow_is_served_in_arrival_order(times: list[float]) -> None:
    b = band(ordering=FcfsOrderingPolicy())
    for i, t in enumerate(times):
        b.add(item(str(i), enqueued_at=t))
    order = drain(b)
    served = [times[int(r)] for r in order]
    assert served == sorted(served)
    ties = [int(r) for r in order]
    for a, c in itertools.pairwise(ties):  # equal times keep arrival order
        if times[a] == times[c]:
            assert a < c


def test_factory_names_the_instance() -> None:
    assert factory("mine", Params(), FakeHandle()).typed_name.name == "mine"
