from __future__ import annotations

import pytest

from llm_epp.framework.flowpolicy import EvictionItem
from llm_epp.plugins.flowcontrol.sheddable_eviction_filter import Params, SheddableEvictionFilter, factory
from tests.unit.builders import FakeHandle, request


@pytest.mark.parametrize(("priority", "evictable"), [(-10, True), (-1, True), (0, False), (1, False), (10, False)])
def test_only_negative_priorities_may_be_evicted(priority: int, evictable: bool) -> None:
    item = EvictionItem("r", priority, 0.0, "10.0.0.1:8000", request(request_id="r", priority=priority))
    assert SheddableEvictionFilter().accept(item) is evictable


def test_factory_names_the_instance() -> None:
    assert factory("mine", Params(), FakeHandle()).typed_name.name == "mine"
