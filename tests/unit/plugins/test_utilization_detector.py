"""Tests for the utilization-detector plugin: saturation = mean over endpoints of max(queue ratio, kv
ratio) with stale/missing metrics counting 1.0; as a filter, fresh endpoints under the headroom-relaxed
limits, failing open when none pass."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
from pydantic import ValidationError

from llm_epp.framework import CycleState, Endpoint, Filter, TypedName
from llm_epp.framework.flowcontrol import SaturationDetector
from llm_epp.plugins.scheduling import utilization_detector as mod
from llm_epp.plugins.scheduling.utilization_detector import Params, UtilizationDetector, parse_go_duration
from tests.unit.builders import FakeHandle, endpoint, names, request

NOW = 100.0


def _detector(**kw: Any) -> UtilizationDetector:
    return UtilizationDetector(clock=lambda: NOW, **kw)


def _ep(name: str, queue: int = 0, kv: float = 0.0, age: float | None = 0.0) -> Endpoint:
    """An endpoint whose metrics are `age` seconds old (None = never scraped)."""
    updated = 0.0 if age is None else NOW - age
    return endpoint(name, queue=queue, kv=kv, updated=updated, address=f"10.0.{len(name)}.{sum(map(ord, name)) % 250}")


@pytest.mark.parametrize(
    ("eps", "expected"),
    [
        ([], 1.0),
        ([_ep("a")], 0.0),
        ([_ep("a", queue=5)], 1.0),
        ([_ep("a", kv=0.4)], 0.5),
        ([_ep("a", queue=1, kv=0.4)], 0.5),
        ([_ep("a", queue=4, kv=0.4)], 0.8),
        ([_ep("a", queue=10)], 2.0),
        ([_ep("a", queue=5), _ep("b")], 0.5),
        ([_ep("a", queue=1), _ep("b", kv=0.8), _ep("c", queue=2, kv=0.2)], (0.2 + 1.0 + 0.4) / 3),
        ([_ep("a", age=0.5), _ep("b")], 0.5),
        ([_ep("a", age=None), _ep("b")], 0.5),
        ([_ep("a", age=0.19)], 0.0),
        ([_ep("a", age=0.21)], 1.0),
        ([_ep("a", kv=math.nan), _ep("b")], 0.5),
        ([_ep("a", age=5.0), _ep("b", age=None)], 1.0),
    ],
    ids=[
        "no-endpoints",
        "idle",
        "queue-at-threshold",
        "kv-half",
        "max-of-ratios-kv",
        "max-of-ratios-queue",
        "over-saturated",
        "mean",
        "mean-of-max-three",
        "stale-counts-full",
        "never-scraped-counts-full",
        "just-fresh",
        "just-stale",
        "nan-kv-counts-full",
        "all-unobservable",
    ],
)
def test_saturation(eps: list[Endpoint], expected: float) -> None:
    assert _detector().saturation(eps) == pytest.approx(expected)


def test_metrics_exactly_at_the_staleness_threshold_are_fresh() -> None:
    detector = _detector(metrics_staleness_threshold=0.25)
    assert detector.saturation([_ep("a", age=0.25)]) == 0.0
    assert names(detector.filter(CycleState(), request(), [_ep("a", age=0.25), _ep("b", queue=9)])) == ["a"]


def test_saturation_uses_the_ideal_thresholds_not_the_headroom() -> None:
    assert _detector(headroom=0.5).saturation([_ep("a", queue=5)]) == 1.0


def test_saturation_with_custom_thresholds() -> None:
    detector = _detector(queue_depth_threshold=10, kv_cache_util_threshold=0.5)
    assert detector.saturation([_ep("a", queue=5, kv=0.1), _ep("b", queue=1, kv=0.5)]) == pytest.approx(0.75)


@pytest.mark.parametrize(
    ("eps", "headroom", "expected"),
    [
        ([], 0.0, []),
        ([_ep("a")], 0.0, ["a"]),
        ([_ep("a"), _ep("b", queue=5), _ep("c", queue=4)], 0.0, ["a", "c"]),
        ([_ep("a", kv=0.8), _ep("b", kv=0.79)], 0.0, ["b"]),
        ([_ep("a", queue=5), _ep("b", queue=6)], 0.2, ["a"]),
        ([_ep("a", kv=0.9), _ep("b", kv=0.96)], 0.2, ["a"]),
        ([_ep("a", age=1.0), _ep("b")], 0.0, ["b"]),
        ([_ep("a", age=None), _ep("b")], 0.0, ["b"]),
        ([_ep("a", kv=math.nan), _ep("b")], 0.0, ["b"]),
        ([_ep("a", queue=9), _ep("b", kv=0.99)], 0.0, ["a", "b"]),
        ([_ep("a", age=None), _ep("b", age=3.0)], 0.0, ["a", "b"]),
        ([_ep("a", queue=5)], 0.0, ["a"]),
    ],
    ids=[
        "no-candidates",
        "one-fresh-idle",
        "queue-limit-is-strict",
        "kv-limit-is-strict",
        "queue-headroom",
        "kv-headroom",
        "stale-removed",
        "never-scraped-removed",
        "nan-kv-removed",
        "fail-open-all-full",
        "fail-open-all-stale",
        "fail-open-one-candidate",
    ],
)
def test_filter(eps: list[Endpoint], headroom: float, expected: list[str]) -> None:
    kept = _detector(headroom=headroom).filter(CycleState(), request(), eps)
    assert names(kept) == expected


def test_filter_keeps_the_order_of_the_candidates() -> None:
    eps = [_ep("c"), _ep("a", queue=9), _ep("b"), _ep("d")]
    assert names(_detector().filter(CycleState(), request(), eps)) == ["c", "b", "d"]


def test_staleness_follows_the_handle_clock() -> None:
    handle = FakeHandle(clock=10.0)
    detector = mod.factory("u", Params(), handle)
    ep = endpoint("a", updated=9.9)
    assert detector.saturation([ep]) == 0.0
    handle.clock = 10.5
    assert detector.saturation([ep]) == 1.0
    assert names(detector.filter(CycleState(), request(), [ep, endpoint("b", updated=10.45, address="10.0.0.2")])) == [
        "b"
    ]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("200ms", 0.2),
        ("2s", 2.0),
        ("1m", 60.0),
        ("1.5s", 1.5),
        ("1h30m", 5400.0),
        ("500us", 0.0005),
        ("500\u00b5s", 0.0005),
        ("250ns", 2.5e-7),
        (".5s", 0.5),
        ("0", 0.0),
        ("-1s", -1.0),
        ("+3ms", 0.003),
    ],
    ids=["ms", "s", "m", "fraction", "compound", "us", "micro-sign", "ns", "leading-dot", "zero", "negative", "plus"],
)
def test_parse_go_duration(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "200", "1.5", "ms", "2 s", "1d", "1s2", "abc", "-"])
def test_parse_go_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_go_duration(text)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, (5, 0.8, 0.2, 0.0)),
        (
            {
                "queueDepthThreshold": 10,
                "kvCacheUtilThreshold": 0.9,
                "metricsStalenessThreshold": "2s",
                "headroom": 0.2,
            },
            (10, 0.9, 2.0, 0.2),
        ),
        ({"metricsStalenessThreshold": "1m"}, (5, 0.8, 60.0, 0.0)),
        ({"metricsStalenessThreshold": 0.5}, (5, 0.8, 0.5, 0.0)),
        ({"metricsStalenessThreshold": 3}, (5, 0.8, 3.0, 0.0)),
        ({"kvCacheUtilThreshold": 1.0}, (5, 1.0, 0.2, 0.0)),
        ({"queue_depth_threshold": 7}, (7, 0.8, 0.2, 0.0)),
    ],
    ids=["defaults", "reference-keys", "minutes", "float-seconds", "int-seconds", "kv-one", "snake-case"],
)
def test_params(raw: dict[str, Any] | None, expected: tuple[int, float, float, float]) -> None:
    p = Params.model_validate(raw or {})
    assert (
        p.queue_depth_threshold,
        p.kv_cache_util_threshold,
        p.metrics_staleness_threshold,
        p.headroom,
    ) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"queueDepthThreshold": 0}, "queueDepthThreshold"),
        ({"kvCacheUtilThreshold": 0.0}, "kvCacheUtilThreshold"),
        ({"kvCacheUtilThreshold": 1.1}, "kvCacheUtilThreshold"),
        ({"metricsStalenessThreshold": "0"}, "metricsStalenessThreshold"),
        ({"metricsStalenessThreshold": "-1s"}, "metricsStalenessThreshold"),
        ({"metricsStalenessThreshold": "200"}, "metricsStalenessThreshold"),
        ({"metricsStalenessThreshold": True}, "metricsStalenessThreshold"),
        ({"metricsStalenessThreshold": [1]}, "metricsStalenessThreshold"),
        ({"headroom": -0.1}, "headroom"),
        ({"headroom": math.nan}, "headroom"),
    ],
    ids=[
        "queue-zero",
        "kv-zero",
        "kv-above-one",
        "staleness-zero",
        "staleness-negative",
        "staleness-no-unit",
        "staleness-bool",
        "staleness-list",
        "headroom-negative",
        "headroom-nan",
    ],
)
def test_bad_params_are_rejected_by_name(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        Params.model_validate(raw)
    assert field in str(info.value)


def test_high_headroom_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        mod.factory("u", Params(headroom=20), FakeHandle())
    assert "utilization_detector_high_headroom" in caplog.text


def test_identity_and_extension_points() -> None:
    detector = mod.factory("sat", Params(), FakeHandle())
    assert detector.typed_name == TypedName("utilization-detector", "sat")
    assert isinstance(detector, Filter)
    assert isinstance(detector, SaturationDetector)
