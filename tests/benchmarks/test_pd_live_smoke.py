"""The live P/D benchmark at smoke size: simulated pods with roles, `llm-epp pd-sidecar`, the EPP and Envoy as
real processes; both modes answer every request, and only the split one moves KV.

Shape only: the latencies themselves belong to the benchmark, not to tests.
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


def test_pd_live_smoke_splits_every_request_only_in_the_disaggregated_mode(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.pd_live", "--smoke", "--output", str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # on a timeout, everything it started is stopped with it
    )
    try:
        stdout, stderr = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"the P/D live smoke did not finish:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    report = (tmp_path / "pd_live_smoke.md").read_text()
    rows = {}
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] in ("aggregated", "always-disagg"):
            rows[cells[0]] = cells
    assert set(rows) == {"aggregated", "always-disagg"}
    for cells in rows.values():
        assert cells[1] == "12" and cells[2] == "0"  # 12 requests, none failed
    assert rows["aggregated"][6:] == ["0", "0.00"]
    assert rows["always-disagg"][6] == "12" and float(rows["always-disagg"][7]) > 0
