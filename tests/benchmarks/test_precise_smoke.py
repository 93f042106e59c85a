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


def _smoke(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.precise", "--smoke", "--no-index", "--output", str(tmp_path), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _ok(out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


def test_a_restart_between_stages_and_runs_written_apart_combine_into_one_report(tmp_path: Path) -> None:
    _ok(_smoke(tmp_path, "--configs", "approximate,random", "--restart", "2:0", "--name", "a"))
    _ok(_smoke(tmp_path, "--configs", "precise,round-robin", "--restart", "2:0", "--name", "b"))
    _ok(_smoke(tmp_path, "--combine", str(tmp_path / "b.json"), str(tmp_path / "a.json"), "--name", "both"))
    data = json.loads((tmp_path / "both.json").read_text())
    assert [r["label"] for r in data["runs"]] == ["approximate", "precise", "random", "round-robin"]
    assert data["restart"] == {"stage": 2, "pods": [0]}
    for run in data["runs"]:
        assert len(run["census"]) == len(run["stages"]) == len(run["spread"])
        restart = run["restart"]
        assert restart["cleared"] == [True]  # the previous stage had drained: the pod was idle
        assert restart["requests"] == [run["stages"][2]["requests_per_pod"][0]]
        assert run["summary"]["ttft_p90"] >= 0
    by_label = {r["label"]: r for r in data["runs"]}
    assert all(c["believed"] >= 0 for c in by_label["approximate"]["census"])  # the approximate index is read
    assert all(c["believed"] == -1 for c in by_label["precise"]["census"])
    text = (tmp_path / "both.md").read_text()
    assert "Restart: before stage 2" in text and "| round-robin | 0 | yes |" in text
    # runs of another seed (or scenario, or restart) are refused, not mixed
    other = json.loads((tmp_path / "a.json").read_text())
    other["seed"] += 1
    (tmp_path / "c.json").write_text(json.dumps(other))
    out = _smoke(tmp_path, "--combine", str(tmp_path / "a.json"), str(tmp_path / "c.json"), "--name", "mixed")
    assert out.returncode != 0 and "cannot combine" in out.stderr
