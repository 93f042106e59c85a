"""The suite's hypothesis profile: property tests carry no timing assertion."""

from __future__ import annotations

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def test_the_suite_profile_has_no_deadline_and_no_too_slow_check() -> None:
    assert settings().deadline is None
    assert HealthCheck.too_slow in settings().suppress_health_check


@given(st.integers(0, 3))
def test_a_slow_example_is_not_a_failure(n: int) -> None:
    time.sleep(0.25 if n == 0 else 0.0)  # past hypothesis' default 200 ms deadline
