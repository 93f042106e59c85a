"""`benchmarks.request_cost` at a tiny size, beside a copy of this checkout's code imported as the baseline."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def request_cost(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.request_cost", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_request_cost_runs_two_versions_side_by_side(tmp_path: Path) -> None:
    baseline = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "llm_epp", baseline / "llm_epp", ignore=shutil.ignore_patterns("__pycache__"))
    args = ["--baseline-src", str(baseline), "--blocks", "2", "--block", "5", "--warmup", "1", "--workload", "chat"]
    out = request_cost(*args)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = out.stderr
    assert f"old: llm_epp from {baseline / 'llm_epp'}" in report  # the baseline really is the other copy
    assert f"new: llm_epp from {ROOT / 'src' / 'llm_epp'}" in report
    rows = [r for r in report.splitlines() if re.match(r"^\| (old|new) \| [\d.]+ \| [\d.]+ \| [\d.]+ \|$", r)]
    assert [r.split("|")[1].strip() for r in rows] == ["old", "new"]
    assert re.search(r"new / old: [\d.]+, [\d.]+, [\d.]+ \(min, q1, median\)", report)


def test_request_cost_with_cold_caches_reports_per_request_cpu() -> None:
    out = request_cost("--blocks", "2", "--block", "5", "--warmup", "1", "--cold-cache", "1", "--tracing", "off")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "cold caches (1 MiB written before each request)" in out.stderr
    rows = [r for r in out.stderr.splitlines() if re.match(r"^\| new \| [\d.]+ \| [\d.]+ \| [\d.]+ \|$", r)]
    assert len(rows) == 1 and float(rows[0].split("|")[2]) > 0
    refused = request_cost("--cold-cache", "-1", timeout=60)
    assert refused.returncode == 2 and "--cold-cache: give a size in MiB" in refused.stderr
