"""EPP memory over many requests, in-process: does anything grow once the prefix index is full?

Each run is a child process that builds what `llm-epp serve` builds (`llm_epp.app.build`, default options and
configuration, 8 endpoints), freezes the startup objects out of the collector as `serve` does, and feeds the
ext_proc servicer (`ExtProcServicer.process`, the stream handler gRPC calls) one stream per request on a uvloop
loop: request headers with a distinct `x-request-id`, a completion body (one of 16 shared prefixes, then ~600
characters of its own, so the prefix index keeps meeting new blocks and evicting old ones), the response
headers. Only gRPC's transport is missing (its buffers live in C++, outside what this measures). Tracing is
on as in `serve`; its exporter is `none` unless OTEL_TRACES_EXPORTER says otherwise (the default console
exporter would print every sampled span).

Every `--sample` requests the child reports: VmRSS; the blocks Python's allocator holds
(`sys.getallocatedblocks`); the bytes malloc has handed out and not taken back (glibc `mallinfo2`: in use,
arenas and mmapped chunks); objects the collector tracks; the prefix index's entries. The report gives each
run's figures per 100k requests and their slopes after `--warmup` requests (a least-squares line through the
samples after it).

Variants (each its own child, after the main run): `arena2` (MALLOC_ARENA_MAX=2), `nofreeze` (no
`gc.freeze()` after startup), `jemalloc` and `mimalloc` (LD_PRELOAD of the system's library, skipped when it is
not installed).

`--grpc-requests N` then runs `llm-epp serve` itself and feeds it the same requests over loopback gRPC (its
VmRSS only); `--grpc-cancel` ends each of those streams with a cancellation, as Envoy ends them when response
bodies are not sent.

    python -m benchmarks.memory                             # 1M requests, then 200k per variant (~40 min idle)
    python -m benchmarks.memory --requests 300000 --variant-requests 0
    python -m benchmarks.memory --requests 0 --variant-requests 0 --grpc-requests 60000 [--grpc-cancel]
    [--variants arena2,nofreeze,jemalloc,mimalloc] [--sample 20000] [--warmup 100000] [--seed 1] [--output FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import ctypes.util
import gc
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.report import command_line, machine

ROOT = Path(__file__).resolve().parents[1]
ENDPOINTS = 8
PREFIXES = 16
OWN_BYTES = 300  # ~600 hex characters of its own per request: ~9 new 64-character blocks
LIBDIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")
PRELOADS = {"jemalloc": "libjemalloc.so.2", "mimalloc": "libmimalloc.so.2"}
VARIANTS = ("arena2", "nofreeze", "jemalloc", "mimalloc")
MARK = "sample "


# --- the child: one run -----------------------------------------------------------------------------------


class _Stream:
    """What gRPC hands the servicer for one stream: `read()` the next message, `write()` an answer."""

    __slots__ = ("_messages", "answers")

    def __init__(self, messages: list[Any]) -> None:
        self._messages = messages
        self._messages.reverse()
        self.answers = 0

    async def read(self) -> Any:
        import grpc

        return self._messages.pop() if self._messages else grpc.aio.EOF

    async def write(self, _answer: bytes) -> None:
        self.answers += 1


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


def _mallinfo() -> Any:
    """glibc's `mallinfo2`, or None (another libc, or an allocator preloaded in its place)."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    libc = ctypes.CDLL(name)
    fn = getattr(libc, "mallinfo2", None)
    if fn is None:
        return None
    fn.restype = _Mallinfo2
    return fn


def rss_kib(pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _messages(
    i: int, systems: Sequence[str], rng: random.Random, sized: bool = False, event_stream: bool = False
) -> list[Any]:
    """One request's ext_proc messages. `sized`: the response headers carry a Content-Length, as a non-streamed
    vLLM answer's do (the EPP then ends the request at those headers). `event_stream`: the response is
    `text/event-stream`, as a streamed vLLM answer is."""
    from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
    from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

    def headers(pairs: Sequence[tuple[str, str]]) -> HeaderMap:
        return HeaderMap(headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs])

    prompt = f"{systems[i % len(systems)]} [{i}] {rng.randbytes(OWN_BYTES).hex()}?"
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 8}).encode()
    request = (
        (":method", "POST"),
        (":path", "/v1/completions"),
        ("content-type", "application/json"),
        ("x-request-id", f"bench-{i}"),
    )
    return [
        pb.ProcessingRequest(
            request_headers=pb.HttpHeaders(headers=headers(request)),
            protocol_config=pb.ProtocolConfiguration(
                request_body_mode=ProcessingMode.FULL_DUPLEX_STREAMED, response_body_mode=ProcessingMode.NONE
            ),
        ),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
        pb.ProcessingRequest(
            response_headers=pb.HttpHeaders(
                headers=headers(
                    ((":status", "200"), ("content-type", "text/event-stream" if event_stream else "application/json"))
                    + ((("content-length", "120"),) if sized else ())
                )
            )
        ),
    ]


