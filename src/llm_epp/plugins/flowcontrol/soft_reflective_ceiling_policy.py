"""soft-reflective-ceiling-policy

Scheduling intent:
    Tighten lower priority bands as the pool fills, reserving headroom for higher ones, with a dispatch
    rate that falls off gradually instead of a hard threshold. The highest band is gated only at
    saturation 1.0; the band of rank i (0 = highest, N bands) has the reflective ceiling
    1 - i x saturation / (N - 1). A band below its reflective ceiling is open; at or past it (and below
    saturation 1.0) it opens on one call in round(saturation / (1 - saturation)), so its rate is about
    (1 - saturation) / saturation; at saturation >= 1.0 every band but the highest is closed.

Inputs consumed:
    The pool saturation and the number and rank of the priority bands (not their values). One shared
    counter of calls decides open or closed for every gated band alike, so a lower band is never open
    while a higher one is closed.

Configuration:
    No parameters. A single band is always open.
"""

from __future__ import annotations

from collections.abc import Sequence

from llm_epp.framework import Handle, PluginParams, TypedName

TYPE = "soft-reflective-ceiling-policy"


class Params(PluginParams):
    pass


class SoftReflectiveCeilingPolicy:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)
        self._tick = 0

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def compute_limit(self, saturation: float, priorities: Sequence[int], ceilings: list[float]) -> None:
        n = len(priorities)
        if n == 0:
            return
        if n == 1:
            ceilings[0] = 1.0
            return
        open_now = False
        if 1.0 - saturation <= saturation < 1.0:  # some band is at or past its reflective ceiling
            period = max(1, round(saturation / (1.0 - saturation + 1e-9)))
            self._tick += 1
            open_now = self._tick % period == 0
        ceilings[0] = 1.0
        for i in range(1, n):
            reflective = 1.0 - i * saturation / (n - 1)
            if saturation < reflective:
                ceilings[i] = 1.0
            elif saturation >= 1.0:
                ceilings[i] = 0.0
            else:
                ceilings[i] = 1.0 if open_now else 0.0


def factory(name: str, params: Params, handle: Handle) -> SoftReflectiveCeilingPolicy:
    return SoftReflectiveCeilingPolicy(name)
