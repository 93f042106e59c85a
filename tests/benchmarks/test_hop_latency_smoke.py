"""`benchmarks.hop_latency` at a tiny size: every target answers through Envoy and gets a row."""

from __future__ import annotations

import re
import subprocess

from benchmarks.hop_latency import FLOOR, RR, TRIVIAL, VARIANTS
from tests.support.benchmark import run_benchmark

# | target | failed | p50 | p90 | p99 | added p50 / p99 | picker CPU |
ROW = re.compile(r"^\| (.+?) \| (\d+) \| ([\d.]+) \| [\d.]+ \| [\d.]+ \| (\S+ / \S+|-) \| ([\d.]+|-) \|$")


def hop_latency(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run_benchmark("hop_latency", *args, timeout=timeout)


def test_every_processing_mode_and_picker_gets_a_row_with_no_failure() -> None:
    out = hop_latency("--rate", "20", "--duration", "0.5", "--rounds", "1", "--warmup", "5")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = {m.group(1): m.groups()[1:] for line in out.stdout.splitlines() if (m := ROW.match(line))}
    expected = {RR} | {f"{p}, request body {b}, response headers {r}" for p, b, r in VARIANTS}
    assert set(rows) == expected
    warmed = re.findall(r"^  warm-up: (.+): (\d+) ok, (\d+) failed$", out.stderr, re.M)
    assert sorted(warmed) == sorted((name, "5", "0") for name in expected)  # --warmup 5: five answered each
    assert {TRIVIAL, FLOOR, "llm-epp"} == {p for p, _, _ in VARIANTS}
    for name, (failed, p50, added, cpu) in rows.items():
        assert failed == "0", name
        assert float(p50) > 0
        if name == RR:
            assert (added, cpu) == ("-", "-")
        else:  # a picker's process is measured (in clock ticks: a tiny run may spend less than one)
            assert re.match(r"^[+-][\d.]+ / [+-][\d.]+$", added) and float(cpu) >= 0, name


def test_nonsense_sizes_are_refused_before_anything_starts() -> None:
    out = hop_latency("--rate", "0", timeout=60)
    assert out.returncode == 2 and "--rate and --duration must be above 0" in out.stderr
