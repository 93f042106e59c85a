"""Tests for the max-score-picker plugin: highest score wins, random tie-break, ordered fallback list."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from pydantic import ValidationError

from llm_epp.framework import CycleState, TypedName
from llm_epp.plugins.scheduling import max_score_picker as mod
from llm_epp.plugins.scheduling.max_score_picker import MaxScorePicker, Params
from tests.unit.builders import FakeHandle, names, scored


@pytest.mark.parametrize(
    ("candidates", "max_endpoints", "expected"),
    [
        ([], 1, []),
        ([], 3, []),
        ([("a", 0.2)], 1, ["a"]),
        ([("a", 0.2)], 3, ["a"]),
        ([("a", 0.2), ("b", 0.9), ("c", 0.5)], 1, ["b"]),
        ([("a", 0.2), ("b", 0.9), ("c", 0.5)], 2, ["b", "c"]),
        ([("a", 0.2), ("b", 0.9), ("c", 0.5)], 3, ["b", "c", "a"]),
        ([("a", 0.2), ("b", 0.9), ("c", 0.5)], 10, ["b", "c", "a"]),
        ([("a", 0.0), ("b", 0.0), ("c", 7.0)], 1, ["c"]),
        ([("a", -1.0), ("b", -3.0)], 1, ["a"]),
    ],
    ids=[
        "no-candidates",
        "no-candidates-many",
        "one",
        "one-many",
        "best",
        "top-two-best-first",
        "all-ordered",
        "more-than-candidates",
        "above-one",
        "negative",
    ],
)
def test_pick(candidates: list[tuple[str, float]], max_endpoints: int, expected: list[str]) -> None:
    picker = MaxScorePicker(max_endpoints=max_endpoints, rng=random.Random(1))
    result = picker.pick(CycleState(), scored(*candidates))
    assert names(result.target_endpoints) == expected


@pytest.mark.parametrize(
    ("candidates", "max_endpoints", "tied", "never"),
    [
        ([("a", 0.5), ("b", 0.9), ("c", 0.9), ("d", 0.9)], 1, {"b", "c", "d"}, {"a"}),
        ([("a", 0.3), ("b", 0.3)], 1, {"a", "b"}, set()),
        ([("a", 0.5), ("b", 0.9), ("c", 0.9), ("d", 0.9)], 2, {"b", "c", "d"}, {"a"}),
    ],
    ids=["three-tied-best", "all-tied", "ties-with-fallback-list"],
)
def test_ties_are_broken_at_random(
    candidates: list[tuple[str, float]], max_endpoints: int, tied: set[str], never: set[str]
) -> None:
    picker = MaxScorePicker(max_endpoints=max_endpoints, rng=random.Random(42))
    firsts: Counter[str] = Counter()
    for _ in range(300):
        result = picker.pick(CycleState(), scored(*candidates))
        assert len(result.target_endpoints) == max_endpoints
        chosen = names(result.target_endpoints)
        assert set(chosen) <= tied
        assert not set(chosen) & never
        firsts[chosen[0]] += 1
    assert set(firsts) == tied


def test_fallback_list_is_best_first_whatever_the_tie_break() -> None:
    picker = MaxScorePicker(max_endpoints=4, rng=random.Random(3))
    candidates = scored(("a", 0.1), ("b", 0.5), ("c", 0.5), ("d", 0.9), ("e", 0.0))
    for _ in range(50):
        result = picker.pick(CycleState(), candidates)
        got = names(result.target_endpoints)
        assert got[0] == "d"
        assert set(got[1:3]) == {"b", "c"}
        assert got[3] == "a"


def test_pick_does_not_reorder_the_input() -> None:
    candidates = scored(("a", 0.1), ("b", 0.9), ("c", 0.5))
    MaxScorePicker(max_endpoints=3, rng=random.Random(0)).pick(CycleState(), candidates)
    assert [s.endpoint.key.name for s in candidates] == ["a", "b", "c"]


def test_a_nan_score_does_not_crash_the_pick() -> None:
    picker = MaxScorePicker(rng=random.Random(0))
    result = picker.pick(CycleState(), scored(("a", math.nan), ("b", 0.5)))
    assert names(result.target_endpoints) == ["b"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, 1), ({}, 1), ({"maxNumOfEndpoints": 3}, 3), ({"max_num_of_endpoints": 2}, 2)],
    ids=["none", "empty", "camel-case", "snake-case"],
)
def test_params(raw: dict[str, int] | None, expected: int) -> None:
    assert Params.model_validate(raw or {}).max_num_of_endpoints == expected


@pytest.mark.parametrize(
    "raw",
    [{"maxNumOfEndpoints": 0}, {"maxNumOfEndpoints": -1}, {"maxNumOfEndpoint": 2}],
    ids=["zero", "negative", "misspelt-key"],
)
def test_bad_params_are_rejected(raw: dict[str, int]) -> None:
    with pytest.raises(ValidationError):
        Params.model_validate(raw)


def test_factory_uses_name_and_params() -> None:
    picker = mod.factory("top2", Params.model_validate({"maxNumOfEndpoints": 2}), FakeHandle())
    assert picker.typed_name == TypedName("max-score-picker", "top2")
    result = picker.pick(CycleState(), scored(("a", 0.1), ("b", 0.9), ("c", 0.5)))
    assert names(result.target_endpoints) == ["b", "c"]
