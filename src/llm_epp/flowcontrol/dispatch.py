"""Affinity-aware choice among a flow's first queued requests (pure).

With a saturation detector that implements `DispatchAffinity` and a window K > 0, the dispatch cycle does not
release the flow's first request blindly. It looks at the flow's first K requests in the ordering policy's
order and releases, in this order of preference:

1. the first one that has been in the window for at least the maximum wait (age beats affinity: no request
   is passed over for longer than that once it is among the first K);
2. among those whose prefix is held on an endpoint with room for them (`HOME_FITS`: they share KV blocks with
   requests in flight there instead of copying them), the one that adds the fewest KV tokens there (the
   first of equals);
3. the first one whose prefix nobody holds (`NO_HOME`: it costs the same anywhere);
4. none: every request in the window would copy its prefix to another endpoint; the cycle releases nothing
   and the next one (a request ending, an arrival, the poll) looks again.

When the pool is saturated for a typical request (the detector's saturation reached a band ceiling of 1.0),
only step 2 applies: a request that fits at its home on its real size (often a fraction of a typical one's,
as its prefix is already there) is still released; the age rule does not force anything out then (it would
overflow an endpoint).

With grouped dispatch (a detector that also implements `DispatchGroups`), the controller appends to the
window, for each prefix group with requests in flight, the oldest queued request of that group in the flow
(at most K of them). They compete in steps 2-4 like the others, never in step 1: they are not among
the first K, so their wait does not count. A group's requests then reach their home while its prefix is held
there, instead of one at a time, each after the prefix has been evicted.

Priority bands and fairness between flows are untouched: the window is inside the flow the band's fairness
policy picked, and a band holding its requests stops the cycle as a saturated band does, so a lower band
never overtakes it. TTLs run as always.
"""

from __future__ import annotations

from collections.abc import Sequence

from llm_epp.framework.flowcontrol import Placement


def choose(
    placements: Sequence[Placement],
    in_window_since: Sequence[float],
    now: float,
    max_wait: float,
    costs: Sequence[float] | None = None,
    *,
    saturated: bool = False,
) -> int | None:
    """The index to release among the window's requests (in order), or None to hold them all. `costs`: the KV
    tokens each would add at its home (compared between `HOME_FITS` requests only; None: all equal).
    `saturated`: the pool has no room for a typical request, so only a request that fits at home may go."""
    if not saturated:
        for i, since in enumerate(in_window_since):
            if now - since >= max_wait:
                return i
    best: int | None = None
    for i, placement in enumerate(placements):
        if placement is Placement.HOME_FITS and (best is None or (costs is not None and costs[i] < costs[best])):
            best = i
    if best is not None or saturated:
        return best
    for i, placement in enumerate(placements):
        if placement is Placement.NO_HOME:
            return i
    return None
