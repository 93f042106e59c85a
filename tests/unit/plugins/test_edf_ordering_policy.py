from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from llm_epp.plugins.flowcontrol.edf_ordering_policy import EdfOrderingPolicy, deadline
from tests.unit.flowcontrol.queueing import band, drain, item

ttls = st.one_of(st.none(), st.floats(min_value=0.001, max_value=1e4, allow_nan=False))


@given(st.lists(st.tuples(st.floats(min_value=0, max_value=1e4, allow_nan=False), ttls), min_size=1, max_size=40))
def test_requests_leave_by_earliest_deadline(entries: list[tuple[float, float | None]]) -> None:
    b = band(ordering=EdfOrderingPolicy())
    items = {}
    for i, (t, ttl) in enumerate(entries):
        it = item(str(i), enqueued_at=t, ttl=ttl)
        items[str(i)] = it
        b.add(it)
    deadlines = [deadline(items[r]) for r in drain(b)]
    assert deadlines == sorted(deadlines)


def test_no_ttl_comes_last_and_ties_go_to_the_earlier_arrival() -> None:
    p = EdfOrderingPolicy()
    patient = item("patient", enqueued_at=0.0, ttl=None)
    urgent = item("urgent", enqueued_at=5.0, ttl=1.0)
    assert deadline(patient) == math.inf
    assert p.less(urgent, patient) and not p.less(patient, urgent)
    a, b = item("a", enqueued_at=1.0, ttl=2.0), item("b", enqueued_at=2.0, ttl=1.0)  # same deadline 3.0
    assert p.less(a, b) and not p.less(b, a)
