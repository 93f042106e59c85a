"""Throughput and EPP CPU per request at 1 vs 2 ext_proc worker processes, through a real Envoy.

Small non-streamed requests, closed loop (`wrk`, 32 connections), Envoy (`--concurrency 1` when pinned to one
core, 2 when unpinned) in front of
`llm-epp serve` with the default config over 3 stand-in model servers (Envoy direct_response listeners).
The EPP serves plaintext (TLS costs the same per request in every setup), response headers SEND.

Setups, alternating within each round (A B C D A B C D):
  * 1 worker, pinned: the whole EPP on CPU 1; Envoy, the stand-ins and wrk on CPU 0 (the placement the
    Python gRPC performance note measured);
  * 2 workers, pinned: the serving process and every front on CPU 1, the rest on CPU 0 (the same core
    budget as the row above: what the extra process hop costs);
  * 2 workers, one core each: front i on CPU i, the serving process on CPU 1, the rest unpinned;
  * 1 worker and 2 workers, unpinned.
EPP CPU counts the serving process and every front. The box has 2 cores shared by Envoy (~0.4-0.5 ms CPU per
request), the stand-ins and wrk, so 2 workers cannot reach twice one worker's throughput here: the report
shows how far the whole stack is from using both cores, and EPP CPU per request says what a worker costs.

    python -m benchmarks.workers [--duration 8] [--rounds 2] [--connections 32] [--output FILE]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.overhead import BODY, cpu_seconds, direct_response_backends
from benchmarks.report import command_line, emit, keeping_partial_results, machine
from llm_epp.gateway.envoy_config import EnvoyConfigOptions, build_bootstrap
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess

ALL = None  # no pinning


def pin(pid: int, cpus: set[int] | None) -> None:
    """Every thread of `pid` (threads created later inherit it); None = all CPUs."""
    mask = cpus if cpus is not None else set(range(os.cpu_count() or 1))
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), mask)
        except OSError:
            pass  # a thread that just ended


@dataclass(frozen=True)
class Setup:
    name: str
    workers: int
    scheduler_cpu: set[int] | None
    front_cpus: tuple[set[int] | None, ...]
    rest_cpu: set[int] | None  # Envoy, stand-ins, wrk


SETUPS = (
    Setup("1 worker, EPP on CPU 1, rest on CPU 0", 1, {1}, (), {0}),
    Setup("2 workers, all EPP processes on CPU 1, rest on CPU 0", 2, {1}, ({1}, {1}), {0}),
    Setup("2 workers, front i on CPU i, rest unpinned", 2, {1}, ({0}, {1}), ALL),
    Setup("1 worker, unpinned", 1, ALL, (), ALL),
    Setup("2 workers, unpinned", 2, ALL, (ALL, ALL), ALL),
)


@dataclass
class Row:
    setup: Setup
    rps: list[float] = field(default_factory=list)
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    epp_ms: list[float] = field(default_factory=list)
    envoy_ms: list[float] = field(default_factory=list)
    scheduler_share: list[float] = field(default_factory=list)
    errors: int = 0


_LAT = re.compile(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", re.M)


def wrk(
    url: str, script: Path, duration: int, connections: int, cpus: set[int] | None
) -> tuple[float, float, float, int, int]:
    prefix = ["taskset", "-c", ",".join(map(str, sorted(cpus)))] if cpus is not None else []
    out = subprocess.run(
        [*prefix, "wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        timeout=duration + 60,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = int(m.group(1)) if m else 0
    lat = {pct: float(v) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[u] for pct, v, u in _LAT.findall(out)}
    return rps, lat.get("50", 0.0), lat.get("99", 0.0), total, errors


def run_setup(
    row: Row, addrs: list[str], backends_pid: int, script: Path, args: argparse.Namespace, workdir: Path
) -> None:
    s = row.setup
    epp_args = ["--endpoints", ",".join(addrs), "--secure-serving=false", "-v", "1", "--workers", str(s.workers)]
    with ExitStack() as stack:
        epp = stack.enter_context(
            EppProcess(*epp_args, log_path=workdir / f"epp-{time.monotonic_ns()}.log", startup_timeout=120)
        )
        info: dict[str, Any] = dict(epp.ports)  # with workers it also lists their ports and pids
        ports: list[int] = info.get("grpc_workers") or [epp.grpc_port]
        fronts: list[int] = list(info.get("worker_pids") or [])
        pin(epp.pid, s.scheduler_cpu)
        for pid, cpus in zip(fronts, s.front_cpus, strict=True):
            pin(pid, cpus)
        opts = EnvoyConfigOptions(listen_port=0, admin_port=0, epp_port=ports[0], epp_ports=tuple(ports), epp_tls=False)
        # One Envoy worker thread when Envoy has one core, two when it floats over both.
        envoy = stack.enter_context(EnvoyProcess(build_bootstrap(opts), concurrency=1 if s.rest_cpu else 2))
        assert envoy.proc is not None
        pin(envoy.proc.pid, s.rest_cpu)
        pin(backends_pid, s.rest_cpu)
        url = envoy.url("/v1/completions")
        wrk(url, script, 2, args.connections, s.rest_cpu)  # warm-up
        pids = [epp.pid, *fronts]
        cpu0 = [cpu_seconds(p) for p in pids]
        env0 = cpu_seconds(envoy.proc.pid)
        rps, p50, p99, total, errors = wrk(url, script, args.duration, args.connections, s.rest_cpu)
        used = [cpu_seconds(p) - c for p, c in zip(pids, cpu0, strict=True)]
        row.rps.append(rps)
        row.p50.append(p50)
        row.p99.append(p99)
        row.errors += errors
        if total:
            row.epp_ms.append(sum(used) * 1000 / total)
            row.envoy_ms.append((cpu_seconds(envoy.proc.pid) - env0) * 1000 / total)
            if fronts:
                row.scheduler_share.append(used[0] / sum(used) if sum(used) else 0.0)
        restarted = "worker_died" in epp.log()
        if restarted:
            raise RuntimeError(f"a worker died during {s.name}; see {epp.log_path}")


def hop_cost(requests: int, concurrency: int) -> list[str]:
    """The Director alone, in-process vs through the worker path (frames over a Unix socket to a Hub in
    this same process, one event loop): the hop's cost per request without gRPC or Envoy."""
    import asyncio
    import itertools
    import json

    from llm_epp.composition import build_request_path
    from llm_epp.datalayer.static import parse_endpoint_list
    from llm_epp.framework import NullRecorder
    from llm_epp.framework.plugin import seeded_random
    from llm_epp.observability import HealthState
    from llm_epp.requestcontrol.decision import Outcome, RequestInput
    from llm_epp.workers.hub import Hub
    from llm_epp.workers.remote import RemoteDirector

    def director() -> Any:
        path = build_request_path(recorder=NullRecorder(), random_source=seeded_random(1))
        path.datastore.replace_all(parse_endpoint_list("10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000"))
        return path.director

    headers = {":path": "/v1/completions", "content-type": "application/json"}
    bodies = [json.dumps({"model": "m", "prompt": f"Say hello {i}.", "max_tokens": 8}).encode() for i in range(64)]
    ids = itertools.count()

    async def drive(route: Any, finish: Any) -> float:
        async def one() -> None:
            i = next(ids)
            d = await route(RequestInput(f"r{i}", headers, bodies[i % 64]))
            finish(d.handle, Outcome(complete=True, status=200))

        async def worker(n: int) -> None:
            for _ in range(n):
                await one()

        t0 = time.process_time()
        await asyncio.gather(*(worker(requests // concurrency) for _ in range(concurrency)))
        return (time.process_time() - t0) * 1e6 / requests

    async def main() -> tuple[float, float]:
        local = director()
        in_process = await drive(local.route, local.finish)
        with tempfile.TemporaryDirectory() as tmp:
            sock = str(Path(tmp) / "s")
            hub = Hub(
                director(),
                HealthState(),
                b"t" * 32,
                with_scores=False,
                on_ready=lambda i, p: None,
                on_lost=lambda i: None,
            )
            await hub.start(sock)
            remote = RemoteDirector(HealthState())
            await asyncio.get_running_loop().create_unix_connection(lambda: remote.conn, sock)
            remote.conn.send_raw(b"t" * 32)
            through = await drive(remote.route, remote.finish)
            remote.conn.close()
            await hub.stop()
        return in_process, through

    in_process, through = asyncio.run(main())
    return [
        f"Director alone, {requests} requests, {concurrency} in flight, CPU µs per request (both ends of the "
        "socket in this one process, so the figure is the sum of both sides' work):\n",
        "| path | CPU µs/request |",
        "|---|---:|",
        f"| in-process `Director.route` + `finish` | {in_process:.0f} |",
        f"| through the worker path (frames, Unix socket, Hub) | {through:.0f} |",
        f"| the hop | {through - in_process:+.0f} |",
        "",
    ]


def _med(values: list[float], fmt: str = ".2f") -> str:
    return format(statistics.median(values), fmt) if values else "-"


def render(rows: list[Row], out: list[str]) -> None:
    base = {r.setup.rest_cpu is None: statistics.median(r.rps) for r in rows if r.setup.workers == 1 and r.rps}
    out.append(
        "| setup | req/s median (range) | vs 1 worker, same placement | p50 ms | p99 ms | EPP CPU ms/req "
        "| serving process share of EPP CPU | Envoy CPU ms/req | errors |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        rps = statistics.median(r.rps) if r.rps else 0.0
        ref = base.get(r.setup.rest_cpu is None, 0.0)
        ratio = f"{rps / ref:.2f}" if ref else "-"
        spread = f"{min(r.rps):.0f}-{max(r.rps):.0f}" if r.rps else "-"
        share = f"{statistics.median(r.scheduler_share):.0%}" if r.scheduler_share else "-"
        out.append(
            f"| {r.setup.name} | {rps:.0f} ({spread}) | {ratio} | {_med(r.p50)} | {_med(r.p99)} | {_med(r.epp_ms)} "
            f"| {share} | {_med(r.envoy_ms)} | {r.errors} |"
        )
    out.append("")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=int, default=8, help="seconds per measurement (default 8)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of alternating setups (default 2)")
    p.add_argument("--connections", type=int, default=32, help="wrk connections (default 32)")
    p.add_argument("--hop-requests", type=int, default=4000, help="requests of the in-process hop measurement")
    p.add_argument("--output", help="also write the Markdown report here")
    args = p.parse_args(argv)
    if shutil.which("wrk") is None or shutil.which("taskset") is None:
        print(
            "benchmarks.workers needs wrk and taskset on PATH (Debian: apt-get install wrk util-linux)", file=sys.stderr
        )
        return 2
    if (os.cpu_count() or 1) < 2:
        print("benchmarks.workers needs at least 2 CPUs", file=sys.stderr)
        return 2
    out = [
        f"## ext_proc worker processes\n\n`{command_line('benchmarks.workers', argv)}`; {machine()}\n",
        f"wrk {args.connections} connections, {args.duration} s x {args.rounds} rounds per setup, 3 stand-in model "
        "servers, default config, plaintext, Envoy --concurrency 1 when pinned to one core, 2 when unpinned.\n",
    ]
    out.extend(hop_cost(args.hop_requests, 32))
    rows = [Row(s) for s in SETUPS]
    t0 = time.monotonic()
    with (
        keeping_partial_results(out) as outcome,
        tempfile.TemporaryDirectory() as tmp,
        EnvoyProcess(direct_response_backends(3)) as backends,
    ):
        workdir = Path(tmp)
        script = workdir / "post.lua"
        script.write_text(
            f"wrk.method = 'POST'\nwrk.body = '{BODY}'\nwrk.headers['content-type'] = 'application/json'\n"
        )
        addrs = [f"127.0.0.1:{port}" for port in backends.listener_ports.values()]
        assert backends.proc is not None
        for rnd in range(args.rounds):
            for row in rows:
                run_setup(row, addrs, backends.proc.pid, script, args, workdir)
                print(f"  round {rnd + 1}: {row.setup.name}: {row.rps[-1]:.0f} req/s", file=sys.stderr, flush=True)
    render(rows, out)
    out.append(f"Wall time {time.monotonic() - t0:.0f} s; load average at the end {os.getloadavg()[0]:.1f}.")
    emit(out, args.output)
    return outcome.status


if __name__ == "__main__":
    raise SystemExit(main())
