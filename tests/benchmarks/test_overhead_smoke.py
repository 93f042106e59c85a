"""`python -m benchmarks.overhead --smoke`: the open-loop EPP-overhead protocol end to end on a tiny budget (real
Envoys, a real EPP, the Python load generator).  Checks that the report is well-formed, never the figures."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
NUM = r"[+-]?\d+(?:\.\d+)?"

pytestmark = pytest.mark.envoy


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_overhead_smoke_writes_a_well_formed_report(tmp_path: Path) -> None:
    report = tmp_path / "overhead.md"
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.overhead", "--smoke", "--output", str(report)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = report.read_text()
    assert "(interrupted" not in text
    assert "seed=" in text and "commit " in text

    # fixed rates: three targets (sglang-router only with --peers) at each of the two smoke rates
    rows = [_cells(line) for line in text.splitlines() if re.match(r"^\| (100|300) \| ", line)]
    rate_rows = [r for r in rows if len(r) == 12]
    targets = {r[1] for r in rate_rows}
    assert {"direct to a backend (floor)", "Envoy ROUND_ROBIN (no EPP)", "Envoy + llm-epp (default)"} <= targets
    assert {int(r[0]) for r in rate_rows} == {100, 300}
    for r in rate_rows:
        assert all(re.fullmatch(NUM, x) for x in r[2:7]), r  # achieved, ok, failed, p50, p99
        assert re.fullmatch(rf"{NUM} / {NUM}( \(\d+ queued\))?", r[11]), r  # generator lag
        if r[1] == "Envoy + llm-epp (default)":
            assert re.fullmatch(rf"{NUM} / {NUM}", r[7]) and re.fullmatch(rf"{NUM} / {NUM}", r[8]), r
            assert re.fullmatch(NUM, r[9]) and re.fullmatch(NUM, r[10]), r  # EPP, gateway CPU s per 1k requests

    # the rate search: at least one step, and a conclusion
    search = [_cells(line) for line in text.splitlines() if re.match(r"^\| (100|200) \| ", line)]
    assert any(len(r) == 7 and re.match(r"pass|FAIL", r[6]) for r in search)
    assert re.search(r"Highest passing rate: (\*\*\d+ req/s\*\*|none of the steps)", text)

    # resident memory: samples every 10% of the requests, and the growth line
    rss = re.findall(rf"^\| (\d+) \| ({NUM}) \| (\d+) \| (-|\d+) \|$", text, re.M)
    assert [int(n) for n, _, _, _ in rss] == list(range(0, 1001, 100))
    assert all(float(mib) > 0 for _, mib, _, _ in rss)
    assert re.search(rf"Growth from 200 to 1000 requests: {NUM} MiB", text)


def test_picker_smoke_compares_llm_epp_with_the_trivial_picker(tmp_path: Path) -> None:
    report = tmp_path / "picker.md"
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.overhead", "--smoke", "--part", "picker", "--output", str(report)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = report.read_text()
    assert "(interrupted" not in text and "(failed" not in text
    rows = [_cells(line) for line in text.splitlines() if re.match(r"^\| 100 \| ", line)]
    by_target = {r[1]: r for r in rows if len(r) == 9}
    assert set(by_target) == {
        "Envoy ROUND_ROBIN (no EPP)",
        "Envoy + trivial picker",
        "Envoy + trivial picker on llm-epp's asyncio server",
        "Envoy + llm-epp (default, plaintext)",
    }
    for name, r in by_target.items():
        assert all(re.fullmatch(NUM, x) for x in r[2:6]), r  # achieved, failed, p50, p99
        assert r[3] == "0", r  # nothing failed through either picker
        if name != "Envoy ROUND_ROBIN (no EPP)":
            assert re.fullmatch(rf"{NUM} / {NUM}", r[6]) and re.fullmatch(NUM, r[7]), r
    if "Closed loop (wrk" in text:  # wrk installed: the CPU and throughput ratio line
        assert re.search(rf"CPU per request {NUM}x, throughput {NUM}x", text)
        assert re.search(rf"CPU per request round by round \(.*\): {NUM}x\.", text)  # --smoke: one round
        assert re.search(
            rf"transport's floor .*: CPU per request {NUM}x \(round by round {NUM}x\), throughput {NUM}x", text
        )


def test_the_stand_in_backends_label_their_answers_with_the_content_type_asked_for() -> None:
    from benchmarks.overhead import direct_response_backends

    def completion_headers(config: dict[str, Any]) -> list[list[dict[str, Any]]]:
        hcms = [ls["filter_chains"][0]["filters"][0]["typed_config"] for ls in config["static_resources"]["listeners"]]
        return [r["response_headers_to_add"] for h in hcms for r in h["route_config"]["virtual_hosts"][0]["routes"]
                if r["match"] == {"prefix": "/"}]  # fmt: skip

    sse = completion_headers(direct_response_backends(2, "text/event-stream"))
    assert sse == [[{"header": {"key": "content-type", "value": "text/event-stream"}}]] * 2
    assert completion_headers(direct_response_backends(1))[0][0]["header"]["value"] == "application/json"
