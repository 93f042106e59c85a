from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from llm_epp.plugins.flowcontrol.round_robin_fairness_policy import RoundRobinFairnessPolicy
from tests.unit.flowcontrol.queueing import band, drain, item


@given(st.dictionaries(st.sampled_from("abcdefgh"), st.integers(1, 12), min_size=1, max_size=6))
def test_backlogged_flows_take_turns_with_bounded_lag(backlog: dict[str, int]) -> None:
    b = band(fairness=RoundRobinFairnessPolicy())
    t = 0.0
    for flow, n in backlog.items():
        for i in range(n):
            b.add(item(f"{flow}{i}", flow=flow, enqueued_at=t))
            t += 1.0
    served: Counter[str] = Counter()
    for rid in drain(b):
        served[rid[0]] += 1
        backlogged = [f for f, n in backlog.items() if n > served[f] or f == rid[0]]
        counts = [served[f] for f in backlogged]
        assert max(counts) - min(counts) <= 1, "no backlogged flow falls more than one turn behind"
    assert served == Counter(backlog)


def test_a_deep_flow_does_not_starve_a_shallow_one() -> None:
    b = band(fairness=RoundRobinFairnessPolicy())
    for i in range(5):
        b.add(item(f"a{i}", flow="a", enqueued_at=float(i)))
    b.add(item("b0", flow="b", enqueued_at=10.0))
    assert drain(b)[:2] == ["a0", "b0"]
