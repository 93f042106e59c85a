"""`benchmarks.request_cost` at a tiny size, beside a copy of this checkout's code imported as the baseline."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.support.benchmark import ROOT, run_benchmark


def request_cost(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run_benchmark("request_cost", *args, timeout=timeout)


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


def test_request_cost_beside_the_trivial_picker_after_idle_gaps() -> None:
    args = ("--blocks", "2", "--block", "5", "--warmup", "1", "--idle-gap", "1", "--beside-trivial", "--tracing", "off")
    out = request_cost(*args)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = out.stderr
    assert "1 ms idle before each request" in report
    assert "trivial: the trivial picker's handler (benchmarks/trivial_picker.py)" in report
    rows = [r for r in report.splitlines() if re.match(r"^\| (new|trivial) \| [\d.]+ \| [\d.]+ \| [\d.]+ \|$", r)]
    assert [r.split("|")[1].strip() for r in rows] == ["new", "trivial"]
    assert re.search(r"new / trivial: [\d.]+, [\d.]+, [\d.]+ \(min, q1, median\)", report)
    refused = request_cost("--idle-gap", "-1", timeout=60)
    assert refused.returncode == 2 and "--idle-gap: give a time in milliseconds" in refused.stderr
    spun = request_cost(*args, "--gap", "spin")
    assert spun.returncode == 0, spun.stdout[-3000:] + spun.stderr[-3000:]
    assert "1 ms spinning before each request" in spun.stderr
    refused = request_cost("--gap", "spin", timeout=60)
    assert refused.returncode == 2 and "--gap spin: give the length of the gap with --idle-gap MS" in refused.stderr


def _recording_version(events: list[str]) -> Any:
    """A stand-in for one measured version: it reads a request, notes it in ``events`` and answers twice."""

    class Version:
        label, blocks = "v", []

        @staticmethod
        async def process(_requests: Any, stream: Any) -> None:
            while (await stream.read()) is not None:
                pass
            events.append("request")
            await stream.write(b"a")
            await stream.write(b"b")

        @staticmethod
        def flush() -> None:
            pass

    return Version()


def test_each_request_of_a_block_follows_its_idle_gap(monkeypatch: Any) -> None:
    from benchmarks import request_cost as rc

    events: list[str] = []

    async def sleep(seconds: float) -> None:
        events.append(f"sleep {seconds}")

    monkeypatch.setattr(rc.asyncio, "sleep", sleep)
    per_request = asyncio.run(rc._block(_recording_version(events), [["m1"], ["m2"], ["m3"]], None, None, 0.004))
    assert events == ["sleep 0.004", "request"] * 3
    assert per_request >= 0


def test_a_spun_gap_keeps_the_process_busy_instead_of_sleeping(monkeypatch: Any) -> None:
    from benchmarks import request_cost as rc

    events: list[str] = []

    async def sleep(seconds: float) -> None:
        events.append(f"sleep {seconds}")

    monkeypatch.setattr(rc.asyncio, "sleep", sleep)
    monkeypatch.setattr(rc, "_spin", lambda seconds: events.append(f"spin {seconds}"))

    asyncio.run(rc._block(_recording_version(events), [["m1"], ["m2"]], None, None, 0.004, spin=True))
    assert events == ["spin 0.004", "request"] * 2  # never the event loop's sleep
