from __future__ import annotations

import math

import pytest

from llm_epp.plugins.flowcontrol.slo_deadline_ordering_policy import SloDeadlineOrderingPolicy, slo_deadline
from tests.unit.flowcontrol.queueing import band, drain, item


def test_the_tightest_ttft_objective_goes_first() -> None:
    b = band(ordering=SloDeadlineOrderingPolicy())
    b.add(item("none", received_at=0.0))
    b.add(item("loose", received_at=0.0, headers={"x-llm-d-slo-ttft-ms": "5000"}))
    b.add(item("tight", received_at=1.0, headers={"x-slo-ttft-ms": "100"}))  # the older header name
    b.add(item("tight-earlier", received_at=0.5, headers={"x-llm-d-slo-ttft-ms": "600"}))  # same deadline 1.1
    assert drain(b) == ["tight-earlier", "tight", "loose", "none"]


@pytest.mark.parametrize("value", ["abc", "-5", "1.5", "", "99999999999999999999"])
def test_a_bad_header_counts_as_no_objective(value: str) -> None:
    assert slo_deadline(item("r", headers={"x-llm-d-slo-ttft-ms": value})) == math.inf


def test_the_current_header_name_wins() -> None:
    it = item("r", received_at=10.0, headers={"x-llm-d-slo-ttft-ms": "1000", "x-slo-ttft-ms": "1"})
    assert slo_deadline(it) == 11.0
