"""CPU per request of the Python request path (ext_proc servicer + director), in process, optionally beside
another version of the code in the same process.

What `llm-epp serve` builds (`llm_epp.app.build`, default configuration, three static endpoints, no scraping)
is fed the stream Envoy's default configuration produces for one request (request headers with the protocol
configuration, the whole body, the response headers, then the stream's end) through
`ExtProcServicer.process`, one stream after another on a uvloop loop; only gRPC's transport is missing.

Workloads: `small` is the through-Envoy benchmark's request (`benchmarks/overhead.py`: a completion of
"Say hello.", shorter than one prefix block); `chat` is chat completions with 50 shared system prompts of
~1,200 characters and a unique ~600-character question, so the prefix index fills, matches and evicts.

With `--baseline-src DIR` (a `src` directory of another checkout, e.g. `git archive <rev> src | tar -x`) both
versions are imported into this one process (each with its own `llm_epp` modules, swapped in `sys.modules`
between blocks) and built side by side; blocks of `--block` requests alternate between them, the first of
each pair swapping every block, so both see the same load on a shared machine. CPU = `time.process_time()`
per block / requests; the report gives min, first quartile and median of the blocks, and new / old.

    python -m benchmarks.request_cost                                  # this checkout alone
    python -m benchmarks.request_cost --baseline-src /tmp/old/src      # old and new side by side
    python -m benchmarks.request_cost --profile out.pstats             # cProfile of this checkout
    python -m benchmarks.request_cost --cold-cache 16                  # each request with cold CPU caches
    python -m benchmarks.request_cost --idle-gap 10                    # each request after 10 ms idle
    python -m benchmarks.request_cost --idle-gap 10 --gap spin         # after 10 ms of a busy loop instead
    python -m benchmarks.request_cost --beside-trivial                 # and the trivial picker's handler
    [--workload small|chat] [--tracing on|off] [--blocks 60] [--block 100] [--warmup 10] [--seed 1]

Behind Envoy a request's Python code runs with cold CPU caches (the gateway, gRPC's threads and the kernel ran
since the last one), and there it costs about twice what it costs in a tight loop; `--cold-cache` reproduces
that, so changes that touch less memory show their worth in process. At low rates the process is also idle
between requests; `--idle-gap` sleeps before each one (10 ms: 100 requests/s), which on a virtual machine costs
the next request more than cold caches alone do. `--gap spin` fills the same gap with a busy loop instead, to
tell the process's sleep apart from the time passing on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ENDPOINTS = ("10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000")
SMALL_BODY = json.dumps({"model": "m", "prompt": "Say hello.", "max_tokens": 8}).encode()
SYSTEMS = 50


class _Stream:
    """What gRPC hands the servicer for one stream: `read()` the next message, `write()` an answer."""

    __slots__ = ("_eof", "_messages", "answers")

    def __init__(self, messages: list[Any], eof: object) -> None:
        self._messages = messages[::-1]
        self._eof = eof
        self.answers = 0

    async def read(self) -> Any:
        return self._messages.pop() if self._messages else self._eof

    async def write(self, _answer: bytes) -> None:
        self.answers += 1


def _bodies(workload: str, n: int, seed: int) -> list[tuple[str, bytes]]:
    if workload == "small":
        return [("/v1/completions", SMALL_BODY)] * n
    rng = random.Random(seed)
    systems = [f"You are assistant {j}. " + rng.randbytes(600).hex() for j in range(SYSTEMS)]
    out = []
    for i in range(n):
        body = {
            "model": "m",
            "max_tokens": 8,
            "messages": [
                {"role": "system", "content": systems[rng.randrange(SYSTEMS)]},
                {"role": "user", "content": f"question {i}: " + rng.randbytes(300).hex()},
            ],
        }
        out.append(("/v1/chat/completions", json.dumps(body).encode()))
    return out


def _messages(i: int, path: str, body: bytes) -> list[Any]:
    from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
    from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

    def headers(pairs: Sequence[tuple[str, str]]) -> HeaderMap:
        return HeaderMap(headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs])

    request = (
        (":authority", "127.0.0.1"),
        (":path", path),
        (":method", "POST"),
        (":scheme", "http"),
        ("content-type", "application/json"),
        ("content-length", str(len(body))),
        ("user-agent", "wrk"),
        ("x-forwarded-proto", "http"),
        ("x-request-id", f"6f1c2a4e-0b7d-4c39-9e2f-{i:012d}"),
    )
    response = ((":status", "200"), ("content-type", "application/json"), ("content-length", "20"))
    return [
        pb.ProcessingRequest(
            request_headers=pb.HttpHeaders(headers=headers(request)),
            protocol_config=pb.ProtocolConfiguration(
                request_body_mode=ProcessingMode.FULL_DUPLEX_STREAMED, response_body_mode=ProcessingMode.NONE
            ),
        ),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
        pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=headers(response))),
    ]


class _Version:
    """One version of the code: its `llm_epp` modules and the servicer it built."""

    def __init__(self, label: str, src: Path | None, tracing: bool) -> None:
        self.label = label
        for name in [m for m in sys.modules if m == "llm_epp" or m.startswith("llm_epp.")]:
            del sys.modules[name]
        if src is not None:
            sys.path.insert(0, str(src))
        try:
            from llm_epp.app import build
            from llm_epp.options import Options

            self.components = build(Options(endpoints=",".join(ENDPOINTS), secure_serving=False, tracing=tracing))
        finally:
            if src is not None:
                sys.path.remove(str(src))
        self.origin = "llm_epp from " + str(Path(sys.modules["llm_epp"].__file__ or "").parent)
        self.modules: dict[str, ModuleType] = {
            k: v for k, v in sys.modules.items() if k == "llm_epp" or k.startswith("llm_epp.")
        }
        # A stream whose response ended at its headers waits for Envoy to end it; Envoy does so at once here.
        self.components.servicer.close_wait_s = 0.0
        self.process: Callable[[Any, Any], Any] = self.components.servicer.process
        # Spans are exported from a thread: each block waits for its own, so no version pays for the other's.
        provider = getattr(self.components.servicer.tracer, "provider", None)
        self.flush: Callable[[], Any] = provider.force_flush if provider is not None else lambda: None
        self.blocks: list[float] = []

    def activate(self) -> None:
        for name in [m for m in sys.modules if (m == "llm_epp" or m.startswith("llm_epp.")) and m not in self.modules]:
            del sys.modules[name]
        sys.modules.update(self.modules)


class _Trivial:
    """The trivial picker's stream handler (`benchmarks.trivial_picker`) on the same streams: the floor of the
    Python path, pre-serialised answers and no routing."""

    label = "trivial"
    origin = "the trivial picker's handler (benchmarks/trivial_picker.py)"

    def __init__(self, eof: object) -> None:
        from benchmarks.trivial_picker import handler

        self.process: Callable[[Any, Any], Any] = handler(list(ENDPOINTS), eof)
        self.flush: Callable[[], Any] = lambda: None
        self.blocks: list[float] = []

    def activate(self) -> None:
        pass


_GAP_WORDS = {"sleep": "idle", "spin": "spinning"}


async def _block(
    version: _Version | _Trivial,
    streams: list[list[Any]],
    eof: object,
    evict: bytearray | None = None,
    gap: float = 0.0,
    spin: bool = False,
) -> float:
    """CPU seconds per request of one block. With `evict`, every request starts with cold CPU caches: the
    buffer is written through before it. With `gap`, the loop sleeps that long before each request, as between
    two requests of a quiet gateway, or with `spin` stays busy that long in a loop that reads the clock and
    touches nothing else. All are untimed; each request is then timed on its own."""
    process = version.process
    if evict is None and not gap:
        t0 = time.process_time()
        for messages in streams:
            stream = _Stream(messages, eof)
            await process(None, stream)
            if stream.answers < 2:
                raise RuntimeError(f"{version.label}: a request got {stream.answers} answers (refused?)")
        version.flush()
        return (time.process_time() - t0) / len(streams)
    clock = time.thread_time
    line = b"\x01" * (len(evict) // 64) if evict is not None else b""
    spent = 0.0
    for messages in streams:
        stream = _Stream(messages, eof)
        if gap:
            if spin:
                _spin(gap)
            else:
                await asyncio.sleep(gap)
        if evict is not None:
            evict[::64] = line  # one byte in every 64-byte cache line
        t0 = clock()
        await process(None, stream)
        spent += clock() - t0
        if stream.answers < 2:
            raise RuntimeError(f"{version.label}: a request got {stream.answers} answers (refused?)")
    t0 = clock()
    version.flush()
    return (spent + clock() - t0) / len(streams)


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _stats(values: Sequence[float]) -> tuple[float, float, float]:
    s = sorted(values)
    return s[0], s[len(s) // 4], statistics.median(s)


async def run(args: argparse.Namespace) -> list[str]:
    import grpc

    eof = grpc.aio.EOF
    total = (args.warmup + args.blocks) * args.block
    bodies = _bodies(args.workload, total, args.seed)
    streams = [_messages(i, path, body) for i, (path, body) in enumerate(bodies)]
    tracing = args.tracing == "on"
    versions: list[_Version | _Trivial] = []
    if args.baseline_src:
        versions.append(_Version("old", Path(args.baseline_src), tracing))
    versions.append(_Version("new", None, tracing))
    if args.beside_trivial:
        versions.append(_Trivial(eof))
    evict = bytearray(args.cold_cache << 20) if args.cold_cache else None
    gc.collect()
    gc.freeze()
    profiler = cProfile.Profile() if args.profile else None
    for b in range(args.warmup + args.blocks):
        chunk = streams[b * args.block : (b + 1) * args.block]
        order = versions if b % 2 == 0 else versions[::-1]
        for v in order:
            v.activate()
            if profiler is not None and b >= args.warmup:
                profiler.enable()
            per_request = await _block(v, chunk, eof, evict, args.idle_gap / 1000.0, args.gap == "spin")
            if profiler is not None:
                profiler.disable()
            if b >= args.warmup:
                v.blocks.append(per_request)
    if profiler is not None:
        profiler.dump_stats(args.profile)
    out = [
        f"workload {args.workload}, tracing {args.tracing}, "
        + (f"cold caches ({args.cold_cache} MiB written before each request), " if args.cold_cache else "")
        + (f"{args.idle_gap:g} ms {_GAP_WORDS[args.gap]} before each request, " if args.idle_gap else "")
        + f"{args.blocks} blocks of {args.block} requests "
        f"(after {args.warmup} warm-up blocks); load average {os.getloadavg()[0]:.1f} at the end",
        "",
        "| version | min us | q1 us | median us |",
        "|---|---:|---:|---:|",
    ]
    out[1:1] = [f"{v.label}: {v.origin}" for v in versions]
    for v in versions:
        lo, q1, med = _stats(v.blocks)
        out.append(f"| {v.label} | {lo * 1e6:.1f} | {q1 * 1e6:.1f} | {med * 1e6:.1f} |")
    stats = {v.label: _stats(v.blocks) for v in versions}
    for base in ("old", "trivial"):
        if base in stats:
            out += [
                "",
                f"new / {base}: "
                + ", ".join(f"{n / o:.3f}" for n, o in zip(stats["new"], stats[base], strict=True))
                + " (min, q1, median)",
            ]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=("small", "chat"), default="small")
    p.add_argument("--tracing", choices=("on", "off"), default="on", help="--tracing of llm-epp (default on)")
    p.add_argument("--baseline-src", help="a `src` directory of another version to run beside this one")
    p.add_argument(
        "--beside-trivial",
        action="store_true",
        help="also run the trivial picker's stream handler on the same streams, in the same alternating blocks",
    )
    p.add_argument("--profile", help="write a cProfile of the timed blocks here")
    p.add_argument("--blocks", type=int, default=60, help="timed blocks per version (default 60)")
    p.add_argument("--block", type=int, default=100, help="requests per block (default 100)")
    p.add_argument("--warmup", type=int, default=10, help="warm-up blocks (default 10)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--cold-cache",
        type=int,
        default=0,
        metavar="MIB",
        help="write MIB MiB of memory before each request so that it starts with cold CPU caches, as behind "
        "Envoy, where the gateway, gRPC and the kernel run between two requests (default 0: warm caches)",
    )
    p.add_argument(
        "--idle-gap",
        type=float,
        default=0.0,
        metavar="MS",
        help="sleep MS milliseconds before each request (untimed), as between two requests at 1000/MS requests "
        "per second; the request then runs after the process was idle (default 0: back to back)",
    )
    p.add_argument(
        "--gap",
        choices=("sleep", "spin"),
        default="sleep",
        help="how the --idle-gap passes: the event loop sleeps (default), or the process spins in a busy loop "
        "that only reads the clock, so that it never sleeps; if a request costs as much after a spin as after a "
        "sleep, what makes it slower is the time that passed on the machine, not the process being idle",
    )
    args = p.parse_args(argv)
    if args.gap == "spin" and not args.idle_gap:
        p.error("--gap spin: give the length of the gap with --idle-gap MS")
    if args.cold_cache < 0:
        p.error("--cold-cache: give a size in MiB, 0 or more")
    if args.idle_gap < 0:
        p.error("--idle-gap: give a time in milliseconds, 0 or more")
    os.environ.setdefault("OTEL_TRACES_EXPORTER", "console")
    import uvloop

    # the report goes to stderr: the default console exporter prints sampled spans on stdout, as `serve` does
    lines = uvloop.run(run(args))
    print("\n".join(lines), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
