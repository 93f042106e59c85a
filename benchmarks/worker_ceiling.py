"""How many requests per second a core gives each kind of EPP process, with no Envoy in the way, and what that
projects for `--workers N` on a machine with a core per process.

`benchmarks.workers` measures workers behind a real Envoy; on a 2-core machine Envoy, wrk and the stand-ins
take most of a core, so a second worker never gets a core of its own. Here `h2load` (nghttp2, written in C)
drives the ext_proc ports directly and costs a small fraction of what the EPP does per request, so each EPP
process can be pinned to a core and saturated, and its CPU per request read at full load.

Each stream carries what Envoy's default configuration sends for one small request, all at once: the request
headers (with the protocol configuration), the whole body, the response headers; then the client half-closes.
Two differences from Envoy's streams, both needed because h2load sends the same bytes every time and never
resets a stream: the request has no `x-request-id` (the EPP makes one, as it does for any request without it),
and the response headers carry no `content-length`, so the request ends when the stream does instead of on the
response headers' answer. The first stream of each ext_proc port waits 10 s for a reset that never comes, after
which the port knows its peer half-closes; the warm-up pays that wait. Every answered request is checked
against the EPP's own count (`inference_objective_request_total`), so a stream that ended in a gRPC error is
not counted as served.

Setups, alternating within each round:
  * 1 process, on CPU 1; h2load on CPU 0;
  * 2 workers, front 0 alone on CPU 1; the serving process and h2load on CPU 0 (a front's own ceiling);
  * 2 workers, front i on CPU i; the serving process and h2load unpinned (what 2 cores give);
  * 2 workers, unpinned.

From the CPU per request of each kind of process at full load it projects, for N fronts given N + 1 cores,
min(N x front, serving process) against the single process on one core: the serving process runs every
Director call, so it is the one part that more workers do not multiply.

    python -m benchmarks.worker_ceiling [--workload small|chat] [--duration 6] [--rounds 2] [--streams 64]
        [--epp-args "--tracing=true ..."] [--output FILE]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.overhead import cpu_seconds, direct_response_backends
from benchmarks.report import command_line, emit, keeping_partial_results, machine
from benchmarks.request_cost import _bodies, _messages
from benchmarks.workers import ALL, pin
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess

PATH = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
DROPPED = (("request", "x-request-id"), ("response", "content-length"))
FIRST_STREAM_S = 25  # the first stream of a port waits 10 s for a reset; h2load's deadline for it


def request_stream(workload: str = "small") -> bytes:
    """The three ext_proc messages of one request, each gRPC-framed (flag byte, 4-byte length, message).
    `small` is the overhead benchmark's completion; `chat` one chat completion of `benchmarks.request_cost`
    (a ~1,200-character system prompt and a ~600-character question: the prefix producer hashes ~30 blocks)."""
    path, body = _bodies(workload, 1, 1)[0]
    messages = _messages(0, path, body)
    for message, (side, name) in zip((messages[0], messages[2]), DROPPED, strict=True):
        headers = (message.request_headers if side == "request" else message.response_headers).headers
        kept = [hv for hv in headers.headers if hv.key != name]
        del headers.headers[:]
        headers.headers.extend(kept)
    out = bytearray()
    for message in messages:
        data = message.SerializeToString()
        out += b"\0" + struct.pack(">I", len(data)) + data
    return bytes(out)


@dataclass(frozen=True)
class Setup:
    name: str
    workers: int  # 1: the single process
    fronts_loaded: int  # how many ext_proc ports h2load drives
    epp_cpus: tuple[set[int] | None, ...]  # the single process; or the serving process, then each front
    load_cpus: set[int] | None  # h2load


SETUPS = (
    Setup("1 process on CPU 1, h2load on CPU 0", 1, 1, ({1},), {0}),
    Setup("2 workers, front 0 alone on CPU 1, serving process and h2load on CPU 0", 2, 1, ({0}, {1}, {0}), {0}),
    Setup("2 workers, front i on CPU i, serving process and h2load unpinned", 2, 2, (ALL, {0}, {1}), ALL),
    Setup("2 workers, unpinned", 2, 2, (ALL, ALL, ALL), ALL),
)


@dataclass
class Row:
    setup: Setup
    rps: list[float] = field(default_factory=list)
    cores: list[float] = field(default_factory=list)  # EPP CPU seconds per second
    ms: list[list[float]] = field(default_factory=list)  # per round: CPU ms per request of each EPP process
    failed: int = 0


@dataclass(frozen=True)
class Load:
    seconds: float
    done: int
    failed: int


def parse_h2load(text: str) -> Load:
    """The totals of one h2load run: wall time, requests that got a 2xx, and every other outcome."""
    m = re.search(r"finished in ([\d.]+)(m?s)", text)
    counts = re.search(
        r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored", text
    )
    codes = re.search(r"status codes: (\d+) 2xx", text)
    if m is None or counts is None or codes is None:
        raise RuntimeError(f"h2load gave no totals:\n{text[-2000:]}")
    seconds = float(m.group(1)) / (1000.0 if m.group(2) == "ms" else 1.0)
    ok = int(codes.group(1))
    failed = int(counts.group(1)) - ok + int(counts.group(3)) + int(counts.group(4))
    return Load(seconds, ok, failed)


def h2load(
    port: int, stream_file: Path, cpus: set[int] | None, *, duration: float, streams: int
) -> subprocess.Popen[str]:
    """One h2load client process on one ext_proc port: 4 connections, `streams` in flight in all."""
    prefix = ["taskset", "-c", ",".join(map(str, sorted(cpus)))] if cpus is not None else []
    size = ["-D", f"{duration:g}"] if duration else ["-n", "1"]
    conns = 4 if duration else 1
    return subprocess.Popen(
        [
            *prefix, "h2load", *size, "-c", str(conns), "-m", str(max(1, streams // conns)), "-t", "1",
            f"--data={stream_file}", "-H", "content-type: application/grpc", "-H", "te: trailers",
            f"http://127.0.0.1:{port}{PATH}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


def served(epp: EppProcess) -> int:
    """Requests the EPP has routed, by its own metrics."""
    return int(epp.metric_value("inference_objective_request_total"))


def drive(ports: Sequence[int], stream_file: Path, cpus: set[int] | None, *, duration: float, streams: int) -> Load:
    procs = [h2load(p, stream_file, cpus, duration=duration, streams=streams) for p in ports]
    loads = []
    for proc in procs:
        out, _ = proc.communicate(timeout=(duration or FIRST_STREAM_S) + 60)
        loads.append(parse_h2load(out))
    return Load(max(x.seconds for x in loads), sum(x.done for x in loads), sum(x.failed for x in loads))


def run_setup(row: Row, epp: EppProcess, ports: list[int], pids: list[int], stream_file: Path, args: Any) -> None:
    s = row.setup
    for pid, cpus in zip(pids, s.epp_cpus, strict=True):
        pin(pid, cpus)
    loaded = ports[: s.fronts_loaded]
    drive(loaded, stream_file, s.load_cpus, duration=1, streams=args.streams)  # settle after the new pinning
    time.sleep(0.5)  # what the settling run left in flight is routed or dropped before the count starts
    before = served(epp)
    cpu0 = [cpu_seconds(p) for p in pids]
    load = drive(loaded, stream_file, s.load_cpus, duration=args.duration, streams=args.streams)
    used = [cpu_seconds(p) - c for p, c in zip(pids, cpu0, strict=True)]
    counted = served(epp) - before
    # h2load stops at its deadline with up to `streams` per port still in flight: routed, never answered.
    if not 0 <= counted - load.done <= args.streams * len(loaded):
        raise RuntimeError(
            f"{s.name}: h2load saw {load.done} requests answered, the EPP routed {counted}; see the EPP's log"
        )
    row.failed += load.failed
    if load.done:
        row.rps.append(load.done / load.seconds)
        row.cores.append(sum(used) / load.seconds)
        row.ms.append([u * 1000 / load.done for u in used])


def serve_args(workers: int, addrs: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    """`llm-epp serve` for one setup: plaintext, any free ports, `--workers` above one, then `extra` (which may
    override any of these, e.g. `--tracing=true`: `EppProcess` turns tracing off unless it is named)."""
    workers_args = ["--workers", str(workers)] if workers > 1 else []
    return [
        "--endpoints", ",".join(addrs), "--secure-serving=false", "-v", "1", "--grpc-port", "0",
        *workers_args, *extra,
    ]  # fmt: skip


def start_epps(
    counts: Sequence[int], addrs: list[str], workdir: Path, stream_file: Path, extra: Sequence[str] = ()
) -> dict[int, Started]:
    """One EPP per worker count (`extra`: more `llm-epp serve` arguments), each port warmed by one stream (the
    first waits 10 s; all wait together)."""
    epps: list[EppProcess] = []
    started: dict[int, Started] = {}
    try:
        for workers in counts:
            epp = EppProcess(
                *serve_args(workers, addrs, extra), log_path=workdir / f"epp-{workers}.log", startup_timeout=120
            )
            epps.append(epp)
            epp.start()
            info: dict[str, Any] = dict(epp.ports)
            ports: list[int] = info.get("grpc_workers") or [epp.grpc_port]
            started[workers] = Started(epp, ports, [epp.pid, *(info.get("worker_pids") or [])])
        ports = [p for s in started.values() for p in s.ports]
        load = drive(ports, stream_file, ALL, duration=0, streams=1)
        if load.done != len(ports):
            raise RuntimeError(f"{len(ports) - load.done} of {len(ports)} warm-up streams were not answered")
    except BaseException:
        for epp in epps:
            epp.stop()
        raise
    return started


@dataclass
class Started:
    epp: EppProcess
    ports: list[int]
    pids: list[int]  # the single process; or the serving process, then each front


def _med(values: list[float], fmt: str = ".3f") -> str:
    return format(statistics.median(values), fmt) if values else "-"


def render(rows: list[Row], out: list[str]) -> None:
    out.append(
        "| setup | req/s median (range) | EPP cores busy | CPU ms/req: one process, or the serving process "
        "| CPU ms/req: the fronts together | failed |"
    )
    out.append("|---|---|---:|---:|---:|---:|")
    for r in rows:
        if not r.rps:
            out.append(f"| {r.setup.name} | - | - | - | - | {r.failed} |")
            continue
        rps = f"{statistics.median(r.rps):.0f} ({min(r.rps):.0f}-{max(r.rps):.0f})"
        first = statistics.median(m[0] for m in r.ms)
        fronts = f"{statistics.median(sum(m[1:]) for m in r.ms):.3f}" if r.setup.workers > 1 else "-"
        out.append(f"| {r.setup.name} | {rps} | {_med(r.cores, '.2f')} | {first:.3f} | {fronts} | {r.failed} |")
    out.append("")


def projection(single_ms: float, front_ms: float, serving_ms: float, max_workers: int = 4) -> list[str]:
    """Requests/s per core from CPU per request, and N fronts on N + 1 cores against one process on one."""
    single, front, serving = 1000 / single_ms, 1000 / front_ms, 1000 / serving_ms
    out = [
        f"Per core at full load: one process {single:,.0f} req/s ({single_ms:.3f} ms), a front {front:,.0f} "
        f"({front_ms:.3f} ms), the serving process {serving:,.0f} ({serving_ms:.3f} ms).\n",
        "| workers | cores (fronts + serving process) | projected req/s | vs 1 process on 1 core | bound by |",
        "|---:|---:|---:|---:|---|",
    ]
    for n in range(1, max_workers + 1):
        rps = min(n * front, serving)
        out.append(
            f"| {n} | {n + 1} | {rps:,.0f} | {rps / single:.2f}x | "
            f"{'the fronts' if n * front < serving else 'the serving process'} |"
        )
    out.append("")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=6.0, help="seconds per measurement (default 6)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of alternating setups (default 2)")
    p.add_argument("--workload", choices=("small", "chat"), default="small", help="the request (default small)")
    p.add_argument("--streams", type=int, default=64, help="streams in flight per ext_proc port (default 64)")
    p.add_argument(
        "--epp-args",
        default="",
        help="more llm-epp serve arguments, space-separated (tracing is off unless they name --tracing)",
    )
    p.add_argument("--output", help="also write the Markdown report here")
    args = p.parse_args(argv)
    if args.duration <= 0 or args.rounds < 1 or args.streams < 1:
        p.error("--duration must be above 0, --rounds and --streams at least 1")
    missing = [tool for tool in ("h2load", "taskset") if shutil.which(tool) is None]
    if missing:
        print(
            f"benchmarks.worker_ceiling needs {' and '.join(missing)} on PATH "
            "(Debian: apt-get install nghttp2-client util-linux)",
            file=sys.stderr,
        )
        return 2
    if (os.cpu_count() or 1) < 2:
        print("benchmarks.worker_ceiling needs at least 2 CPUs", file=sys.stderr)
        return 2
    out = [
        f"## Ceilings per core, without Envoy\n\n`{command_line('benchmarks.worker_ceiling', argv)}`; {machine()}\n",
        f"Workload {args.workload}; h2load on the ext_proc ports ({args.streams} streams in flight per port over "
        "4 connections), "
        f"{args.duration:g} s x {args.rounds} rounds per setup, default config, plaintext, "
        f"{'llm-epp arguments `' + args.epp_args + '`' if args.epp_args else 'tracing off'}, 3 stand-in model "
        "servers scraped as usual. CPU per request is each process's own.\n",
    ]
    rows = [Row(s) for s in SETUPS]
    t0 = time.monotonic()
    with (
        keeping_partial_results(out) as outcome,
        tempfile.TemporaryDirectory() as tmp,
        EnvoyProcess(direct_response_backends(3)) as backends,
    ):
        workdir = Path(tmp)
        stream_file = workdir / "stream.bin"
        stream_file.write_bytes(request_stream(args.workload))
        addrs = [f"127.0.0.1:{port}" for port in backends.listener_ports.values()]
        assert backends.proc is not None
        pin(backends.proc.pid, {0})
        epps = start_epps(sorted({s.workers for s in SETUPS}), addrs, workdir, stream_file, args.epp_args.split())
        try:
            for rnd in range(args.rounds):
                for row in rows if rnd % 2 == 0 else rows[::-1]:
                    e = epps[row.setup.workers]
                    run_setup(row, e.epp, e.ports, e.pids, stream_file, args)
                    print(f"  round {rnd + 1}: {row.setup.name}: {row.rps[-1]:.0f} req/s", file=sys.stderr, flush=True)
        finally:
            for e in epps.values():
                e.epp.stop()
    render(rows, out)
    single, own, both = rows[0], rows[1], rows[2]
    if single.ms and own.ms and both.ms:
        front_ms = statistics.median(sum(m[1:]) for m in own.ms)
        serving_ms = statistics.median(m[0] for m in both.ms)  # the serving process with both fronts loaded
        out.extend(projection(statistics.median(m[0] for m in single.ms), front_ms, serving_ms))
    out.append(f"Wall time {time.monotonic() - t0:.0f} s; load average at the end {os.getloadavg()[0]:.1f}.")
    emit(out, args.output)
    return outcome.status


if __name__ == "__main__":
    raise SystemExit(main())
