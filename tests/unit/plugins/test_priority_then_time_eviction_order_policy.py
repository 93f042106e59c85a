from __future__ import annotations

import functools

from hypothesis import given
from hypothesis import strategies as st

from llm_epp.framework.flowpolicy import EvictionItem
from llm_epp.plugins.flowcontrol.priority_then_time_eviction_order_policy import (
    Params,
    PriorityThenTimeEvictionOrderPolicy,
    factory,
)
from tests.unit.builders import FakeHandle, request


def _item(rid: str, priority: int, at: float) -> EvictionItem:
    return EvictionItem(rid, priority, at, "10.0.0.1:8000", request(request_id=rid, priority=priority))


def test_lowest_priority_first_then_the_most_recently_dispatched() -> None:
    policy = PriorityThenTimeEvictionOrderPolicy()
    assert policy.evict_before(_item("a", -3, 5.0), _item("b", -1, 1.0))
    assert not policy.evict_before(_item("b", -1, 1.0), _item("a", -3, 5.0))
    assert policy.evict_before(_item("new", -1, 5.0), _item("old", -1, 1.0))
    assert not policy.evict_before(_item("old", -1, 1.0), _item("new", -1, 5.0))
    assert not policy.evict_before(_item("x", -1, 1.0), _item("y", -1, 1.0)), "a tie is no order"


@given(st.lists(st.tuples(st.integers(-5, 5), st.floats(0, 1e6, allow_nan=False)), min_size=1, max_size=30))
def test_sorting_by_the_policy_orders_by_priority_then_newest(entries: list[tuple[int, float]]) -> None:
    policy = PriorityThenTimeEvictionOrderPolicy()
    items = [_item(str(i), p, t) for i, (p, t) in enumerate(entries)]

    def cmp(a: EvictionItem, b: EvictionItem) -> int:
        return -1 if policy.evict_before(a, b) else 1 if policy.evict_before(b, a) else 0

    ordered = sorted(items, key=functools.cmp_to_key(cmp))
    keys = [(i.priority, -i.dispatched_at) for i in ordered]
    assert keys == sorted(keys)


def test_factory_names_the_instance() -> None:
    assert factory("mine", Params(), FakeHandle()).typed_name.name == "mine"
