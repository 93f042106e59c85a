"""A benchmark that is interrupted or fails mid-run still reports what it measured, says why it stopped,
and exits with the matching status (`benchmarks.report.keeping_partial_results`, `emit`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.report import emit, keeping_partial_results


@pytest.mark.parametrize(
    ("error", "status", "line"),
    [
        (None, 0, None),
        (KeyboardInterrupt(), 130, "(interrupted: partial results)\n"),
        (RuntimeError("port refused"), 1, "(failed: RuntimeError('port refused'); partial results)\n"),
    ],
)
def test_the_measured_part_is_kept_and_the_reason_reported(
    error: BaseException | None, status: int, line: str | None
) -> None:
    out = ["# report"]
    measured = []
    with keeping_partial_results(out) as outcome:
        measured.append("round 1")
        if error is not None:
            raise error
        measured.append("round 2")
    assert outcome.status == status
    assert measured == (["round 1", "round 2"] if error is None else ["round 1"])
    assert out == (["# report"] if line is None else ["# report", line])


def test_emit_prints_the_report_and_writes_it_when_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    emit(["a", "b"], None)
    assert capsys.readouterr().out == "a\nb\n"
    emit(["a", "b"], tmp_path / "r.md")
    assert (tmp_path / "r.md").read_text() == "a\nb\n"
