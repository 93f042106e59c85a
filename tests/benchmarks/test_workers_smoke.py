"""`benchmarks.workers` at a tiny size: the in-process hop measurement runs both paths and reports them."""

from __future__ import annotations

import re

from benchmarks.workers import hop_cost

IN_PROCESS = "in-process `Director.route` + `finish`"
THROUGH = "through the worker path (frames, Unix socket, Hub)"


def test_the_hop_measurement_reports_both_paths_and_their_difference() -> None:
    lines = hop_cost(64, 4)
    rows = {m.group(1): float(m.group(2)) for line in lines if (m := re.match(r"\| (.+?) \| ([+-]?\d+) \|$", line))}
    assert set(rows) == {IN_PROCESS, THROUGH, "the hop"}
    assert rows[IN_PROCESS] > 0 and rows[THROUGH] > 0
    assert abs(rows["the hop"] - (rows[THROUGH] - rows[IN_PROCESS])) <= 1  # each figure rounded on its own
