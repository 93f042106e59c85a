"""`make demo` end to end (DEMO_ONCE=1): real Envoy, the EPP and stub servers on free ports."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_routes_every_request_and_prints_a_summary() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "examples.demo"],
        cwd=ROOT,
        env={**os.environ, "DEMO_ONCE": "1"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rows = re.findall(r"^\s*\d+\s+(chat|completion)\s+(\d{3})\s+(pod-[abc])\s", out.stdout, re.M)
    assert len(rows) == 12
    assert {status for _, status, _ in rows} == {"200"}
    assert "-> served by pod-c" in out.stdout
    assert "-> 400: model not found" in out.stdout
    counts = dict(re.findall(r"^\s+(pod-[abc])\s+(\d+)\s+#*$", out.stdout, re.M))
    assert sum(int(v) for v in counts.values()) == 13
    assert re.search(r"^\s+total\s+13$", out.stdout, re.M)
