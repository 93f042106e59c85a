"""Tests for the data-layer contract types: staleness and page completeness."""

from __future__ import annotations

import pytest

from llm_epp.framework import Metrics
from llm_epp.framework.datalayer import DEFAULT_STALENESS, Sample, ScrapedPage, is_stale


@pytest.mark.parametrize(
    ("update_time", "now", "stale"),
    [(0.0, 5.0, True), (10.0, 11.0, False), (10.0, 12.0, False), (10.0, 12.001, True), (10.0, 9.0, False)],
    ids=["never-scraped", "fresh", "at-threshold", "past-threshold", "clock-behind"],
)
def test_is_stale(update_time: float, now: float, stale: bool) -> None:
    assert is_stale(Metrics(update_time=update_time), now) is stale


def test_default_threshold_is_the_references_two_seconds() -> None:
    assert DEFAULT_STALENESS == 2.0
    assert not is_stale(Metrics(update_time=1.0), 1.5, threshold=1.0)
    assert is_stale(Metrics(update_time=1.0), 2.5, threshold=1.0)


def test_page_completeness() -> None:
    sample = Sample("m", {}, 1.0)
    assert ScrapedPage({"m": (sample,)}).complete
    assert not ScrapedPage({}, truncated=True).complete
    assert not ScrapedPage({}, problems=("m: bad value",)).complete
