from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llm_epp.plugins.flowcontrol.global_strict_fairness_policy import GlobalStrictFairnessPolicy
from tests.unit.flowcontrol.queueing import band, drain, item


@given(st.lists(st.tuples(st.sampled_from("abcde"), st.integers(0, 1000)), min_size=1, max_size=50))
def test_the_band_is_one_queue_in_ordering_policy_order(entries: list[tuple[str, int]]) -> None:
    b = band(fairness=GlobalStrictFairnessPolicy())
    for i, (flow, t) in enumerate(entries):
        b.add(item(f"{i}", flow=flow, enqueued_at=float(t)))
    times = [entries[int(r)][1] for r in drain(b)]
    assert times == sorted(times), "the oldest request of the whole band is served first, whatever its flow"


def test_an_empty_band_picks_nothing() -> None:
    assert GlobalStrictFairnessPolicy().pick_flow(band()) is None
