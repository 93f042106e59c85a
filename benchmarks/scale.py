"""Scheduler and data-layer cost as the pool grows: ``make bench-scale``.

Runs, one after the other, :mod:`benchmarks.scheduler_cost` (``schedule()`` time for 8 / 64 / 256 / 1024
endpoints x 1k / 8k / 32k / 128k-token prompts, prefix-index memory after 1M requests) and
:mod:`benchmarks.scrape_cost` (CPU per endpoint to fetch and parse a real-sized vLLM ``/metrics`` page,
endpoints one core keeps fresh at 50 ms and 200 ms), and writes ``scheduler_cost.md`` and
``scrape_cost.md`` to ``--output``.  Routing quality at 32 and 128 pods is in ``make bench-quality``.

    python -m benchmarks.scale            # ~10 min on an idle 2-core machine
    python -m benchmarks.scale --quick    # ~2 min
    python -m benchmarks.scale --smoke    # seconds (for the test suite)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks import scheduler_cost, scrape_cost
from benchmarks.report import output_path

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="shorter runs (~2 min)")
    size.add_argument("--smoke", action="store_true", help="tiny runs (seconds)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument(
        "--output", help="directory for the reports (default benchmarks/results; with --smoke a temporary directory)"
    )
    args = p.parse_args(argv)
    out = output_path(args.output, RESULTS, args.smoke)
    out.mkdir(parents=True, exist_ok=True)
    mode = ["--smoke"] if args.smoke else ["--quick"] if args.quick else []
    print(f"[scale] scheduler cost {' '.join(mode)} (seed {args.seed})", file=sys.stderr, flush=True)
    rc = scheduler_cost.main([*mode, "--seed", str(args.seed), "--output", str(out / "scheduler_cost.md")])
    print(f"[scale] scrape cost {' '.join(mode)}", file=sys.stderr, flush=True)
    rc |= scrape_cost.main([*mode, "--output", str(out / "scrape_cost.md")])
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
