"""CPU cost of keeping model-server metrics fresh: fetch + parse + extract of a realistic vLLM page.

A child process serves the ~100 KB vLLM page of tests/unit/datalayer/testdata (3 models, 14 vLLM
histograms, HTTP middleware histograms, process collectors) on N loopback ports, one per endpoint. This
process runs the real `MetricsRuntime` (its own HTTP/1.1 client, selective parser, core-metrics-extractor)
against the N endpoints at each interval and measures its own CPU with `time.process_time()` (the
server's CPU is not counted). From the CPU per poll it derives how many endpoints one core keeps fresh
at that interval. A micro-benchmark splits a poll into parse+extract and the HTTP fetch.

    python -m benchmarks.scrape_cost [--quick] [--endpoints 10,50,100] [--intervals 0.05,0.2]
                                     [--duration 8] [--loop uvloop|asyncio] [--output FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from benchmarks.report import command_line, machine

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "tests" / "unit" / "datalayer" / "testdata" / "vllm.txt"


# --- the model-server stand-in (child process) ----------------------------------------------------------
class _PageProtocol(asyncio.Protocol):
    """Answers every request on a keep-alive connection with the same prebuilt response."""

    def __init__(self, response: bytes) -> None:
        self._response = response
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio classes

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while (end := self._buffer.find(b"\r\n\r\n")) >= 0:
            self._buffer = self._buffer[end + 4 :]
            assert self._transport is not None
            self._transport.write(self._response)


async def _serve(n: int) -> None:
    body = PAGE.read_bytes()
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    response = head.encode() + body
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(lambda: _PageProtocol(response), "127.0.0.1", 0) for _ in range(n)]
    print(json.dumps([s.sockets[0].getsockname()[1] for s in servers]), flush=True)
    await asyncio.Event().wait()


# --- measurement ------------------------------------------------------------------------------------------
@dataclass
class Result:
    interval: float
    endpoints: int
    wall: float
    cpu: float
    polls: int
    failures: int

    @property
    def cpu_per_poll(self) -> float:
        return self.cpu / max(self.polls, 1)

    @property
    def target_polls(self) -> float:
        return self.endpoints * self.wall / self.interval

    @property
    def endpoints_per_core(self) -> float:
        return self.interval / self.cpu_per_poll


async def _measure(ports: list[int], interval: float, warmup: float, duration: float) -> Result:
    from llm_epp.datalayer.datastore import Datastore
    from llm_epp.datalayer.runtime import MetricsRuntime
    from llm_epp.framework.types import EndpointKey, EndpointMetadata
    from llm_epp.plugins.datalayer.core_metrics_extractor import CoreMetricsExtractor
    from llm_epp.plugins.datalayer.metrics_data_source import MetricsDataSource

    ds = Datastore("bench")
    ds.replace_all(EndpointMetadata(EndpointKey("bench", f"ep-{p}"), "127.0.0.1", p) for p in ports)
    runtime = MetricsRuntime(ds, MetricsDataSource(), CoreMetricsExtractor(), interval=interval)
    task = asyncio.create_task(runtime.run())
    await asyncio.sleep(warmup)
    polls0, failures0 = runtime.polls, runtime.failures
    cpu0, wall0 = time.process_time(), time.monotonic()
    await asyncio.sleep(duration)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    polls, failures = runtime.polls - polls0, runtime.failures - failures0
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    stale = sum(runtime.is_stale(e.key) for e in ds.snapshot())
    if stale:
        print(f"  warning: {stale} endpoints stale at the end", file=sys.stderr)
    return Result(interval, len(ports), wall, cpu, polls, failures)


def _micro(repeat: int, fresh_labels: bool = False) -> float:
    """CPU seconds per parse + extract of the page (best of 5 rounds). `fresh_labels`: the parser's memory of
    label sets is emptied before every parse, so each label set is parsed again as if never seen."""
    from llm_epp.datalayer import exposition
    from llm_epp.datalayer.exposition import parse
    from llm_epp.framework.types import EMPTY_METRICS, EndpointKey, EndpointMetadata
    from llm_epp.plugins.datalayer.core_metrics_extractor import CoreMetricsExtractor

    body = PAGE.read_bytes()
    extractor = CoreMetricsExtractor()
    md = EndpointMetadata(EndpointKey("", "x"), "127.0.0.1", 1)
    families = extractor.families(md)
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(repeat):
            if fresh_labels:
                exposition._label_set.cache_clear()
            extractor.extract(parse(body, families), md, EMPTY_METRICS, 1.0)
        best = min(best, (time.process_time() - t0) / repeat)
    return best


async def _fetch_cost(port: int, repeat: int) -> float:
    """CPU seconds per keep-alive fetch of the page from one loopback endpoint."""
    from llm_epp.datalayer.scrape import Scraper

    scraper = Scraper()
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        for _ in range(20):
            await scraper.fetch(url)
        t0 = time.process_time()
        for _ in range(repeat):
            await scraper.fetch(url)
        return (time.process_time() - t0) / repeat
    finally:
        await scraper.aclose()


async def _fetch_cost_aiohttp(port: int, repeat: int) -> float:
    """The same keep-alive fetch through aiohttp (one session, one kept-alive connection, body read whole)."""
    import aiohttp

    url = f"http://127.0.0.1:{port}/metrics"
    connector = aiohttp.TCPConnector(limit=1, enable_cleanup_closed=False)
    timeout = aiohttp.ClientTimeout(total=1.0)
    headers = {"Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1"}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:

        async def one() -> bytes:
            async with session.get(url) as r:
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}")
                return await r.read()

        for _ in range(20):
            await one()
        t0 = time.process_time()
        for _ in range(repeat):
            await one()
        return (time.process_time() - t0) / repeat


async def _fetch_costs(port: int, repeat: int, blocks: int) -> tuple[list[float], list[float]]:
    """The hand-written client and aiohttp in alternating blocks (CPU seconds per fetch, one per block)."""
    own: list[float] = []
    lib: list[float] = []
    for _ in range(blocks):
        own.append(await _fetch_cost(port, repeat))
        lib.append(await _fetch_cost_aiohttp(port, repeat))
    return own, lib


def _run(loop_name: str, coro_factory: Callable[[], Any]) -> Any:
    if loop_name == "uvloop":
        import uvloop

        return uvloop.run(coro_factory())
    return asyncio.run(coro_factory())


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e6:.0f} ({min(values) * 1e6:.0f}-{max(values) * 1e6:.0f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one endpoint count, short runs (under a minute)")
    p.add_argument("--smoke", action="store_true", help="five endpoints, one-second runs (for tests)")
    p.add_argument("--endpoints", default="10,50,100", help="comma list of endpoint counts (default 10,50,100)")
    p.add_argument("--intervals", default="0.05,0.2", help="comma list of poll intervals in seconds")
    p.add_argument("--duration", type=float, default=8.0, help="measured seconds per run (default 8)")
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop", help="event loop (default uvloop)")
    p.add_argument("--output", help="also write the Markdown report here")
    p.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # child: serve the page on N ports
    args = p.parse_args(argv)
    if args.serve:
        _run(args.loop, lambda: _serve(args.serve))
        return 0
    counts = [5] if args.smoke else [20] if args.quick else [int(x) for x in args.endpoints.split(",")]
    intervals = [float(x) for x in args.intervals.split(",")]
    duration, warmup = (1.0, 0.3) if args.smoke else (4.0, 1.0) if args.quick else (args.duration, 2.0)

    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.scrape_cost", "--serve", str(max(counts)), "--loop", args.loop],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        ports: list[int] = json.loads(child.stdout.readline())
        short = args.quick or args.smoke
        repeat = 50 if args.smoke else 200 if short else 1000
        parse_cost, parse_fresh = _micro(repeat), _micro(repeat, fresh_labels=True)
        own, lib = _run(
            args.loop, lambda: _fetch_costs(ports[0], 50 if args.smoke else 300 if short else 1000, 1 if short else 5)
        )
        fetch_cost = statistics.median(own)
        results: list[Result] = []
        for interval in intervals:
            for n in counts:
                print(f"  {n} endpoints every {interval * 1000:.0f} ms ...", file=sys.stderr)
                results.append(_run(args.loop, functools.partial(_measure, ports[:n], interval, warmup, duration)))
    finally:
        child.terminate()
        child.wait()

    cmd = command_line("benchmarks.scrape_cost", argv)
    out = [
        "## Metrics scrape cost (EPP side)",
        "",
        f"`{cmd.strip()}`; {machine()}; loop {args.loop}; page {PAGE.stat().st_size // 1024} KB "
        f"(vLLM, 3 models with histograms); {duration:g} s per run.",
        "",
        f"Per poll, one endpoint: parse + extract {parse_cost * 1e6:.0f} µs CPU; HTTP fetch (keep-alive) "
        f"{fetch_cost * 1e6:.0f} µs CPU. Parse + extract with every label set parsed afresh (the parser's memory "
        f"of label sets emptied before each parse, as before it had one): {parse_fresh * 1e6:.0f} µs "
        f"({parse_fresh / parse_cost:.2f}x).",
        "",
        "HTTP fetch of the page, keep-alive, CPU per fetch, the two clients in alternating blocks "
        f"({len(own)} blocks): the scraper's own client (`llm_epp.datalayer.http_client`) "
        f"{_spread(own)} µs; aiohttp {_spread(lib)} µs (median / min-max); aiohttp / own "
        f"{statistics.median(lib) / statistics.median(own):.2f}x.",
        "",
        "| interval | endpoints | polls/s (target) | failures | EPP CPU (% of a core) | CPU per poll | "
        "CPU per endpoint-second at this interval | endpoints one core keeps fresh |",
        "|---|---|---|---|---|---|---|---|",
    ]
    # Rows where polls/s fell short of the target were CPU-bound (the loopback servers share the machine);
    # their CPU per poll is still a valid cost, the derived columns assume polls at the full interval.
    for r in results:
        out.append(
            f"| {r.interval * 1000:.0f} ms | {r.endpoints} | {r.polls / r.wall:.0f} ({r.target_polls / r.wall:.0f}) | "
            f"{r.failures} | {100 * r.cpu / r.wall:.0f}% | {r.cpu_per_poll * 1e6:.0f} µs | "
            f"{1000 * r.cpu_per_poll / r.interval:.1f} ms | {r.endpoints_per_core:.0f} |"
        )
    for interval in intervals:
        rows = [r for r in results if r.interval == interval]
        worst = max(rows, key=lambda r: r.cpu_per_poll)
        out.append("")
        out.append(
            f"At {interval * 1000:.0f} ms one core keeps about **{worst.endpoints_per_core:.0f} endpoints** fresh "
            f"(from the costliest CPU per poll measured at this interval, {worst.cpu_per_poll * 1e6:.0f} µs)."
        )
    report = "\n".join(out)
    print(report)
    if args.output:
        Path(args.output).write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
