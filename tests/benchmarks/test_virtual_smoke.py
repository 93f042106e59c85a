"""`make bench-smoke` for the in-process benchmarks: each runs at a tiny size and writes well-formed results.

These check that the benchmarks run and that their reports have the shape readers rely on, never the
numbers themselves (those belong to the benchmarks, not to tests).
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

from benchmarks.quality import ROUTERS, STEADY_ROUTERS, smoke_scenario

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(module: str, *args: str, timeout: float = 120, returncode: int = 0) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == returncode, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def _table_rows(text: str, first_cell: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            rows.append(cells)
    return rows


def test_quality_smoke_writes_a_row_per_router_and_stage_and_plots(tmp_path: Path) -> None:
    out = _run("benchmarks.quality", "--smoke", "--output", str(tmp_path), "--seed", "7")
    assert "seed 7" in out.stderr

    data = json.loads((tmp_path / "quality.json").read_text())
    assert data["seed"] == 7
    assert [s["pods"] for s in data["scenarios"]] == [4, 8]
    for scenario in data["scenarios"]:
        expected = [round(s["rate"] * s["duration"]) for s in scenario["stages"]]
        assert expected == [s.num_requests for s in smoke_scenario(scenario["pods"]).stages]
        assert [r["router"] for r in scenario["routers"]] == list(ROUTERS)
        for router in scenario["routers"]:
            assert router["error"] is None
            assert [s["requests"] for s in router["stages"]] == expected
            for stage in router["stages"]:
                assert stage["failures"] == 0
                assert stage["req_per_s"] > 0
                assert 0.0 <= stage["prefix_hit_rate"] <= 1.0
                assert sum(stage["requests_per_pod"]) == stage["requests"]
                assert len(stage["requests_per_pod"]) == scenario["pods"]
                assert stage["ttft_p50"] <= stage["ttft_p90"] <= stage["ttft_p99"]

    steady = data["steady"]
    assert sorted((r["label"], r["rate"]) for r in steady) == sorted((n, q) for n in STEADY_ROUTERS for q in (10, 40))
    for row in steady:
        assert row["pods"] == 4 and row["measured"] > 0 and row["completion_rate"] > 0
        assert 0.0 <= row["cached_fraction"] <= 1.0 and isinstance(row["overloaded"], bool)

    report = (tmp_path / "quality.md").read_text()
    assert "### 4 pods" in report and "### 8 pods" in report and "#### Steady state, 4 pods" in report
    for label in ROUTERS:
        # headline row (max QPS at the SLO) for both sizes, one row per stage for both sizes, steady-state rows
        steady_rows = 2 if label in STEADY_ROUTERS else 0
        assert len(_table_rows(report, label)) == 2 + 2 * len(smoke_scenario(4).stages) + steady_rows, label
    for name in ("quality_ttft_4.png", "quality_throughput_4.png", "quality_ttft_8.png", "quality_throughput_8.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC)
        assert f"]({name})" in report


def test_quality_timeline_samples_every_pod_and_the_epp_queue_per_run(tmp_path: Path) -> None:
    routers = ("round-robin", "llm-epp default", "llm-epp + kv-headroom flow control")
    slugs = ("round-robin", "llm-epp-default", "llm-epp-kv-headroom-flow-control")
    common = ("--smoke", "--seed", "7", "--steady", "", "--routers", ",".join(routers))
    _run("benchmarks.quality", *common, "--output", str(tmp_path), "--timeline", "0.5")
    _run("benchmarks.quality", *common, "--output", str(tmp_path / "without"))
    with_timeline, without = (json.loads((d / "quality.json").read_text()) for d in (tmp_path, tmp_path / "without"))
    assert [r["stages"] for sc in with_timeline["scenarios"] for r in sc["routers"]] == [
        r["stages"] for sc in without["scenarios"] for r in sc["routers"]
    ]  # sampling changes no run
    report = (tmp_path / "quality.md").read_text()
    for pods in (4, 8):
        stages = len(smoke_scenario(pods).stages)
        for label, slug in zip(routers, slugs, strict=True):
            name = f"timeline-{pods}pods-{slug}-seed7.csv"
            assert f"]({name})" in report
            lines = (tmp_path / name).read_text().splitlines()
            assert lines[0] == "t,stage,epp_queued,running,waiting,kv_usage"
            rows = [line.split(",") for line in lines[1:]]
            times = [float(r[0]) for r in rows]
            assert times == sorted(times) and all(b - a >= 0.499 for a, b in itertools.pairwise(times))
            assert sorted({int(r[1]) for r in rows}) == list(range(stages)), label
            for r in rows:
                running, waiting, kv = (r[3].split(), r[4].split(), [float(v) for v in r[5].split()])
                assert len(running) == len(waiting) == len(kv) == pods
                assert all(0.0 <= v <= 1.0 for v in kv)
            queued = [r[2] for r in rows]
            if label != "llm-epp + kv-headroom flow control":
                assert set(queued) == {""}  # nothing is held without flow control
            else:
                assert all(q.isdigit() for q in queued)
            assert any(int(n) > 0 for r in rows for n in r[3].split())  # the pods did run requests


def test_quality_refuses_a_negative_timeline(tmp_path: Path) -> None:
    out = _run("benchmarks.quality", "--smoke", "--timeline", "-1", "--output", str(tmp_path), returncode=2)
    assert "--timeline" in out.stderr


def test_scale_smoke_writes_scheduler_and_scrape_cost_tables(tmp_path: Path) -> None:
    _run("benchmarks.scale", "--smoke", "--seed", "3", "--output", str(tmp_path))
    scheduler = (tmp_path / "scheduler_cost.md").read_text()
    assert "seed 3" in scheduler
    cells = [row for row in scheduler.splitlines() if re.match(r"^\| (8|64) \| (1k|8k) \|", row)]
    assert len(cells) == 4
    for row in cells:
        numbers = [c.strip().replace(",", "") for c in row.strip("|").split("|")]
        assert all(re.fullmatch(r"[\d.]+k?", n) for n in numbers), row
    scrape = (tmp_path / "scrape_cost.md").read_text()
    rows = [r for r in scrape.splitlines() if re.match(r"^\| (50|200) ms \| 5 \|", r)]
    assert [r.split("|")[3].strip() for r in rows] == ["full", "filtered"] * 2
    assert all(r.split("|")[5].strip() == "0" for r in rows), "scrape failures in the smoke run"
    assert all(r.split("|")[6].strip() == ("5/5" if "filtered" in r else "0/5") for r in rows), "pages not filtered"


def test_calibrate_quick_compares_round_robin_with_the_published_baseline(tmp_path: Path) -> None:
    report_file = tmp_path / "calibration.md"
    _run("benchmarks.calibrate", "--quick", "--output", str(report_file), timeout=180)
    report = report_file.read_text()
    assert re.search(r"Calibration (PASSES|FAILS)", report)
    for figure in ("req/s", "TTFT mean (s)", "ITL mean (ms)"):
        assert len(_table_rows(report, figure)) == 2, figure  # round-robin, then llm-epp's prediction
    assert "Predicted headline" in report


def test_director_cost_smoke_writes_both_stores_for_each_size(tmp_path: Path) -> None:
    report_file = tmp_path / "director_cost.md"
    out = _run("benchmarks.director_cost", "--smoke", "--seed", "5", "--output", str(report_file))
    assert "seed 5" in out.stderr
    report = report_file.read_text()
    cells = [row for row in report.splitlines() if re.match(r"^\| (8|64) \| (kept|rebuilt) \|", row)]
    assert [c.split("|")[1:3] for c in cells] == [
        [" 8 ", " kept "],
        [" 8 ", " rebuilt "],
        [" 64 ", " kept "],
        [" 64 ", " rebuilt "],
    ]
    for row in cells:
        numbers = [c.strip().replace(",", "") for c in row.strip("|").split("|")[2:]]
        assert all(re.fullmatch(r"[\d.]+", n) for n in numbers), row
        assert int(numbers[0]) == 40  # every timed request was measured
    summary = [r for r in report.splitlines() if re.match(r"^\| (8|64) \| [\d,]+ \| [\d,]+ \| [+-]\d+% \|$", r)]
    assert len(summary) == 2


def test_pd_smoke_compares_the_three_modes_and_sweeps_the_bandwidth(tmp_path: Path) -> None:
    out = _run("benchmarks.pd", "--smoke", "--seed", "4", "--output", str(tmp_path))
    assert "seed=4" in out.stderr
    data = json.loads((tmp_path / "pd_smoke.json").read_text())
    assert data["setup"]["seed"] == 4
    lengths, bandwidths = data["lengths"], data["bandwidths"]
    modes = ["aggregated", "always-disagg", "prefix-based"]
    assert [(r["mode"], r["input_len"]) for r in lengths] == [(m, n) for n in (100, 400) for m in modes]
    for row in lengths + bandwidths + data["loads"]:
        assert row["failures"] == 0 and row["requests"] > 0 and row["req_per_s"] > 0
        assert row["ttft_p50"] <= row["ttft_p90"] and row["itl_p50"] <= row["itl_p90"]
        assert sum(row["pods_used"]) == row["requests"]
    for row in lengths:
        if row["mode"] == "aggregated":
            assert row["split"] == 0 and row["kv_gb"] == 0
        if row["mode"] == "always-disagg":
            assert row["split"] == 1 and row["kv_gb"] > 0
            assert row["pods_used"][:2] == [0, 0]  # every request decoded on a decode pod
    assert [r["bandwidth_gbps"] for r in bandwidths] == [0.1, 10.0]
    assert [(r["mode"], r["rate"]) for r in data["loads"]] == [("aggregated", 8.0), ("always-disagg", 8.0)]
    report = (tmp_path / "pd_smoke.md").read_text()
    assert len(_table_rows(report, "always-disagg")) == 2 + 1 + 2
    assert len(_table_rows(report, "aggregated")) == 2 + 1


def test_slo_smoke_writes_a_row_per_configuration(tmp_path: Path) -> None:
    from benchmarks.slo import CONFIGS

    out = tmp_path / "slo.md"
    _run("benchmarks.slo", "--smoke", "--seeds", "3", "--output", str(out))
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["seeds"] == [3] and [r["config"] for r in data["runs"]] == list(CONFIGS)
    for run in data["runs"]:
        assert run["interactive"] > 0 and run["batch"] > 0
        assert 0 <= run["met"] <= run["interactive"] and 0 <= run["batch_done"] <= run["batch"]
        assert run["goodput"] >= 0 and run["span"] > 0
    report = out.read_text()
    for config in CONFIGS:
        assert len(_table_rows(report, config)) == 1, config


def test_slo_runs_in_virtual_time_repeat_exactly(tmp_path: Path) -> None:
    """The online latency predictor refits on the virtual clock, so the same run twice gives the same
    numbers (only the wall time differs). Full profile for 15 simulated seconds: long enough for a dozen
    refits to steer requests."""
    runs = []
    for i in (1, 2):
        out = tmp_path / f"run{i}" / "slo.md"
        _run(
            "benchmarks.slo", "--seeds", "1", "--duration", "15", "--configs", "predicted-latency-scorer",
            "--output", str(out),
        )  # fmt: skip
        rows = json.loads(out.with_suffix(".json").read_text())["runs"]
        runs.append([{k: v for k, v in row.items() if k != "wall"} for row in rows])
    assert runs[0] == runs[1]
    assert runs[0][0]["interactive"] > 100 and runs[0][0]["met"] > 0
