"""Tests for the weighted-random-picker plugin: A-Res weighted sampling without replacement; non-positive
scores last; uniform when nothing scores above zero."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from pydantic import ValidationError

from llm_epp.framework import CycleState, Picker, TypedName
from llm_epp.plugins.scheduling import weighted_random_picker as mod
from llm_epp.plugins.scheduling.weighted_random_picker import Params, WeightedRandomPicker
from tests.unit.builders import FakeHandle, names, scored


@pytest.mark.parametrize(
    ("candidates", "max_endpoints", "expected"),
    [
        ([], 1, []),
        ([], 3, []),
        ([("a", 0.7)], 1, ["a"]),
        ([("a", 0.7)], 4, ["a"]),
        ([("a", 0.0)], 1, ["a"]),
        ([("a", 0.0), ("b", 0.3), ("c", 0.0)], 1, ["b"]),
        ([("a", -1.0), ("b", 1e-9), ("c", math.nan)], 1, ["b"]),
    ],
    ids=[
        "no-candidates",
        "no-candidates-many",
        "one",
        "one-many",
        "one-zero-score",
        "only-positive-wins",
        "tiny-positive-beats-negative-and-nan",
    ],
)
def test_pick(candidates: list[tuple[str, float]], max_endpoints: int, expected: list[str]) -> None:
    picker = WeightedRandomPicker(max_endpoints=max_endpoints, rng=random.Random(7))
    assert names(picker.pick(CycleState(), scored(*candidates)).target_endpoints) == expected


@pytest.mark.parametrize(
    ("weights", "share"),
    [
        ({"a": 1.0, "b": 1.0}, {"a": 0.5, "b": 0.5}),
        ({"a": 3.0, "b": 1.0}, {"a": 0.75, "b": 0.25}),
        ({"a": 0.6, "b": 0.3, "c": 0.1}, {"a": 0.6, "b": 0.3, "c": 0.1}),
        ({"a": 6.0, "b": 3.0, "c": 1.0, "d": 0.0}, {"a": 0.6, "b": 0.3, "c": 0.1, "d": 0.0}),
    ],
    ids=["equal", "three-to-one", "three-way", "zero-never-first"],
)
def test_first_choice_is_proportional_to_score(weights: dict[str, float], share: dict[str, float]) -> None:
    picker = WeightedRandomPicker(rng=random.Random(1234))
    candidates = scored(*weights.items())
    n = 20000
    counts = Counter(picker.pick(CycleState(), candidates).target_endpoints[0].key.name for _ in range(n))
    for name, expected in share.items():
        assert counts[name] / n == pytest.approx(expected, abs=0.015)


def test_all_zero_scores_pick_uniformly() -> None:
    picker = WeightedRandomPicker(rng=random.Random(5))
    candidates = scored(("a", 0.0), ("b", 0.0), ("c", -2.0), ("d", math.nan))
    n = 8000
    counts = Counter(picker.pick(CycleState(), candidates).target_endpoints[0].key.name for _ in range(n))
    for name in "abcd":
        assert counts[name] / n == pytest.approx(0.25, abs=0.02)


def test_all_zero_scores_with_many_endpoints_returns_distinct_endpoints() -> None:
    picker = WeightedRandomPicker(max_endpoints=3, rng=random.Random(0))
    got = names(picker.pick(CycleState(), scored(("a", 0.0), ("b", 0.0), ("c", 0.0), ("d", 0.0))).target_endpoints)
    assert len(got) == 3 and len(set(got)) == 3


def test_many_endpoints_are_distinct_with_positive_scores_first() -> None:
    picker = WeightedRandomPicker(max_endpoints=4, rng=random.Random(11))
    candidates = scored(("z1", 0.0), ("a", 0.5), ("z2", 0.0), ("b", 0.2), ("c", 0.9))
    for _ in range(200):
        got = names(picker.pick(CycleState(), candidates).target_endpoints)
        assert len(got) == 4 and len(set(got)) == 4
        assert set(got[:3]) == {"a", "b", "c"}
        assert got[3] in {"z1", "z2"}


def test_zero_score_fallbacks_are_ordered_at_random() -> None:
    picker = WeightedRandomPicker(max_endpoints=2, rng=random.Random(3))
    candidates = scored(("a", 1.0), ("z1", 0.0), ("z2", 0.0))
    seconds = Counter(names(picker.pick(CycleState(), candidates).target_endpoints)[1] for _ in range(400))
    assert set(seconds) == {"z1", "z2"}


def test_tiny_scores_do_not_underflow_into_ties() -> None:
    """U^(1/s) underflows to 0 for tiny s; the log-space keys keep their order."""
    picker = WeightedRandomPicker(max_endpoints=2, rng=random.Random(9))
    candidates = scored(("a", 1e-5), ("b", 0.0), ("c", 2e-5))
    for _ in range(50):
        assert set(names(picker.pick(CycleState(), candidates).target_endpoints)) == {"a", "c"}


def test_a_zero_uniform_draw_is_replaced() -> None:
    class ZeroRandom(random.Random):
        def random(self) -> float:
            return 0.0

    picker = WeightedRandomPicker(rng=ZeroRandom())
    assert names(picker.pick(CycleState(), scored(("a", 0.5), ("b", 0.0))).target_endpoints) == ["a"]


def test_seeded_picks_are_reproducible() -> None:
    candidates = scored(("a", 0.2), ("b", 0.5), ("c", 0.3))
    runs = [
        [
            names(WeightedRandomPicker(max_endpoints=2, rng=r).pick(CycleState(), candidates).target_endpoints)
            for _ in range(20)
        ]
        for r in (random.Random(42), random.Random(42))
    ]
    assert runs[0] == runs[1]


def test_pick_does_not_reorder_the_input() -> None:
    candidates = scored(("a", 0.1), ("b", 0.9), ("c", 0.5))
    WeightedRandomPicker(max_endpoints=3, rng=random.Random(0)).pick(CycleState(), candidates)
    assert [s.endpoint.key.name for s in candidates] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, 1), ({"maxNumOfEndpoints": 3}, 3), ({"max_num_of_endpoints": 2}, 2)],
    ids=["default", "camel-case", "snake-case"],
)
def test_params(raw: dict[str, int] | None, expected: int) -> None:
    assert Params.model_validate(raw or {}).max_num_of_endpoints == expected


@pytest.mark.parametrize("raw", [{"maxNumOfEndpoints": 0}, {"maxNumOfEndpoints": -2}], ids=["zero", "negative"])
def test_bad_params_are_rejected(raw: dict[str, int]) -> None:
    with pytest.raises(ValidationError):
        Params.model_validate(raw)


def test_factory_uses_name_and_params() -> None:
    picker = mod.factory("wr", Params.model_validate({"maxNumOfEndpoints": 2}), FakeHandle())
    assert picker.typed_name == TypedName("weighted-random-picker", "wr")
    assert isinstance(picker, Picker)
    assert len(picker.pick(CycleState(), scored(("a", 0.1), ("b", 0.9), ("c", 0.5))).target_endpoints) == 2
