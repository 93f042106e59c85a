"""`benchmarks.memory` at a tiny size: a main run and one variant, each with its summary row and samples."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_memory_smoke_reports_every_run_and_its_samples(tmp_path: Path) -> None:
    report = tmp_path / "memory.md"
    args = ["--requests", "300", "--sample", "100", "--warmup", "0", "--variant-requests", "200"]
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.memory", *args, "--variants", "nofreeze", "--output", str(report)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = report.read_text()
    summary = [line for line in text.splitlines() if line.startswith(("| default |", "| nofreeze |"))]
    assert [line.split("|")[3].strip() for line in summary] == ["300", "200"]
    assert "| default | `-` | 300 |" in text and "| nofreeze | `no gc.freeze()` | 200 |" in text
    samples = [line for line in text.splitlines() if line.startswith(("| 100 |", "| 200 |", "| 300 |"))]
    assert len(samples) == 4  # 100, 200, 300 of the main run; the variant's last (tables list every fifth sample)
    index = [int(line.split("|")[7].replace(",", "")) for line in samples]
    assert all(n > 0 for n in index)  # the prefix index saw the requests


def test_the_grpc_run_can_answer_with_event_streams_or_lengths() -> None:
    import random

    from benchmarks.memory import _messages

    def response_headers(**kind: bool) -> dict[str, str]:
        msg = _messages(0, ["system"], random.Random(1), **kind)[-1]
        return {h.key: h.raw_value.decode() for h in msg.response_headers.headers.headers}

    assert response_headers(event_stream=True)["content-type"] == "text/event-stream"
    assert "content-length" not in response_headers(event_stream=True)
    assert response_headers(sized=True)["content-length"] == "120"
    assert response_headers()["content-type"] == "application/json"
