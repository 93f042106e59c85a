"""Affinity-aware choice among a flow's first queued requests (pure).

With a saturation detector that implements `DispatchAffinity` and a window K > 0, the dispatch cycle does not
release the flow's first request blindly. It looks at the flow's first K requests in the ordering policy's
order and releases, in this order of preference:

1. the first one that has been in the window for at least the maximum wait (age beats affinity: no request
   is passed over for longer than that once it is among the first K);
2. the first one whose prefix is held on an endpoint with room for it (`HOME_FITS`: it shares KV blocks
   with requests in flight there instead of copying them);
3. the first one whose prefix nobody holds (`NO_HOME`: it costs the same anywhere);
4. none: every request in the window would copy its prefix to another endpoint; the cycle releases nothing
   and the next one (a request ending, an arrival, the poll) looks again.

Priority bands and fairness between flows are untouched: the window is inside the flow the band's fairness
policy picked, and a band holding its requests stops the cycle as a saturated band does, so a lower band
never overtakes it. TTLs run as always.
"""

from __future__ import annotations

from collections.abc import Sequence

from llm_epp.framework.flowcontrol import Placement


def choose(
    placements: Sequence[Placement], in_window_since: Sequence[float], now: float, max_wait: float
) -> int | None:
    """The index to release among the window's requests (in order), or None to hold them all."""
    for i, since in enumerate(in_window_since):
        if now - since >= max_wait:
            return i
    for wanted in (Placement.HOME_FITS, Placement.NO_HOME):
        for i, placement in enumerate(placements):
            if placement is wanted:
                return i
    return None
