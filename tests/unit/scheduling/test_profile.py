"""Tests for llm_epp.scheduling.profile: filters -> weighted, clamped scorers -> picker, and the isolation
of failing plugins (each failure counted through the Recorder with its extension point)."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Sequence
from decimal import Decimal

import pytest

from llm_epp.framework import CycleState, Filter, ProfileResult, StateKey
from llm_epp.scheduling import SchedulerProfile, WeightedScorer
from llm_epp.scheduling.profile import _all_in_range
from tests.unit.builders import (
    FakeFilter,
    FakePicker,
    FakeRecorder,
    FakeScorer,
    endpoint,
    endpoints,
    key,
    names,
    request,
)


def _profile(
    filters: Sequence[Filter] = (),
    scorers: Sequence[WeightedScorer] = (),
    picker: FakePicker | None = None,
    recorder: FakeRecorder | None = None,
    rng: random.Random | None = None,
) -> SchedulerProfile:
    return SchedulerProfile("default", filters, scorers, picker or FakePicker(), recorder or FakeRecorder(), rng=rng)


def _run(profile: SchedulerProfile, *eps_names: str) -> ProfileResult | None:
    return profile.run(CycleState(), request(), endpoints(*eps_names))


# ------------------------------------------------------------------------------------------- scoring


def test_weighted_sum_of_scorers_reaches_the_picker() -> None:
    picker = FakePicker()
    profile = _profile(
        scorers=[
            WeightedScorer(FakeScorer("q", {"a": 1.0, "b": 0.5, "c": 0.0}), 2.0),
            WeightedScorer(FakeScorer("kv", {"a": 0.0, "b": 0.5, "c": 1.0}), 3.0),
        ],
        picker=picker,
    )
    result = _run(profile, "a", "b", "c")
    assert picker.calls == [[("a", 2.0), ("b", 2.5), ("c", 3.0)]]
    assert result is not None
    assert names(result.target_endpoints) == ["c"]


def test_weight_defaults_to_one() -> None:
    assert WeightedScorer(FakeScorer()).weight == 1.0
    picker = FakePicker()
    _run(_profile(scorers=[WeightedScorer(FakeScorer("s", {"a": 0.4}))], picker=picker), "a")
    [[(name, total)]] = picker.calls
    assert name == "a"
    assert total == pytest.approx(0.4)


def test_weights_are_not_renormalised() -> None:
    picker = FakePicker()
    scorers = [WeightedScorer(FakeScorer(n, {"a": 1.0}), 2.0) for n in ("s1", "s2", "s3")]
    _run(_profile(scorers=scorers, picker=picker), "a")
    assert picker.calls == [[("a", 6.0)]]


@pytest.mark.parametrize(
    ("raw", "clamped", "counted"),
    [
        (0.4, 0.4, 0),
        (0.0, 0.0, 0),
        (1.0, 1.0, 0),
        (1, 1.0, 0),
        (1.5, 1.0, 1),
        (-0.2, 0.0, 1),
        (math.inf, 1.0, 1),
        (-math.inf, 0.0, 1),
        (math.nan, 0.0, 1),
        (None, 0.0, 1),
        ("0.5", 0.0, 1),
    ],
    ids=[
        "inside",
        "zero",
        "one",
        "int-one",
        "above-one",
        "negative",
        "inf",
        "minus-inf",
        "nan",
        "none",
        "string",
    ],
)
def test_scores_are_clamped_and_out_of_range_values_counted(raw: object, clamped: float, counted: int) -> None:
    recorder = FakeRecorder()
    picker = FakePicker()
    scorer = FakeScorer("s", {"a": raw})
    _run(_profile(scorers=[WeightedScorer(scorer, 2.0)], picker=picker, recorder=recorder), "a")
    assert picker.calls == [[("a", 2.0 * clamped)]]
    assert recorder.out_of_range == [scorer.typed_name] * counted


def test_each_out_of_range_value_is_counted_against_its_scorer() -> None:
    recorder = FakeRecorder()
    bad = FakeScorer("bad", {"a": 2.0, "b": math.nan, "c": 0.5})
    good = FakeScorer("good", {"a": 0.1, "b": 0.2, "c": 0.3})
    _run(_profile(scorers=[WeightedScorer(bad), WeightedScorer(good)], recorder=recorder), "a", "b", "c")
    assert recorder.out_of_range == [bad.typed_name, bad.typed_name]


def test_missing_keys_count_zero_and_are_not_out_of_range() -> None:
    recorder = FakeRecorder()
    picker = FakePicker()
    profile = _profile(scorers=[WeightedScorer(FakeScorer("s", {"b": 0.5}), 2.0)], picker=picker, recorder=recorder)
    _run(profile, "a", "b")
    assert picker.calls == [[("a", 0.0), ("b", 1.0)]]
    assert recorder.out_of_range == []


def test_scores_for_endpoints_that_are_not_candidates_are_ignored() -> None:
    picker = FakePicker()
    scorer = FakeScorer("s", {"a": 0.5, "z": 1.0})
    result = _run(_profile(scorers=[WeightedScorer(scorer)], picker=picker), "a")
    assert picker.calls == [[("a", 0.5)]]
    assert result is not None
    assert set(result.scores) == {key("a")}


def test_score_breakdown_has_each_weighted_contribution_and_the_total() -> None:
    profile = _profile(
        scorers=[
            WeightedScorer(FakeScorer("queue", {"a": 1.0, "b": 0.25}), 2.0),
            WeightedScorer(FakeScorer("kv", {"a": 0.5}), 3.0),
        ]
    )
    result = _run(profile, "a", "b")
    assert result is not None
    assert result.scores == {
        key("a"): {"queue": 2.0, "kv": 1.5, "total": 3.5},
        key("b"): {"queue": 0.5, "kv": 0.0, "total": 0.5},
    }


def test_scorers_and_picker_see_only_filtered_candidates() -> None:
    scorer = FakeScorer("s", {"a": 1.0, "b": 1.0, "c": 1.0})
    picker = FakePicker()
    profile = _profile(filters=[FakeFilter("f", keep={"b", "c"})], scorers=[WeightedScorer(scorer)], picker=picker)
    result = _run(profile, "a", "b", "c")
    assert scorer.calls == [["b", "c"]]
    assert picker.calls == [[("b", 1.0), ("c", 1.0)]]
    assert result is not None
    assert set(result.scores) == {key("b"), key("c")}


def test_without_scorers_every_candidate_scores_zero() -> None:
    picker = FakePicker()
    _run(_profile(picker=picker), "a", "b")
    assert picker.calls == [[("a", 0.0), ("b", 0.0)]]


# ------------------------------------------------------------------------------------------- filters


def test_filters_run_in_order_on_the_previous_output() -> None:
    first = FakeFilter("first", keep={"a", "b"})
    second = FakeFilter("second", keep={"b", "c"})
    result = _run(_profile(filters=[first, second]), "a", "b", "c")
    assert first.calls == [["a", "b", "c"]]
    assert second.calls == [["a", "b"]]
    assert result is not None
    assert names(result.target_endpoints) == ["b"]


def test_a_filter_leaving_nothing_ends_the_profile_with_none() -> None:
    later = FakeFilter("later")
    scorer = FakeScorer("s")
    picker = FakePicker()
    profile = _profile(filters=[FakeFilter("none", keep=set()), later], scorers=[WeightedScorer(scorer)], picker=picker)
    assert _run(profile, "a", "b") is None
    assert later.calls == []
    assert scorer.calls == []
    assert picker.calls == []


def test_no_endpoints_gives_none() -> None:
    picker = FakePicker()
    assert _run(_profile(picker=picker)) is None
    assert picker.calls == []


# ------------------------------------------------------------------------------------ plugin failures


def test_a_failing_filter_passes_its_input_through() -> None:
    recorder = FakeRecorder()
    broken = FakeFilter("broken", error=RuntimeError("boom"))
    after = FakeFilter("after", keep={"a", "c"})
    result = _run(_profile(filters=[broken, after], recorder=recorder), "a", "b", "c")
    assert after.calls == [["a", "b", "c"]]
    assert result is not None
    assert names(result.target_endpoints) == ["a"]
    assert recorder.plugin_errors == [("Filter", broken.typed_name)]


def test_a_failing_scorer_adds_nothing() -> None:
    recorder = FakeRecorder()
    picker = FakePicker()
    broken = FakeScorer("broken", {"a": 1.0}, error=ZeroDivisionError())
    good = FakeScorer("good", {"a": 0.5, "b": 1.0})
    profile = _profile(
        scorers=[WeightedScorer(broken, 5.0), WeightedScorer(good, 1.0)], picker=picker, recorder=recorder
    )
    result = _run(profile, "a", "b")
    assert picker.calls == [[("a", 0.5), ("b", 1.0)]]
    assert recorder.plugin_errors == [("Scorer", broken.typed_name)]
    assert recorder.out_of_range == []
    assert result is not None
    assert result.scores[key("a")] == {"broken": 0.0, "good": 0.5, "total": 0.5}


def test_a_failing_picker_falls_back_to_a_random_candidate() -> None:
    recorder = FakeRecorder()
    picker = FakePicker("broken", error=KeyError("x"))
    profile = _profile(
        filters=[FakeFilter("f", keep={"a", "b", "c"})],
        scorers=[WeightedScorer(FakeScorer("s", {"a": 1.0}))],
        picker=picker,
        recorder=recorder,
        rng=random.Random(7),
    )
    chosen = set()
    for _ in range(200):
        result = _run(profile, "a", "b", "c", "d")
        assert result is not None
        assert len(result.target_endpoints) == 1
        chosen.add(result.target_endpoints[0].key.name)
        assert result.scores[key("a")]["total"] == 1.0
    assert chosen == {"a", "b", "c"}
    assert recorder.plugin_errors == [("Picker", picker.typed_name)] * 200


def test_failures_of_every_extension_point_are_counted_once_each() -> None:
    recorder = FakeRecorder()
    f = FakeFilter("f", error=ValueError())
    s = FakeScorer("s", error=ValueError())
    p = FakePicker("p", error=ValueError())
    result = _run(_profile(filters=[f], scorers=[WeightedScorer(s)], picker=p, recorder=recorder), "a")
    assert result is not None
    assert names(result.target_endpoints) == ["a"]
    assert recorder.plugin_errors == [("Filter", f.typed_name), ("Scorer", s.typed_name), ("Picker", p.typed_name)]


@pytest.mark.parametrize(
    "error",
    [asyncio.CancelledError(), KeyboardInterrupt()],
    ids=["cancelled", "keyboard-interrupt"],
)
@pytest.mark.parametrize("point", ["filter", "scorer", "picker"])
def test_base_exceptions_are_never_swallowed(point: str, error: BaseException) -> None:
    recorder = FakeRecorder()
    profile = _profile(
        filters=[FakeFilter("f", error=error if point == "filter" else None)],
        scorers=[WeightedScorer(FakeScorer("s", error=error if point == "scorer" else None))],
        picker=FakePicker("p", error=error if point == "picker" else None),
        recorder=recorder,
    )
    with pytest.raises(type(error)):
        _run(profile, "a")
    assert recorder.plugin_errors == []


# ------------------------------------------------------------------------------------- picker result


def test_picker_order_is_kept() -> None:
    eps = endpoints("a", "b", "c")
    picker = FakePicker(result=ProfileResult((eps[2], eps[0])))
    result = _profile(picker=picker).run(CycleState(), request(), eps)
    assert result is not None
    assert names(result.target_endpoints) == ["c", "a"]


def test_an_empty_pick_is_returned_as_is() -> None:
    picker = FakePicker(result=ProfileResult(()))
    result = _run(_profile(scorers=[WeightedScorer(FakeScorer("s", {"a": 1.0}))], picker=picker), "a")
    assert result is not None
    assert result.target_endpoints == ()


# ------------------------------------------------------------------------------------ recorder, cycle


def test_every_plugin_call_is_timed_with_its_extension_point() -> None:
    recorder = FakeRecorder()
    profile = _profile(
        filters=[FakeFilter("f1"), FakeFilter("f2", error=RuntimeError())],
        scorers=[WeightedScorer(FakeScorer("s1")), WeightedScorer(FakeScorer("s2"))],
        picker=FakePicker("p"),
        recorder=recorder,
    )
    _run(profile, "a")
    assert recorder.durations_for("Filter") == ["f1", "f2"]
    assert recorder.durations_for("Scorer") == ["s1", "s2"]
    assert recorder.durations_for("Picker") == ["p"]


def test_plugins_share_the_cycle_state() -> None:
    seen: StateKey[str] = StateKey("seen")

    class Writer(FakeFilter):
        def filter(self, cycle, request, endpoints):  # type: ignore[no-untyped-def]
            cycle.write(seen, "by-filter")
            return endpoints

    class Reader(FakeScorer):
        got: str | None = None

        def score(self, cycle, request, endpoints):  # type: ignore[no-untyped-def]
            Reader.got = cycle.read(seen)
            return {}

    cycle = CycleState()
    _profile(filters=[Writer("w")], scorers=[WeightedScorer(Reader("r"))]).run(cycle, request(), [endpoint("a")])
    assert Reader.got == "by-filter"
    assert cycle.read(seen) == "by-filter"


def test_a_plugin_failure_is_logged_with_the_plugin_name(caplog: pytest.LogCaptureFixture) -> None:
    broken = FakeScorer("broken-scorer", error=RuntimeError("boom"))
    with caplog.at_level("ERROR", logger="llm_epp.scheduling.profile"):
        _run(_profile(scorers=[WeightedScorer(broken)]), "a")
    assert any("broken-scorer" in r.getMessage() and r.exc_info for r in caplog.records)


def test_a_scorer_named_total_is_refused() -> None:
    with pytest.raises(ValueError, match="reserved"):
        _profile(scorers=[WeightedScorer(FakeScorer("total", {"a": 1.0}))])


def test_breakdown_parts_add_up_to_the_total() -> None:
    scorer = FakeScorer("queue", {"a": 1.0})
    scorers = [WeightedScorer(scorer, 1.0), WeightedScorer(scorer, 2.0)]
    result = _run(_profile(scorers=scorers), "a")
    assert result is not None
    parts = dict(result.scores[key("a")])
    total = parts.pop("total")
    assert sum(parts.values()) == pytest.approx(total)


class _WrongScorer(FakeScorer):
    def score(self, cycle, req, eps):  # type: ignore[no-untyped-def]
        return [1.0]


class _WrongPicker(FakePicker):
    def pick(self, cycle, scored):  # type: ignore[no-untyped-def]
        return "a"


def test_wrong_return_types_are_isolated_like_exceptions() -> None:
    recorder = FakeRecorder()
    s = _WrongScorer("wrong-scorer")
    p = _WrongPicker()
    profile = SchedulerProfile("default", [], [WeightedScorer(s)], p, recorder)
    result = profile.run(CycleState(), request(), [endpoint("a")])
    assert result is not None and names(result.target_endpoints) == ["a"]
    assert [e for e, _ in recorder.plugin_errors] == ["Scorer", "Picker"]


@pytest.mark.parametrize(
    "raw", [{"a": math.inf, "b": -math.inf}, {"a": 1e308, "b": 1e308}], ids=["inf-minus-inf", "overflow"]
)
def test_extreme_scores_take_the_clamping_path(raw: dict[str, float]) -> None:
    recorder = FakeRecorder()
    scorer = FakeScorer("extreme", raw)
    profile = SchedulerProfile("default", [], [WeightedScorer(scorer)], FakePicker(), recorder)
    result = profile.run(CycleState(), request(), [endpoint("a"), endpoint("b", address="10.0.0.2")])
    assert result is not None
    totals = {k.name: v["total"] for k, v in result.scores.items()}
    assert totals == {"a": 1.0, "b": 0.0} if "b" in raw and raw["b"] < 0 else {"a": 1.0, "b": 1.0}
    assert len(recorder.out_of_range) == 2


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ({}, True),
        ({"a": 0.0, "b": 1.0, "c": 0.5}, True),
        ({"a": 0.5, "b": 1.5}, False),
        ({"a": -0.1}, False),
        ({"a": float("nan")}, False),
        ({"a": float("inf")}, False),
        ({"a": "0.5"}, False),
        ({"a": None}, False),
        ({"a": Decimal("NaN")}, False),
        ({"a": Decimal("0.5"), "b": True}, True),
    ],
    ids=["empty", "bounds", "above", "below", "nan", "inf", "str", "none", "decimal-nan", "decimal-and-bool"],
)
def test_all_in_range(scores: dict[str, object], expected: bool) -> None:
    assert _all_in_range(scores) is expected  # type: ignore[arg-type]
