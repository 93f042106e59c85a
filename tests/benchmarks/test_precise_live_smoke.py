"""The live precise-routing benchmark at smoke size: `llm-epp sim` pods publishing KV events over ZMQ, the EPP
and Envoy as real processes; every request is answered in both configurations, the precise EPP receives
the pods' events and the cache reset between the stages is accepted.

Shape only: the latencies and hit rates themselves belong to the benchmark, not to tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.envoy


def test_precise_live_smoke_answers_everything_and_feeds_the_precise_index(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.precise_live", "--smoke", "--output", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # on a timeout, everything it started is stopped with it
    )
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"the precise live smoke did not finish:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    report = (tmp_path / "precise_live_smoke.md").read_text()
    rows = [line.split("|") for line in report.splitlines() if line.startswith(("| approximate |", "| precise |"))]
    stage_rows = [r for r in rows if len(r) > 10]
    assert {r[1].strip() for r in stage_rows} == {"approximate", "precise"}
    assert len(stage_rows) == 4  # two stages each
    for row in stage_rows:
        requests, failed = int(row[4]), int(row[5])
        assert requests > 0 and failed == 0
    reset_rows = [line.split("|") for line in report.splitlines() if line.startswith("| ") and "| 200 |" in line]
    assert len(reset_rows) == 2  # the reset was accepted in both runs (the pods had drained)
    events = report.split("KV-event messages the precise EPP received:")[1].strip().rstrip(".")
    assert float(events.replace(",", "")) > 0