def _index_entries(components: Any) -> int:
    return sum(
        len(index) for p in components.config.plugins.values() if (index := getattr(p, "index", None)) is not None
    )


async def _run(requests: int, sample: int, seed: int, freeze: bool) -> None:
    from llm_epp.app import build
    from llm_epp.options import Options

    endpoints = ",".join(f"10.0.0.{i}:8000" for i in range(1, ENDPOINTS + 1))
    components = build(Options(endpoints=endpoints, secure_serving=False))
    servicer = components.servicer
    servicer.close_wait_s = 0.0  # the streams here half-close and are never reset: nothing to wait for
    rng = random.Random(seed)
    systems = [f"You are assistant {j}. {rng.randbytes(90).hex()}." for j in range(PREFIXES)]
    mallinfo = _mallinfo()
    gc.collect()
    if freeze:
        gc.freeze()

    def report(done: int, seconds: float) -> None:
        gc.collect()  # count what survives, not garbage the collector has not reached yet
        m = mallinfo() if mallinfo is not None else None
        if m is not None and m.arena == 0:
            m = None  # another allocator is preloaded: glibc's figures say nothing
        row = {
            "requests": done,
            "rss_kib": rss_kib(),
            "py_blocks": sys.getallocatedblocks(),
            "malloc_in_use": (m.uordblks + m.hblkhd) if m is not None else None,
            "malloc_arena": m.arena if m is not None else None,
            "gc_objects": len(gc.get_objects()),
            "index_entries": _index_entries(components),
            "seconds": round(seconds, 1),
        }
        print(MARK + json.dumps(row), flush=True)

    started = time.perf_counter()
    report(0, 0.0)
    for i in range(requests):
        stream = _Stream(_messages(i, systems, rng))
        await servicer.process(None, stream)  # type: ignore[arg-type]
        if stream.answers < 2:
            raise RuntimeError(f"request {i} got {stream.answers} answers: the servicer refused it")
        await asyncio.sleep(0)  # let the loop run its timers and callbacks, as between streams in serve
        if (i + 1) % sample == 0:
            report(i + 1, time.perf_counter() - started)


