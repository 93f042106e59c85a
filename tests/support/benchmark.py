"""Running a benchmark module as its user does (`python -m benchmarks.NAME ...` from the checkout's root)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(module: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`benchmarks.<module>` with `args`; its output captured as text, bounded by `timeout` seconds."""
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
