"""The live routing benchmark at smoke size: simulated pods, Envoy, llm-epp and the load generator as real
processes; the report has a row per router and stage whose numbers parse, and no request failed.

Shape only: the numbers themselves belong to the benchmark, not to tests.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROUTERS = ("round-robin", "llm-epp-default", "llm-epp-best")
STAGE_COLUMNS = 15

pytestmark = pytest.mark.envoy


def _run_smoke(output: Path, timeout: float = 100) -> subprocess.CompletedProcess[str]:
    """Runs the smoke in its own process group, so that on a timeout everything it started is stopped too."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.live", "--smoke", "--seed", "7", "--output", str(output)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            stdout, stderr = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        pytest.fail(f"the live smoke did not finish in {timeout:g} s:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _number(cell: str) -> float:
    value = float(cell)
    assert math.isfinite(value), cell
    return value


def test_live_smoke_reports_a_row_per_router_and_stage_without_failures(tmp_path: Path) -> None:
    out = _run_smoke(tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "seed 7" in out.stdout

    report = (tmp_path / "live_smoke.md").read_text()
    assert report.startswith("# Live routing benchmark (smoke)")
    assert "python -m benchmarks.live --smoke" in report and "commit " in report and "CPUs" in report
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in report.splitlines()
        if line.startswith("| ") and line.split("|")[1].strip() in ROUTERS
    ]
    stage_rows = [r for r in rows if len(r) == STAGE_COLUMNS]
    headline_rows = [r for r in rows if len(r) == 6]
    assert sorted((r[0], r[1]) for r in stage_rows) == sorted((name, s) for name in ROUTERS for s in ("1", "2"))
    assert sorted(r[0] for r in headline_rows) == sorted(ROUTERS)
    for row in stage_rows:
        _, _stage, rate, requests, failures, *figures, per_pod = row
        assert int(failures) == 0
        assert int(requests) >= 1 and _number(rate) > 0
        for cell in figures:
            _number(cell)
        pods = [int(n) for n in per_pod.split("/")]
        assert len(pods) == 2 and sum(pods) == int(requests)

    data = json.loads((tmp_path / "live_smoke.json").read_text())
    assert data["setup"]["seed"] == 7 and not data["interrupted"]
    assert [r["router"] for r in data["runs"]] == list(ROUTERS)
    for run in data["runs"]:
        assert not run["skipped"] and len(run["stages"]) == 2
        assert all(s["failures"] == 0 and s["requests"] == sum(s["requests_per_pod"]) for s in run["stages"])
