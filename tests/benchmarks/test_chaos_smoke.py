"""`python -m benchmarks.chaos` at a tiny size: pods die under load and the EPP drains; checks that the report
is well-formed and that the counts it prints add up, never the figures themselves."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.envoy


def test_chaos_smoke_writes_a_well_formed_report(tmp_path: Path) -> None:
    report = tmp_path / "chaos.md"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.chaos",
            *("--duration", "5", "--kill-every", "2", "--rate", "10"),
            "--output",
            str(report),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = report.read_text()
    assert "seed 1" in text and "commit " in text
    deaths = [line for line in text.splitlines() if re.match(r"^\| \d+\.\d \| \d+\.\d \| \d+ \| \d+ \| \d+ \|$", line)]
    assert len(deaths) >= 1
    m = re.search(r"Requests: (\d+), failed (\d+)\. During the drain: (\d+) sent, (\d+) failed\.", text)
    assert m is not None
    total, failed, drained, drain_failed = map(int, m.groups())
    assert total >= drained > 0 and failed >= drain_failed
    assert re.search(r"EPP memory: \d+ MiB before", text)
