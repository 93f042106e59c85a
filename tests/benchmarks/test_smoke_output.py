"""A --smoke run given no --output writes its report to a temporary directory, never over the committed
results in benchmarks/results."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.report import output_path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def test_an_explicit_output_is_kept_in_every_mode(tmp_path: Path) -> None:
    for smoke in (False, True):
        assert output_path(tmp_path / "x.md", RESULTS / "x.md", smoke) == tmp_path / "x.md"
        assert output_path(str(tmp_path), RESULTS, smoke) == tmp_path


def test_a_full_run_defaults_to_the_committed_results() -> None:
    assert output_path(None, RESULTS / "overload.md", smoke=False) == RESULTS / "overload.md"
    assert output_path(None, RESULTS, smoke=False) == RESULTS


@pytest.mark.parametrize("default", [RESULTS / "slo.md", RESULTS])
def test_a_smoke_run_defaults_to_a_fresh_temporary_place(default: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = output_path(None, default, smoke=True)
    second = output_path(None, default, smoke=True)
    assert first != second
    assert RESULTS not in first.parents and first != RESULTS
    if default.suffix:  # a report file keeps its name, in an empty directory of its own
        assert first.name == default.name and first.parent.is_dir() and not any(first.parent.iterdir())
    else:
        assert first.is_dir() and not any(first.iterdir())
    assert str(first) in capsys.readouterr().err


def test_overload_smoke_without_output_leaves_the_committed_report_alone() -> None:
    committed = RESULTS / "overload.md"
    before = committed.read_bytes()
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.overload", "--smoke", "--factors", "1.5", "--routers", "round-robin"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert committed.read_bytes() == before
    written = re.search(r"report in (\S+)", out.stderr)
    assert written is not None, out.stderr[-2000:]
    report = Path(written.group(1))
    assert report.name == "overload.md" and "| 1.5x | round-robin |" in report.read_text()
