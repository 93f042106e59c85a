"""Tests for the queue-scorer plugin: inverse min-max over the candidates' waiting queues."""

from __future__ import annotations

import pytest

from llm_epp.framework import CycleState, ScorerCategory, TypedName
from llm_epp.plugins.scheduling import queue_scorer as mod
from llm_epp.plugins.scheduling.queue_scorer import Params, QueueScorer
from tests.unit.builders import FakeHandle, endpoint, key, request


@pytest.mark.parametrize(
    ("queues", "expected"),
    [
        ({}, {}),
        ({"a": 7}, {"a": 1.0}),
        ({"a": 0, "b": 0, "c": 0}, {"a": 1.0, "b": 1.0, "c": 1.0}),
        ({"a": 4, "b": 4}, {"a": 1.0, "b": 1.0}),
        ({"a": 0, "b": 5, "c": 10}, {"a": 1.0, "b": 0.5, "c": 0.0}),
        ({"a": 2, "b": 2, "c": 6}, {"a": 1.0, "b": 1.0, "c": 0.0}),
        ({"a": 100, "b": 1}, {"a": 0.0, "b": 1.0}),
    ],
    ids=["no-candidates", "one", "all-empty", "all-equal", "spread", "two-tied-shortest", "reversed"],
)
def test_score(queues: dict[str, int], expected: dict[str, float]) -> None:
    eps = [endpoint(n, queue=q, address=f"10.0.0.{i}") for i, (n, q) in enumerate(queues.items(), 1)]
    scores = QueueScorer().score(CycleState(), request(), eps)
    assert scores == pytest.approx({key(n): v for n, v in expected.items()})


def test_score_is_relative_to_the_candidates_given() -> None:
    scorer = QueueScorer()
    b = endpoint("b", queue=5)
    with_idle = scorer.score(CycleState(), request(), [endpoint("a", queue=0), b])
    without_idle = scorer.score(CycleState(), request(), [b, endpoint("c", queue=10)])
    assert with_idle[b.key] == 0.0
    assert without_idle[b.key] == 1.0


def test_other_metrics_do_not_matter() -> None:
    eps = [endpoint("a", queue=1, kv=0.99, running=50), endpoint("b", queue=3, kv=0.0, running=0)]
    scores = QueueScorer().score(CycleState(), request(), eps)
    assert scores == {key("a"): 1.0, key("b"): 0.0}


def test_identity_and_category() -> None:
    scorer = mod.factory("q", Params(), FakeHandle())
    assert scorer.typed_name == TypedName("queue-scorer", "q")
    assert scorer.category is ScorerCategory.DISTRIBUTION


def _with_load(ep, requests: int):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    from llm_epp.framework import InFlightLoad

    return replace(ep, load=InFlightLoad(requests=requests))


def test_requests_sent_since_the_scrape_count_until_the_next_scrape() -> None:
    scorer = QueueScorer()
    a, b = endpoint("a", queue=0, updated=1.0), endpoint("b", queue=0, address="10.0.0.2", updated=1.0)
    assert scorer.score(CycleState(), request(), [a, b]) == {a.key: 1.0, b.key: 1.0}
    a.load.requests += 2  # two requests sent to a; the scrape cannot show them yet
    assert scorer.score(CycleState(), request(), [a, b]) == {a.key: 0.0, b.key: 1.0}
    b.load.requests += 2
    assert scorer.score(CycleState(), request(), [a, b]) == {a.key: 1.0, b.key: 1.0}  # 2 sent to each
    # the next scrape shows what it shows (here: a still idle, b one waiting); what was sent before is in it
    a2, b2 = (
        _with_load(endpoint("a", queue=0, updated=2.0), 2),
        _with_load(endpoint("b", queue=1, address="10.0.0.2", updated=2.0), 1),
    )
    assert scorer.score(CycleState(), request(), [a2, b2]) == {a2.key: 1.0, b2.key: 0.0}


def test_requests_in_flight_before_the_scrape_are_not_counted_twice() -> None:
    scorer = QueueScorer()
    busy = _with_load(endpoint("a", queue=3, running=5, updated=7.0), 8)  # the scrape shows these 8
    idle = endpoint("b", queue=0, address="10.0.0.2", updated=7.0)
    assert scorer.score(CycleState(), request(), [busy, idle]) == {busy.key: 0.0, idle.key: 1.0}
    for _ in range(3):
        idle.load.requests += 1
    assert scorer.score(CycleState(), request(), [busy, idle]) == {busy.key: 1.0, idle.key: 1.0}  # 3 vs 3
