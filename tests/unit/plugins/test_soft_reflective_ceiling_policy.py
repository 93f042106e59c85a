from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from llm_epp.plugins.flowcontrol.soft_reflective_ceiling_policy import SoftReflectiveCeilingPolicy


def _limits(p: SoftReflectiveCeilingPolicy, saturation: float, n: int) -> list[float]:
    ceilings = [1.0] * n
    p.compute_limit(saturation, list(range(n, 0, -1)), ceilings)
    return ceilings


def test_light_load_leaves_every_band_open() -> None:
    assert _limits(SoftReflectiveCeilingPolicy(), 0.3, 3) == [1.0, 1.0, 1.0]  # ceilings 1.0, 0.85, 0.7


def test_full_saturation_closes_all_but_the_highest_band() -> None:
    assert _limits(SoftReflectiveCeilingPolicy(), 1.0, 3) == [1.0, 0.0, 0.0]
    assert _limits(SoftReflectiveCeilingPolicy(), 0.9, 1) == [1.0]


def test_a_gated_band_opens_once_per_period() -> None:
    p = SoftReflectiveCeilingPolicy()
    # saturation 0.75 with two bands: the lower band's reflective ceiling is 0.25; period round(0.75/0.25) = 3
    opened = [_limits(p, 0.75, 2)[1] for _ in range(9)]
    assert opened == [0.0, 0.0, 1.0] * 3


@given(st.floats(min_value=0.0, max_value=1.5, allow_nan=False), st.integers(2, 6))
def test_ceilings_never_increase_down_the_bands(saturation: float, n: int) -> None:
    p = SoftReflectiveCeilingPolicy()
    for _ in range(4):
        c = _limits(p, saturation, n)
        assert c[0] == 1.0
        assert all(a >= b for a, b in itertools.pairwise(c))
