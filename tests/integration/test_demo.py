"""`make demo` end to end (DEMO_ONCE=1): simulated vLLM pods, the EPP and real Envoys on free ports."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_both_bursts_and_prints_a_side_by_side_summary() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "examples.demo"],
        cwd=ROOT,
        env={**os.environ, "DEMO_ONCE": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rows = re.findall(
        r"^(llm-epp|round-robin)\s+#\d+\s+group \d\s+pod (sim-\d)\s+status (\d+)"
        r"\s+cached\s+(\d+)/(\d+)\s+TTFT\s+[\d.]+ ms",
        out.stdout,
        re.M,
    )
    assert len(rows) == 48
    assert {status for _, _, status, _, _ in rows} == {"200"}
    assert re.search(r"^requests ok\s+24/24\s+24/24$", out.stdout, re.M)
    hit = re.search(r"^prefix cache hit rate\s+(\d+)%\s+(\d+)%$", out.stdout, re.M)
    assert hit is not None
    # the pods' own cached-token counts: prefix-aware routing finds more of each prompt already cached
    assert int(hit.group(1)) > int(hit.group(2))
    per_pod = re.findall(r"^requests on (sim-\d)\s+(\d+)\s+(\d+)$", out.stdout, re.M)
    assert sum(int(a) for _, a, _ in per_pod) == 24 and sum(int(b) for _, _, b in per_pod) == 24
    assert re.search(r"^TTFT p50 \(ms\)\s+[\d.]+\s+[\d.]+$", out.stdout, re.M)
