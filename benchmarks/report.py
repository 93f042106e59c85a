"""What every benchmark report starts with: the command that produced it and the machine and commit it ran on."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["ROOT", "Outcome", "command_line", "emit", "keeping_partial_results", "machine", "output_path"]


def output_path(given: str | Path | None, default: Path, smoke: bool) -> Path:
    """Where a benchmark writes its report: `given` (its --output) when set; else `default` (the committed
    results), except for a --smoke run, whose report goes to a fresh temporary directory (under the same
    file name when `default` names a file) so that a smoke run never overwrites committed results."""
    if given is not None:
        return Path(given)
    if not smoke:
        return default
    tmp = Path(tempfile.mkdtemp(prefix="llm-epp-smoke-"))
    out = tmp / default.name if default.suffix else tmp
    print(f"smoke run without --output: report in {out}", file=sys.stderr)
    return out


def machine() -> str:
    """Commit (and whether the tree had uncommitted changes), CPUs, Python, and the load average at start."""
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    return (
        f"commit {commit or 'unknown'}{' (with uncommitted changes)' if dirty else ''}; "
        f"{os.cpu_count()} CPUs ({cpu}); Python {platform.python_version()} ({platform.machine()}); "
        f"load average {os.getloadavg()[0]:.1f} at start"
    )


def _portable(arg: str) -> str:
    """An argument as it may appear in a committed report: paths inside the repository relative to it, other
    absolute paths reduced to their last component."""
    if not arg.startswith("/"):
        return arg
    path = Path(arg)
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return f".../{path.name}"


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """``python -m <module> <args>`` for the report, without this machine's paths."""
    args = list(argv) if argv is not None else sys.argv[1:]
    return " ".join(["python -m", module, *(_portable(a) for a in args)])


@dataclass
class Outcome:
    """The exit status of a benchmark's measurements: 0, 130 (interrupted) or 1 (failed)."""

    status: int = 0


@contextmanager
def keeping_partial_results(out: list[str]) -> Iterator[Outcome]:
    """Runs the measurements; an interrupt or a failure ends them with a line in the report and the matching
    exit status, and what was measured before it is still reported."""
    outcome = Outcome()
    try:
        yield outcome
    except KeyboardInterrupt:
        out.append("(interrupted: partial results)\n")
        outcome.status = 130
    except Exception as e:
        out.append(f"(failed: {e!r}; partial results)\n")
        outcome.status = 1


def emit(out: list[str], output: str | Path | None) -> None:
    """Prints the report and, with `output` (the benchmark's --output), writes it there too."""
    report = "\n".join(out)
    print(report)
    if output:
        Path(output).write_text(report + "\n")