def child_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, required=True)
    p.add_argument("--sample", type=int, required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--no-freeze", action="store_true")
    args = p.parse_args(argv)
    import uvloop

    uvloop.run(_run(args.requests, args.sample, args.seed, not args.no_freeze))
    return 0


# --- through gRPC: `llm-epp serve` in its own process, a gRPC client playing Envoy ---------------------------


async def _grpc_run(
    requests: int,
    sample: int,
    seed: int,
    capacity: int,
    streams: int,
    cancel: bool,
    sized: bool = False,
    event_stream: bool = False,
) -> Run:
    """`llm-epp serve` (default options but a small `lruCapacityPerServer`, so the index is full after a few
    thousand requests) fed over loopback gRPC by `streams` concurrent ext_proc streams at a time."""
    import grpc
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pbg

    from llm_epp.config.defaults import DEFAULT_CONFIG
    from llm_epp.gateway.epp_process import EppProcess

    producer = f"- type: approx-prefix-cache-producer\n  parameters:\n    lruCapacityPerServer: {capacity}\n"
    config = DEFAULT_CONFIG.replace("- type: prefix-cache-scorer\n", "- type: prefix-cache-scorer\n" + producer)
    endpoints = ",".join(f"10.0.0.{i}:8000" for i in range(1, ENDPOINTS + 1))
    ending = "each stream cancelled after its answers" if cancel else "each stream half-closed"
    if sized:
        ending += ", responses with a Content-Length"
    if event_stream:
        ending += ", event-stream responses"
    run = Run("grpc", f"llm-epp serve, lruCapacityPerServer {capacity}, {streams} streams at a time, {ending}", [])
    epp = EppProcess(
        "--endpoints", endpoints, "--secure-serving=false", "--tracing=true", "--config-text", config,
        env={"OTEL_TRACES_EXPORTER": "none"},
    )  # fmt: skip
    rng = random.Random(seed)
    systems = [f"You are assistant {j}. {rng.randbytes(90).hex()}." for j in range(PREFIXES)]
    started = time.perf_counter()
    with epp:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{epp.grpc_port}") as channel:
            stub = pbg.ExternalProcessorStub(channel)

            async def one(i: int) -> None:
                call = stub.Process()
                for msg in _messages(i, systems, rng, sized, event_stream):
                    await call.write(msg)
                if cancel:  # as Envoy ends a stream whose response body is not sent: a cancellation
                    answers = [await call.read() for _ in range(3)]
                    call.cancel()
                else:
                    await call.done_writing()
                    answers = [a async for a in call]
                if len(answers) < 3 or answers[0].HasField("immediate_response"):
                    raise RuntimeError(f"request {i} was not routed: {answers[:1]}")

            def sample_row(done: int) -> None:
                row: dict[str, Any] = {
                    "requests": done,
                    "rss_kib": rss_kib(epp.pid),
                    "py_blocks": None,
                    "malloc_in_use": None,
                }
                row |= {"malloc_arena": None, "gc_objects": None, "seconds": round(time.perf_counter() - started, 1)}
                row["index_entries"] = int(epp.metric_value("inference_extension_prefix_indexer_size"))
                run.samples.append(row)
                print(
                    f"  grpc: {done:,} requests, VmRSS {row['rss_kib'] / 1024:.1f} MiB, index {row['index_entries']:,}",
                    file=sys.stderr,
                    flush=True,
                )

            sample_row(0)
            done = 0
            try:
                while done < requests:
                    n = min(sample, requests - done)
                    for start in range(done, done + n, streams):
                        await asyncio.gather(*(one(i) for i in range(start, min(start + streams, done + n))))
                    done += n
                    sample_row(done)
            except KeyboardInterrupt:
                run.error = "interrupted"
    return run


# --- the parent: runs, slopes, report ---------------------------------------------------------------------


@dataclass
class Run:
    name: str
    env: str
    samples: list[dict[str, Any]]
    error: str = ""


def _preload(name: str) -> str | None:
    for d in LIBDIRS:
        path = Path(d) / PRELOADS[name]
        if path.exists():
            return str(path)
    return None


def run_child(name: str, requests: int, sample: int, seed: int) -> Run:
    env = dict(os.environ)
    env.setdefault("OTEL_TRACES_EXPORTER", "none")  # spans are made and sampled as in serve, not printed
    extra: dict[str, str] = {}
    argv = ["--requests", str(requests), "--sample", str(sample), "--seed", str(seed)]
    if name == "arena2":
        extra["MALLOC_ARENA_MAX"] = "2"
    elif name == "nofreeze":
        argv.append("--no-freeze")
    elif name in PRELOADS:
        lib = _preload(name)
        if lib is None:
            return Run(name, "", [], f"{PRELOADS[name]} is not installed (Debian: apt-get install lib{name}2)")
        extra["LD_PRELOAD"] = lib
    env.update(extra)
    cmd = [sys.executable, "-m", "benchmarks.memory", "--child", *argv]
    label = " ".join(f"{k}={v}" for k, v in extra.items()) or ("no gc.freeze()" if name == "nofreeze" else "-")
    run = Run(name, label, [])
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                if not line.startswith(MARK):
                    print(line, end="", file=sys.stderr)
                    continue
                row = json.loads(line[len(MARK) :])
                run.samples.append(row)
                print(
                    f"  {name}: {row['requests']:,} requests, VmRSS {row['rss_kib'] / 1024:.1f} MiB, "
                    f"index {row['index_entries']:,}, {row['seconds']:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
        except KeyboardInterrupt:
            proc.terminate()
            run.error = "interrupted"
        if proc.wait() != 0 and not run.error:
            run.error = f"exit code {proc.returncode}"
    return run


def slope(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of y over x, or None with fewer than 3 points."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def _after(run: Run, warmup: int, key: str, scale: float) -> list[tuple[float, float]]:
    return [(s["requests"], s[key] / scale) for s in run.samples if s["requests"] >= warmup and s[key] is not None]


def _fmt_slope(value: float | None, unit: str) -> str:
    return "n/a" if value is None else f"{value * 100_000:+.2f} {unit}"


def summarise(run: Run, warmup: int) -> str:
    rss = slope(_after(run, warmup, "rss_kib", 1024))
    blocks = slope(_after(run, warmup, "py_blocks", 1000))
    malloc = slope(_after(run, warmup, "malloc_in_use", 1 << 20))
    objects = slope(_after(run, warmup, "gc_objects", 1))
    last = run.samples[-1] if run.samples else {}
    total = last.get("requests", 0)
    return (
        f"| {run.name} | `{run.env}` | {total:,} | {last.get('rss_kib', 0) / 1024:.1f} | {_fmt_slope(rss, 'MiB')} | "
        f"{_fmt_slope(blocks, 'k')} | {_fmt_slope(malloc, 'MiB')} | {_fmt_slope(objects, '')} |"
        + (f" {run.error}" if run.error else "")
    )


def _cell(value: float | None, scale: float, spec: str) -> str:
    return "n/a" if value is None else format(value / scale, spec)


def table(run: Run, every: int) -> list[str]:
    out = [
        f"#### {run.name}: every {every:,} requests",
        "",
        "| requests | VmRSS MiB | Python blocks (k) | malloc in use MiB | malloc arena MiB | tracked objects "
        "| index entries | s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in run.samples:
        if s["requests"] % every and s is not run.samples[-1]:
            continue
        out.append(
            f"| {s['requests']:,} | {s['rss_kib'] / 1024:.1f} | {_cell(s['py_blocks'], 1000, '.0f')} | "
            f"{_cell(s['malloc_in_use'], 1 << 20, '.1f')} | {_cell(s['malloc_arena'], 1 << 20, '.1f')} | "
            f"{_cell(s['gc_objects'], 1, ',.0f')} | {s['index_entries']:,} | {s['seconds']:.0f} |"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    if args_list[:1] == ["--child"]:
        return child_main(args_list[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=1_000_000, help="requests of the main run (default 1M; 0: none)")
    p.add_argument("--variant-requests", type=int, default=200_000, help="requests per variant (0: no variants)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    p.add_argument("--sample", type=int, default=20_000, help="requests between samples (default 20000)")
    p.add_argument("--warmup", type=int, default=100_000, help="slopes are fitted after this many requests")
    p.add_argument("--grpc-requests", type=int, default=0, help="then this many through `llm-epp serve` over gRPC")
    p.add_argument("--grpc-capacity", type=int, default=2000, help="lruCapacityPerServer of the gRPC run")
    p.add_argument("--grpc-streams", type=int, default=16, help="concurrent streams of the gRPC run")
    p.add_argument(
        "--grpc-cancel", action="store_true", help="the gRPC run cancels each stream after its answers, as Envoy does"
    )
    p.add_argument(
        "--grpc-content-length",
        action="store_true",
        help="the gRPC run's response headers carry a Content-Length, as a non-streamed vLLM answer's do",
    )
    p.add_argument(
        "--grpc-event-stream",
        action="store_true",
        help="the gRPC run's responses are text/event-stream, as a streamed vLLM answer is",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--output", help="also write the Markdown report here")
    args = p.parse_args(args_list)
    variants = [v for v in args.variants.split(",") if v] if args.variant_requests else []
    for v in variants:
        if v not in VARIANTS:
            p.error(f"--variants: unknown {v!r}; choose from {', '.join(VARIANTS)}")
    command = command_line("benchmarks.memory", argv)
    print(f"{command}\nseed {args.seed}; {machine()}", file=sys.stderr, flush=True)
    runs = [run_child("default", args.requests, args.sample, args.seed)] if args.requests else []
    for v in variants:
        if runs and runs[-1].error == "interrupted":
            break  # Ctrl-C: report what was measured
        runs.append(run_child(v, args.variant_requests, args.sample, args.seed))
    if args.grpc_requests:
        import uvloop

        runs.append(
            uvloop.run(
                _grpc_run(
                    args.grpc_requests,
                    args.sample,
                    args.seed,
                    args.grpc_capacity,
                    args.grpc_streams,
                    args.grpc_cancel,
                    args.grpc_content_length,
                    args.grpc_event_stream,
                )
            )
        )
    every = 100_000 if args.requests >= 200_000 else args.sample
    out = [
        "## EPP memory over many requests (in-process, the servicer path)",
        "",
        f"`{command.strip()}`; seed {args.seed}; {machine()}",
        "",
        f"`llm-epp serve`'s components (default options and configuration, {ENDPOINTS} endpoints) fed one ext_proc "
        f"stream per request without gRPC's transport; distinct request ids; {PREFIXES} shared prefixes then "
        f"~{OWN_BYTES * 2} characters of each request's own. Slopes: least-squares per 100k requests over the "
        f"samples from request {args.warmup:,} on (read them where the index entries have stopped growing: ties "
        "between endpoints are broken at random, so how many endpoints' LRUs fill differs from run to run). "
        "Python blocks: "
        "`sys.getallocatedblocks()`; malloc in use: glibc `mallinfo2` (n/a under another allocator).",
        "",
        "| run | environment | requests | VmRSS at the end MiB | VmRSS slope | Python blocks slope "
        "| malloc in use slope | tracked objects slope |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
        *(summarise(r, args.warmup) if r.samples else f"| {r.name} | - | 0 | | | | | | {r.error}" for r in runs),
        "",
    ]
    for r in runs:
        if r.samples:
            out += [*table(r, every if r.name in ("default", "grpc") else args.sample * 5), ""]
    text = "\n".join(out)
    print(text)
    if args.output:
        Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
