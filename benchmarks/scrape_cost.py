"""CPU cost of keeping model-server metrics fresh: fetch + parse + extract of a realistic vLLM page, asking for
the full page and for only the samples the extractor reads (`name[]`, `--metrics-name-filter`) side by side.

A child process serves the ~100 KB vLLM page of tests/unit/datalayer/testdata (3 models, 14 vLLM
histograms, HTTP middleware histograms, process collectors) on N loopback ports, one per endpoint, and
answers `name[]` as prometheus_client does (the simulator's page filter, `llm_epp.sim.metric_names`,
checked against prometheus_client's restricted registry in the tests); answers are prebuilt per request
target, so the server's work is the same for both. This process runs the real `MetricsRuntime` (its own
HTTP/1.1 client, selective parser, core-metrics-extractor) against the N endpoints at each interval, once
with the filter off (full pages) and once on (filtered pages), alternating, and measures its own CPU with
`time.process_time()` (the server's CPU is not counted). From the CPU per poll it derives how many
endpoints one core keeps fresh at that interval. A micro-benchmark splits a poll into parse+extract and
the HTTP fetch, for both pages.

    python -m benchmarks.scrape_cost [--quick] [--endpoints 10,50,100] [--intervals 0.05,0.2] [--rounds 2]
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
def _response(body: bytes) -> bytes:
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class _Pages:
    """The prebuilt answer per request target: the full page, or the page restricted to `name[]`."""

    def __init__(self) -> None:
        from llm_epp.sim.metric_names import requested_names, restrict

        self._page = PAGE.read_text()
        self._full = _response(self._page.encode())
        self._requested_names = requested_names
        self._restrict = restrict
        self._answers: dict[bytes, bytes] = {}

    def answer(self, target: bytes) -> bytes:
        answer = self._answers.get(target)
        if answer is None:
            names = self._requested_names(target.decode("latin-1"))
            answer = self._full if names is None else _response(self._restrict(self._page, names).encode())
            if len(self._answers) < 64:
                self._answers[target] = answer
        return answer


class _PageProtocol(asyncio.Protocol):
    """Answers each request on a keep-alive connection with the prebuilt answer for its target."""

    def __init__(self, pages: _Pages) -> None:
        self._pages = pages
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio classes

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while (end := self._buffer.find(b"\r\n\r\n")) >= 0:
            request_line = self._buffer[: self._buffer.find(b"\r\n")]
            self._buffer = self._buffer[end + 4 :]
            assert self._transport is not None
            self._transport.write(self._pages.answer(request_line.split(b" ")[1]))


async def _serve(n: int) -> None:
    pages = _Pages()
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(lambda: _PageProtocol(pages), "127.0.0.1", 0) for _ in range(n)]
    print(json.dumps([s.sockets[0].getsockname()[1] for s in servers]), flush=True)
    await asyncio.Event().wait()


# --- measurement ------------------------------------------------------------------------------------------
@dataclass
class Result:
    filtered: bool  # polled with --metrics-name-filter on
    interval: float
    endpoints: int
    wall: float
    cpu: float
    polls: int
    failures: int
    filtering: int  # endpoints polled with filtered pages at the end

    @property
    def cpu_per_poll(self) -> float:
        return self.cpu / max(self.polls, 1)

    @property
    def target_polls(self) -> float:
        return self.endpoints * self.wall / self.interval

    @property
    def endpoints_per_core(self) -> float:
        return self.interval / self.cpu_per_poll


async def _measure(ports: list[int], interval: float, warmup: float, duration: float, filtered: bool) -> Result:
    from llm_epp.datalayer.datastore import Datastore
    from llm_epp.datalayer.runtime import MetricsRuntime
    from llm_epp.framework.types import EndpointKey, EndpointMetadata
    from llm_epp.plugins.datalayer.core_metrics_extractor import CoreMetricsExtractor
    from llm_epp.plugins.datalayer.metrics_data_source import MetricsDataSource

    ds = Datastore("bench")
    ds.replace_all(EndpointMetadata(EndpointKey("bench", f"ep-{p}"), "127.0.0.1", p) for p in ports)
    runtime = MetricsRuntime(ds, MetricsDataSource(), CoreMetricsExtractor(), interval=interval, name_filter=filtered)
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
    states = [runtime.state(e.key) for e in ds.snapshot()]
    filtering = sum(1 for st in states if st is not None and st.name_filter is not None and st.name_filter.filtering)
    return Result(filtered, interval, len(ports), wall, cpu, polls, failures, filtering)


def _filtered_page() -> tuple[str, bytes]:
    """The URL path the runtime asks with `name[]` for a vLLM endpoint, and the page that answers it."""
    from llm_epp.datalayer.name_filter import filtered_url
    from llm_epp.framework.types import EndpointKey, EndpointMetadata
    from llm_epp.plugins.datalayer.core_metrics_extractor import CoreMetricsExtractor
    from llm_epp.sim.metric_names import restrict

    md = EndpointMetadata(EndpointKey("", "x"), "127.0.0.1", 1)
    names = CoreMetricsExtractor().families(md)
    url = filtered_url("http://127.0.0.1:1/metrics", names)
    assert url is not None
    return url.split(":1", 1)[1], restrict(PAGE.read_text(), names).encode()


def _micro(repeat: int, fresh_labels: bool = False, body: bytes | None = None) -> float:
    """CPU seconds per parse + extract of the page (`body`: another page; best of 5 rounds). `fresh_labels`: the
    parser's memory of label sets is emptied before every parse, so each label set is parsed again as if never
    seen."""
    from llm_epp.datalayer import exposition
    from llm_epp.datalayer.exposition import parse
    from llm_epp.framework.types import EMPTY_METRICS, EndpointKey, EndpointMetadata
    from llm_epp.plugins.datalayer.core_metrics_extractor import CoreMetricsExtractor

    body = PAGE.read_bytes() if body is None else body
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


async def _fetch_cost(port: int, repeat: int, path: str = "/metrics") -> float:
    """CPU seconds per keep-alive fetch of `path` from one loopback endpoint."""
    from llm_epp.datalayer.scrape import Scraper

    scraper = Scraper()
    url = f"http://127.0.0.1:{port}{path}"
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
    timeout = aiohttp.ClientTimeout(total=10.0)  # generous: the box may be loaded; CPU is what is measured
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


async def _fetch_costs(
    port: int, repeat: int, blocks: int, filtered_path: str
) -> tuple[list[float], list[float], list[float]]:
    """The hand-written client (full page, filtered page) and aiohttp (full page) in alternating blocks (CPU
    seconds per fetch, one per block)."""
    own: list[float] = []
    lib: list[float] = []
    small: list[float] = []
    for _ in range(blocks):
        own.append(await _fetch_cost(port, repeat))
        small.append(await _fetch_cost(port, repeat, filtered_path))
        lib.append(await _fetch_cost_aiohttp(port, repeat))
    return own, lib, small


def _run(loop_name: str, coro_factory: Callable[[], Any]) -> Any:
    if loop_name == "uvloop":
        import uvloop

        return uvloop.run(coro_factory())
    return asyncio.run(coro_factory())


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e6:.0f} ({min(values) * 1e6:.0f}-{max(values) * 1e6:.0f})"


def _best_result(rows: list[Result]) -> Result:
    """The round with the least CPU per poll (the rounds of one cell, one mode): other work on the machine
    only adds to a round's CPU, so the least is the closest to the cost itself."""
    return min(rows, key=lambda r: r.cpu_per_poll)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one endpoint count, short runs (under a minute)")
    p.add_argument("--smoke", action="store_true", help="five endpoints, one-second runs (for tests)")
    p.add_argument("--endpoints", default="10,50,100", help="comma list of endpoint counts (default 10,50,100)")
    p.add_argument("--intervals", default="0.05,0.2", help="comma list of poll intervals in seconds")
    p.add_argument("--rounds", type=int, default=2, help="full/filtered alternations per cell (default 2)")
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
    rounds = 1 if args.smoke or args.quick else max(1, args.rounds)
    filtered_path, filtered_body = _filtered_page()
    full_body = PAGE.read_bytes()

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
        parse_small = _micro(repeat, body=filtered_body)
        own, lib, small = _run(
            args.loop,
            lambda: _fetch_costs(
                ports[0], 50 if args.smoke else 300 if short else 1000, 1 if short else 5, filtered_path
            ),
        )
        fetch_cost, fetch_small = statistics.median(own), statistics.median(small)
        results: list[Result] = []
        for interval in intervals:
            for n in counts:
                for k in range(rounds):
                    for filtered in (False, True) if k % 2 == 0 else (True, False):
                        mode = "filtered" if filtered else "full"
                        print(f"  {n} endpoints every {interval * 1000:.0f} ms, {mode} pages ...", file=sys.stderr)
                        measure = functools.partial(_measure, ports[:n], interval, warmup, duration, filtered)
                        results.append(_run(args.loop, measure))
    finally:
        child.terminate()
        child.wait()

    cmd = command_line("benchmarks.scrape_cost", argv)
    request_full = len(b"GET /metrics HTTP/1.1\r\n")
    request_small = len(f"GET {filtered_path} HTTP/1.1\r\n".encode())
    out = [
        "## Metrics scrape cost (EPP side), full and filtered pages",
        "",
        f"`{cmd.strip()}`; {machine()}; loop {args.loop}; page {len(full_body) // 1024} KB "
        f"(vLLM, 3 models with histograms); {duration:g} s per run; {rounds} round(s) per cell, full and "
        "filtered alternating.",
        "",
        f"Bytes per poll: the full page {len(full_body):,} B; the filtered page (`name[]` for the "
        f"{filtered_path.count('name%5B%5D')} sample names the core-metrics-extractor reads for vLLM) "
        f"{len(filtered_body):,} B ({len(full_body) / max(len(filtered_body), 1):.0f}x less), for a request line "
        f"{request_small - request_full} B longer. The model server renders only those families.",
        "",
        f"Per poll, one endpoint: parse + extract {parse_cost * 1e6:.0f} µs CPU (filtered page "
        f"{parse_small * 1e6:.1f} µs); HTTP fetch (keep-alive) {fetch_cost * 1e6:.0f} µs CPU (filtered page "
        f"{fetch_small * 1e6:.0f} µs). Parse + extract of the full page with every label set parsed afresh (the "
        f"parser's memory of label sets emptied before each parse): {parse_fresh * 1e6:.0f} µs "
        f"({parse_fresh / parse_cost:.2f}x).",
        "",
        "HTTP fetch, keep-alive, CPU per fetch, in alternating blocks "
        f"({len(own)} blocks): the scraper's own client (`llm_epp.datalayer.http_client`), full page "
        f"{_spread(own)} µs, filtered page {_spread(small)} µs; aiohttp, full page {_spread(lib)} µs (median / "
        f"min-max); aiohttp / own {statistics.median(lib) / statistics.median(own):.2f}x.",
        "",
        "| interval | endpoints | pages | polls/s (target) | failures | endpoints filtered | EPP CPU (% of a core) | "
        "CPU per poll (best round; all rounds) | CPU per endpoint-second | endpoints one core keeps fresh |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    # Rows where polls/s fell short of the target were CPU-bound (the loopback servers share the machine);
    # their CPU per poll is still a valid cost, the derived columns assume polls at the full interval.
    summary: list[str] = []
    for interval in intervals:
        worst: dict[bool, Result] = {}
        for n in counts:
            cell: dict[bool, Result] = {}
            for filtered in (False, True):
                rows = [r for r in results if r.interval == interval and r.endpoints == n and r.filtered == filtered]
                r = cell[filtered] = _best_result(rows)
                spread = ", ".join(f"{x.cpu_per_poll * 1e6:.0f}" for x in rows)
                out.append(
                    f"| {interval * 1000:.0f} ms | {n} | {'filtered' if filtered else 'full'} | "
                    f"{r.polls / r.wall:.0f} ({r.target_polls / r.wall:.0f}) | {sum(x.failures for x in rows)} | "
                    f"{r.filtering}/{n} | {100 * r.cpu / r.wall:.0f}% | {r.cpu_per_poll * 1e6:.0f} µs ({spread}) | "
                    f"{1000 * r.cpu_per_poll / r.interval:.1f} ms | {r.endpoints_per_core:.0f} |"
                )
                if filtered not in worst or r.cpu_per_poll > worst[filtered].cpu_per_poll:
                    worst[filtered] = r
            ratio = cell[True].cpu_per_poll / cell[False].cpu_per_poll
            out.append(f"| | | filtered / full | | | | | {ratio:.2f}x | | |")
        summary.append(
            f"At {interval * 1000:.0f} ms one core keeps about **{worst[True].endpoints_per_core:.0f} endpoints** "
            f"fresh with filtered pages and **{worst[False].endpoints_per_core:.0f}** with full pages (from the "
            f"costliest CPU per poll measured at this interval: {worst[True].cpu_per_poll * 1e6:.0f} vs "
            f"{worst[False].cpu_per_poll * 1e6:.0f} µs)."
        )
    for line in summary:
        out += ["", line]
    report = "\n".join(out)
    print(report)
    if args.output:
        Path(args.output).write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
