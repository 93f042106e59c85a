"""`make bench-smoke` for `benchmarks/precise.py`: a tiny run writes both configurations' stage rows and the
index cost; the shape is checked, never the numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_precise_smoke_writes_both_configurations_and_the_index_cost(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.precise", "--smoke", "--output", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    data = json.loads((tmp_path / "precise.json").read_text())
    expected = [round(s["rate"] * s["duration"]) for s in data["scenario"]["stages"]]
    assert [r["label"] for r in data["runs"]] == ["approximate", "approximate 1/1/1", "precise", "precise 1/1/1"]
    for run in data["runs"]:
        assert [s["requests"] for s in run["stages"]] == expected
        assert all(s["failures"] == 0 and s["req_per_s"] > 0 for s in run["stages"])
        assert all(0.0 <= s["prefix_hit_rate"] <= 1.0 for s in run["stages"])
    precise = data["runs"][2]
    assert precise["batches"] > 0 and precise["malformed"] == 0  # the pods' events reached the index
    assert set(data["index"]["apply"]) == {"cbor-fnv", "xxh64"}
    assert data["index"]["apply"]["xxh64"]["events_per_s"] > 0
    assert data["index"]["memory"]["mib_per_million"] > 0
    text = (tmp_path / "precise.md").read_text()
    assert "| precise | 2 |" in text and "| approximate | 2 |" in text
    assert "per million blocks" in text
