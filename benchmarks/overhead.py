"""EPP overhead through a real Envoy, side by side in one run (the protocol of the design doc's benchmarks §2).

Backends everywhere but part 2 are Envoy direct_response listeners (near-zero cost; they also answer /health and
/metrics), so the figures are the gateway's.

Part 3, open loop at fixed rates (100, 300, 1000 req/s; the generator is ``benchmarks.openloop``), targets
alternating within each round:
  * direct to one backend (the floor);
  * Envoy ROUND_ROBIN to the backends (no ext_proc): the baseline;
  * Envoy + llm-epp, default config (FULL_DUPLEX_STREAMED request body, response body NONE, TLS);
  * sglang-router 0.3.2 cache_aware in front of the same backends (private venv, see ``benchmarks.venvs``).
  Latency p50/p99, added latency vs ROUND_ROBIN and vs direct, failures, achieved rate, EPP and gateway CPU
  seconds per 1,000 requests, the generator's own lag.  Then a short search: the highest step rate (50, 100, 200,
  300, 500, 700, 1000) at which Envoy + llm-epp's p99 stays within 10 ms of ROUND_ROBIN's.
Part 4, the EPP's resident memory (VmRSS) every 10% of 100k requests with distinct prompts (closed loop).
Part picker (first in a full run), llm-epp (default configuration, plaintext) beside the trivial ext_proc picker of
  ``benchmarks.trivial_picker`` behind the same Envoy configuration, and Envoy ROUND_ROBIN: closed-loop throughput
  (wrk) with the picker's CPU per request, then open-loop added latency at 100 and 500 req/s (``--picker-rates``).
  ``--picker-tls`` and ``--epp-args "--tracing=true ..."`` measure other llm-epp settings against the same floor.
Part 1, small non-streamed requests: wrk (closed loop, 32 connections) against Envoy ROUND_ROBIN, Envoy +
  llm-epp (default) and the same with response headers SKIPped (one round trip less per request).
Part 2, streamed 1,000-token responses (a stub server writing one SSE event per token, 1 ms apart):
  Envoy ROUND_ROBIN vs Envoy + llm-epp with response bodies NONE vs FULL_DUPLEX_STREAMED.

Every figure comes from this one run; configurations alternate (A B C A B C) to spread the noise. Part 1 needs
`wrk` on PATH (Debian: apt-get install wrk) and is skipped without it. The full run takes about 10 minutes on
2 cores (the RSS part is bound by the EPP's throughput). Ctrl-C or SIGTERM writes what was measured and stops
every child process. ``--smoke``: parts 3 and 4 on a tiny budget (< 1 min), for the test suite.

    python -m benchmarks.overhead [--part picker|1|2|3|4|all] [--smoke [--peers]] [--rates 100,300,1000]
        [--open-duration 8] [--rounds 2] [--rss-requests 100000] [--duration 10] [--seed 1] [--output FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import string
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.openloop import LoadResult, percentile, run_closed_loop, run_open_loop, summary
from benchmarks.report import command_line, machine
from benchmarks.venvs import ToolUnavailableError, ensure
from llm_epp.gateway.envoy_config import EnvoyConfigOptions, build_bootstrap
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess
from llm_epp.sim.stub import BackendPool

ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
BODY = json.dumps({"model": "m", "prompt": "Say hello.", "max_tokens": 8})
REPLY = json.dumps(
    {
        "id": "x",
        "object": "text_completion",
        "model": "m",
        "choices": [{"text": "hi"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
)

METRICS = "".join(
    f'# TYPE {name} gauge\n{name}{{model_name="m"}} 0\n'
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")
)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def direct_response_backends(n: int, content_type: str = "application/json") -> dict[str, Any]:
    """One Envoy worker serving a fixed completion on n listeners: stand-in model servers that cost little.
    `content_type` labels the completion (``text/event-stream`` makes the EPP treat it as a streamed answer).

    Each also answers ``GET /health`` (200), ``GET /metrics`` (idle vLLM gauges) and 404 on the server-info
    paths sglang-router asks for, so the EPP and sglang-router can both use them."""
    listeners = []
    for i in range(n):
        hcm = {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
            "HttpConnectionManager",
            "stat_prefix": f"b{i}",
            "codec_type": "HTTP1",  # sglang-router probes workers with an HTTP/2 preface; this answers it 400
            "route_config": {
                "virtual_hosts": [
                    {
                        "name": "all",
                        "domains": ["*"],
                        "routes": [
                            *(
                                {"match": {"path": path}, "direct_response": {"status": 404}}
                                for path in ("/server_info", "/get_server_info", "/model_info", "/get_model_info")
                            ),
                            {"match": {"path": "/health"}, "direct_response": {"status": 200}},
                            {
                                "match": {"path": "/metrics"},
                                "direct_response": {"status": 200, "body": {"inline_string": METRICS}},
                            },
                            {
                                "match": {"prefix": "/"},
                                "direct_response": {"status": 200, "body": {"inline_string": REPLY}},
                                "response_headers_to_add": [{"header": {"key": "content-type", "value": content_type}}],
                            },
                        ],
                    }
                ]
            },
            "http_filters": [
                {  # answer after the whole request body: a reply sent earlier makes Envoy close the connection
                    "name": "envoy.filters.http.buffer",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
                        "max_request_bytes": 1048576,
                    },
                },
                {
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
                },
            ],
        }
        listeners.append(
            {
                "name": f"backend{i}",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                "filter_chains": [
                    {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}
                ],
            }
        )
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {"listeners": listeners},
    }


EPP_ENV: dict[str, str] = {}  # --epp-env: extra environment of every llm-epp the run starts


@contextmanager
def run_epp(endpoints: list[str], workdir: Path, tls: bool = True) -> Iterator[EppProcess]:
    with EppProcess(
        "--endpoints",
        ",".join(endpoints),
        "-v",
        "1",
        f"--secure-serving={'true' if tls else 'false'}",
        env=EPP_ENV,
        log_path=workdir / f"epp-{time.monotonic_ns()}.log",
    ) as epp:
        yield epp


@dataclass
class Result:
    name: str
    rps: list[float] = field(default_factory=list)
    p50_ms: list[float] = field(default_factory=list)
    p99_ms: list[float] = field(default_factory=list)
    epp_ms_per_req: list[float] = field(default_factory=list)
    envoy_ms_per_req: list[float] = field(default_factory=list)
    errors: int = 0

    def row(self, base_rps: float) -> str:
        def med(v: list[float]) -> str:
            return f"{statistics.median(v):.2f}" if v else "-"

        rps = statistics.median(self.rps) if self.rps else 0.0
        ratio = f"{rps / base_rps:.2f}" if base_rps else "-"
        spread = f"{min(self.rps):.0f}-{max(self.rps):.0f}" if self.rps else "-"
        return (
            f"| {self.name} | {rps:.0f} ({spread}) | {ratio} | {med(self.p50_ms)} | {med(self.p99_ms)} | "
            f"{med(self.epp_ms_per_req)} | {med(self.envoy_ms_per_req)} | {self.errors} |"
        )


_LAT = re.compile(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", re.M)


def wrk(url: str, script: Path, duration: int, connections: int) -> tuple[float, float, float, int, int]:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        timeout=duration + 60,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        errors += sum(int(x) for x in m.groups())
    lat = {}
    for pct, value, unit in _LAT.findall(out):
        lat[pct] = float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]
    return rps, lat.get("50", 0.0), lat.get("99", 0.0), total, errors


def measure(
    res: Result, url: str, script: Path, duration: int, connections: int, epp_pid: int | None, envoy_pid: int
) -> None:
    epp0 = cpu_seconds(epp_pid) if epp_pid else 0.0
    env0 = cpu_seconds(envoy_pid)
    rps, p50, p99, total, errors = wrk(url, script, duration, connections)
    res.rps.append(rps)
    res.p50_ms.append(p50)
    res.p99_ms.append(p99)
    res.errors += errors
    if total:
        if epp_pid:
            res.epp_ms_per_req.append((cpu_seconds(epp_pid) - epp0) * 1000 / total)
        res.envoy_ms_per_req.append((cpu_seconds(envoy_pid) - env0) * 1000 / total)


def part1(args: argparse.Namespace, workdir: Path, out: list[str]) -> None:
    script = workdir / "post.lua"
    script.write_text(f"wrk.method = 'POST'\nwrk.body = '{BODY}'\nwrk.headers['content-type'] = 'application/json'\n")
    with ExitStack() as stack:
        backends = stack.enter_context(EnvoyProcess(direct_response_backends(3)))
        addrs = [f"127.0.0.1:{p}" for p in backends.listener_ports.values()]
        epp = stack.enter_context(run_epp(addrs, workdir))
        base: dict[str, Any] = dict(listen_port=0, admin_port=0, epp_port=epp.grpc_port, epp_tls=True)
        gateways: dict[str, EnvoyProcess] = {
            "Envoy ROUND_ROBIN (no EPP)": EnvoyProcess(
                build_bootstrap(
                    EnvoyConfigOptions(listen_port=0, admin_port=0, no_epp=True, fallback_endpoints=tuple(addrs))
                )
            ),
            "Envoy + llm-epp (default)": EnvoyProcess(build_bootstrap(EnvoyConfigOptions(**base))),
            "Envoy + llm-epp, response headers SKIP": EnvoyProcess(
                build_bootstrap(EnvoyConfigOptions(**base, response_header_mode="SKIP"))
            ),
        }
        for g in gateways.values():
            stack.enter_context(g)
        results = {name: Result(name) for name in gateways}
        for g in gateways.values():  # warm-up
            wrk(g.url("/v1/completions"), script, 2, args.connections)
        for rnd in range(args.rounds):
            for name, g in gateways.items():
                pid = None if "no EPP" in name else epp.pid
                assert g.proc is not None
                measure(
                    results[name], g.url("/v1/completions"), script, args.duration, args.connections, pid, g.proc.pid
                )
                print(f"  round {rnd + 1}: {name}: {results[name].rps[-1]:.0f} req/s", file=sys.stderr)
        base_rps = statistics.median(next(iter(results.values())).rps)
        out.append(
            f"### Small non-streamed requests (wrk, {args.connections} connections, {args.duration}s x "
            f"{args.rounds} rounds)\n"
        )
        out.append(
            "| gateway | req/s median (range) | vs round robin | p50 ms | p99 ms | EPP CPU ms/req | "
            "Envoy CPU ms/req | errors |"
        )
        out.append("|---|---|---|---|---|---|---|---|")
        out.extend(r.row(base_rps) for r in results.values())
        out.append("")


def _stream_load(url: str, concurrency: int, duration: float, tokens: int) -> tuple[list[float], int]:
    body = {
        "model": "m",
        "prompt": "go",
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    latencies: list[float] = []
    errors = 0
    deadline = time.monotonic() + duration
    lock = threading.Lock()

    def worker() -> None:
        nonlocal errors
        with httpx.Client(timeout=60) as c:
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                try:
                    with c.stream("POST", url, json=body) as r:
                        n = sum(1 for _ in r.iter_raw())
                        ok = r.status_code == 200 and n > 0
                except httpx.HTTPError:
                    ok = False
                with lock:
                    if ok:
                        latencies.append((time.perf_counter() - t0) * 1000)
                    else:
                        errors += 1

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, errors


def part2(args: argparse.Namespace, workdir: Path, out: list[str]) -> None:
    tokens = 1000
    with ExitStack() as stack:
        pool = stack.enter_context(BackendPool(2, itl_s=0.001))
        epp = stack.enter_context(run_epp(pool.addresses, workdir))
        base: dict[str, Any] = dict(listen_port=0, admin_port=0, epp_port=epp.grpc_port, epp_tls=True)
        gateways = {
            "Envoy ROUND_ROBIN (no EPP)": EnvoyProcess(
                build_bootstrap(
                    EnvoyConfigOptions(
                        listen_port=0, admin_port=0, no_epp=True, fallback_endpoints=tuple(pool.addresses)
                    )
                )
            ),
            "llm-epp, response body NONE": EnvoyProcess(build_bootstrap(EnvoyConfigOptions(**base))),
            "llm-epp, response body FULL_DUPLEX_STREAMED": EnvoyProcess(
                build_bootstrap(EnvoyConfigOptions(**base, response_body_mode="FULL_DUPLEX_STREAMED"))
            ),
        }
        for g in gateways.values():
            stack.enter_context(g)
        rows: dict[str, dict[str, list[float]]] = {
            n: {"p50": [], "p99": [], "epp": [], "n": [], "err": []} for n in gateways
        }
        for rnd in range(args.rounds):
            for name, g in gateways.items():
                cpu0 = cpu_seconds(epp.pid)
                lat, errors = _stream_load(g.url("/v1/completions"), args.stream_concurrency, args.duration, tokens)
                cpu = cpu_seconds(epp.pid) - cpu0
                r = rows[name]
                if lat:
                    qs = statistics.quantiles(lat, n=100)
                    r["p50"].append(qs[49])
                    r["p99"].append(qs[98])
                    r["epp"].append(cpu * 1000 / len(lat) if "no EPP" not in name else 0.0)
                r["n"].append(len(lat))
                r["err"].append(errors)
                print(f"  round {rnd + 1}: {name}: {len(lat)} streams", file=sys.stderr)
        out.append(
            f"### Streamed {tokens}-token responses (1 ms between tokens, {args.stream_concurrency} "
            f"concurrent streams, {args.duration}s x {args.rounds} rounds)\n"
        )
        out.append("| gateway | streams | p50 ms | p99 ms | EPP CPU ms per stream | errors |")
        out.append("|---|---|---|---|---|---|")
        for name, r in rows.items():

            def med(v: list[float]) -> str:
                return f"{statistics.median(v):.1f}" if v else "-"

            epp_cpu = "-" if "no EPP" in name else med(r["epp"])
            out.append(
                f"| {name} | {int(sum(r['n']))} | {med(r['p50'])} | {med(r['p99'])} | {epp_cpu} | "
                f"{int(sum(r['err']))} |"
            )
        out.append("")


# ---------------------------------------------------------------------------------------------------------------
# The EPP-overhead protocol (design doc, benchmarks §2): open-loop fixed rates against near-zero-cost backends.


DIRECT = "direct to a backend (floor)"
RR = "Envoy ROUND_ROBIN (no EPP)"
EPP = "Envoy + llm-epp (default)"
SGL = "sglang-router cache_aware"
WORDS_PER_PROMPT = 12  # ~330-byte bodies for the rate measurements
RSS_WORDS = 80  # ~0.8 KB bodies for the memory run: ~8 new prefix blocks a request fill the index in ~12k requests
INDEX_SIZE = "inference_extension_prefix_indexer_size"


def prompt_bodies(seed: int, tag: str, n: int, system_prompts: int = 16, words: int = WORDS_PER_PROMPT) -> list[bytes]:
    """``n`` small completion bodies: one of a few shared "system" prefixes, then ``words`` random words unique to
    each request (so the prefix index keeps meeting new blocks, as in production)."""
    rng = random.Random(f"{seed}-{tag}")

    def some(k: int) -> str:
        return " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 8))) for _ in range(k))

    systems = [f"You are assistant {j}. {some(30)}." for j in range(system_prompts)]
    return [
        json.dumps(
            {
                "model": "m",
                "prompt": f"{systems[i % system_prompts]} [{tag}-{i}] {some(words)}?",
                "max_tokens": 8,
            }
        ).encode()
        for i in range(n)
    ]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def settle(pids: list[int], timeout: float = 10.0) -> None:
    """Wait (at most ``timeout``) until the processes together use < 10% of a core: work queued by an overloaded
    measurement must not leak into the next one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = sum(cpu_seconds(p) for p in pids)
        time.sleep(0.25)
        if sum(cpu_seconds(p) for p in pids) - before < 0.025:
            return


@dataclass
class Target:
    name: str
    port: int
    proc_pid: int | None  # the gateway / router process, for CPU per request (None: direct)


@dataclass
class Cell:
    """Everything measured for one (target, rate), pooled over rounds."""

    load: LoadResult
    epp_cpu_s: float = 0.0
    proc_cpu_s: float = 0.0
    wall_s: float = 0.0
    epp_picks: float = 0.0

    def p(self, q: float) -> float:
        return percentile(self.load.service_ms, q)


@contextmanager
def run_sglang_router(worker_ports: list[int], workdir: Path) -> Iterator[tuple[int, int]]:
    """``smg launch`` (sglang-router 0.3.2, cache_aware, thresholds as in the peers recipe) in front of the
    workers; yields (port, pid) once it forwards a completion."""
    bindir = ensure("peers")
    port, mport = free_port(), free_port()
    cmd = [
        str(bindir / "smg"),
        "launch",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(mport),
        *("--policy", "cache_aware", "--cache-threshold", "0.3"),
        *("--balance-abs-threshold", "64", "--balance-rel-threshold", "1.5"),
        *("--eviction-interval-secs", "60", "--max-tree-size", "67108864"),
        *("--worker-startup-check-interval", "1", "--log-level", "warn"),
        "--worker-urls",
        *(f"http://127.0.0.1:{p}" for p in worker_ports),
    ]
    log = open(workdir / "sglang-router.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (workdir / "sglang-router.log").read_text(errors="replace").strip().splitlines()[-1:]
                last = re.sub(r"\x1b\[[0-9;]*m", "", " ".join(tail))
                raise RuntimeError(f"sglang-router did not forward a completion within 60 s; its log ends: {last}")
            try:
                r = httpx.post(
                    f"http://127.0.0.1:{port}/v1/completions",
                    content=BODY,
                    headers={"content-type": "application/json"},
                    timeout=2,
                    trust_env=False,
                )
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        yield port, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def measure_open(
    cells: dict[tuple[str, int], Cell],
    target: Target,
    rate: int,
    duration: float,
    bodies: list[bytes],
    epp: EppProcess,
    drain_s: float,
    label: str,
) -> Cell:
    watch = [epp.pid] + ([target.proc_pid] if target.proc_pid else [])
    for pid in watch:
        if not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            raise RuntimeError(f"process {pid} of {target.name!r} exited")
    settle(watch)
    picks0 = epp.metric_value("inference_objective_request_total") if target.name == EPP else 0.0
    epp0 = cpu_seconds(epp.pid)
    proc0 = cpu_seconds(target.proc_pid) if target.proc_pid else 0.0
    t0 = time.monotonic()
    res = run_open_loop(
        "127.0.0.1", target.port, "/v1/completions", bodies[: int(rate * duration)], rate, drain_s=drain_s
    )
    one = Cell(
        res,
        epp_cpu_s=cpu_seconds(epp.pid) - epp0,
        proc_cpu_s=(cpu_seconds(target.proc_pid) - proc0) if target.proc_pid else 0.0,
        wall_s=time.monotonic() - t0,
    )
    if target.name == EPP:
        one.epp_picks = epp.metric_value("inference_objective_request_total") - picks0
    cell = cells.get((target.name, rate))
    if cell is None:
        cells[(target.name, rate)] = cell = Cell(LoadResult(target_rate=rate))
    cell.load.merge(res)
    cell.epp_cpu_s += one.epp_cpu_s
    cell.proc_cpu_s += one.proc_cpu_s
    cell.wall_s += one.wall_s
    cell.epp_picks += one.epp_picks
    print(
        f"  {label} {target.name} @ {rate}/s: {res.ok} ok, {res.failed} failed, {res.achieved_rps:.0f}/s; "
        f"ms p50/p99/max {summary(res.service_ms)}; generator lag {summary(res.lag_ms)}"
        + (f" ({res.queued} waited for a connection)" if res.queued else ""),
        file=sys.stderr,
        flush=True,
    )
    return one


def _f(x: float, fmt: str = ".2f") -> str:
    return "-" if x != x else format(x, fmt)  # NaN -> "-"


RATES_LEGEND = """\
Backends: three Envoy `direct_response` listeners (one Envoy worker) answering a fixed completion. Each target gets
its own distinct prompts (16 shared "system" prefixes + a unique tail, ~330-byte bodies). Latency = from writing
the request to the last response byte, pooled over rounds; the generator's own lateness (write minus scheduled
send) is in the last column. Added latency = the target's percentile minus the baseline's percentile at the same
rate (a difference of percentiles, not a percentile of differences): "vs RR" subtracts Envoy ROUND_ROBIN (what the
EPP adds to an Envoy that routes anyway), "vs direct" subtracts the client talking to one backend directly (the
whole hop; the fair figure for sglang-router, which replaces the gateway rather than adding to it). CPU = user +
system seconds of the process (/proc/<pid>/stat) over the measurement window, including the drain, divided by the
successful requests; "gateway" is the Envoy in front, or sglang-router itself. "(N queued)": N requests found all
768 of the generator's connections busy (the target had fallen far behind) and waited for one; that wait counts
as lag, not latency, so such a row's latency understates what a client would see.
"""


def render_rates(cells: dict[tuple[str, int], Cell], targets: list[str], rates: list[int], out: list[str]) -> None:
    out.append(
        "| rate req/s | target | achieved req/s | ok | failed | p50 ms | p99 ms | added p50 / p99 vs RR ms | "
        "added p50 / p99 vs direct ms | EPP CPU s per 1k req | gateway CPU s per 1k req | generator lag p50 / p99 ms |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for rate in rates:
        rr = cells.get((RR, rate))
        direct = cells.get((DIRECT, rate))
        for name in targets:
            c = cells.get((name, rate))
            if c is None:
                continue
            ld = c.load

            def added(base: Cell | None, c: Cell = c) -> str:
                if base is None or not base.load.service_ms or not c.load.service_ms:
                    return "-"
                return f"{c.p(50) - base.p(50):+.2f} / {c.p(99) - base.p(99):+.2f}"

            per_k = 1000 / ld.ok if ld.ok else float("nan")
            epp_cpu = _f(c.epp_cpu_s * per_k, ".3f") if name == EPP else "-"
            gw_cpu = _f(c.proc_cpu_s * per_k, ".3f") if name not in (DIRECT,) else "-"
            out.append(
                f"| {rate} | {name} | {ld.achieved_rps:.0f} | {ld.ok} | {ld.failed} | {_f(c.p(50))} | {_f(c.p(99))} | "
                f"{added(rr) if name not in (RR, DIRECT) else '-'} | {added(direct) if name != DIRECT else '-'} | "
                f"{epp_cpu} | {gw_cpu} | {_f(percentile(ld.lag_ms, 50))} / {_f(percentile(ld.lag_ms, 99))}"
                f"{f' ({ld.queued} queued)' if ld.queued else ''} |"
            )
    out.append("")


def background_epp_cpu(cells: dict[tuple[str, int], Cell]) -> float:
    """EPP CPU seconds per second while the EPP served no requests (other targets' windows): its scraping and
    housekeeping."""
    cpu = sum(c.epp_cpu_s for (name, _), c in cells.items() if name != EPP)
    wall = sum(c.wall_s for (name, _), c in cells.items() if name != EPP)
    return cpu / wall if wall else float("nan")


def part_rates(args: argparse.Namespace, workdir: Path, out: list[str]) -> None:
    rates: list[int] = args.rates
    steps: list[int] = args.search_rates
    cells: dict[tuple[str, int], Cell] = {}
    search: dict[tuple[str, int], Cell] = {}
    names: list[str] = []
    sgl_note = ""
    verdicts: list[tuple[int, bool, str]] = []
    print(f"[rates] seed {args.seed}; rates {rates}; {args.open_duration}s x {args.rounds} rounds", file=sys.stderr)
    try:
        with ExitStack() as stack:
            backends = stack.enter_context(EnvoyProcess(direct_response_backends(3)))
            ports = list(backends.listener_ports.values())
            addrs = [f"127.0.0.1:{p}" for p in ports]
            epp = stack.enter_context(run_epp(addrs, workdir))
            rr_gw = stack.enter_context(
                EnvoyProcess(
                    build_bootstrap(
                        EnvoyConfigOptions(listen_port=0, admin_port=0, no_epp=True, fallback_endpoints=tuple(addrs))
                    )
                )
            )
            epp_gw = stack.enter_context(
                EnvoyProcess(
                    build_bootstrap(
                        EnvoyConfigOptions(listen_port=0, admin_port=0, epp_port=epp.grpc_port, epp_tls=True)
                    )
                )
            )
            epp_gw.wait_cluster_healthy("epp", timeout=30)
            assert rr_gw.proc is not None and epp_gw.proc is not None and backends.proc is not None
            targets = [
                Target(DIRECT, ports[0], backends.proc.pid),
                Target(RR, rr_gw.listen_port, rr_gw.proc.pid),
                Target(EPP, epp_gw.listen_port, epp_gw.proc.pid),
            ]
            if args.smoke and not args.peers:
                sgl_note = "sglang-router skipped (smoke run without --peers)."
            elif args.no_peers:
                sgl_note = "sglang-router skipped (--no-peers)."
            else:
                try:
                    sgl_port, sgl_pid = stack.enter_context(run_sglang_router(ports, workdir))
                    targets.append(Target(SGL, sgl_port, sgl_pid))
                except (ToolUnavailableError, RuntimeError) as e:
                    sgl_note = f"sglang-router skipped: {e}"
            if sgl_note:
                print(f"  {sgl_note}", file=sys.stderr)
            names = [t.name for t in targets]
            bodies = {t.name: prompt_bodies(args.seed, f"w{i}", 200) for i, t in enumerate(targets)}
            for t in targets:  # warm-up: connections, caches, the EPP's first picks
                run_open_loop("127.0.0.1", t.port, "/v1/completions", bodies[t.name], 200, drain_s=args.drain)
            for rnd in range(args.rounds):
                for rate in rates:
                    for t in targets:
                        b = prompt_bodies(args.seed, f"r{rnd}-{rate}-{t.name[:6]}", int(rate * args.open_duration))
                        measure_open(cells, t, rate, args.open_duration, b, epp, args.drain, f"round {rnd + 1}")
            # the highest rate with p99 added latency <= the limit
            by_name = {t.name: t for t in targets}
            for rate in steps:
                for name in (RR, EPP):
                    b = prompt_bodies(args.seed, f"s{rate}-{name[:6]}", int(rate * args.search_duration))
                    measure_open(search, by_name[name], rate, args.search_duration, b, epp, args.drain, "search")
                ok, why = _passes(search, rate, args.limit_ms)
                verdicts.append((rate, ok, why))
                print(f"  search @ {rate}/s: {'pass' if ok else 'FAIL'} ({why})", file=sys.stderr, flush=True)
                if not ok:
                    break
    finally:
        out.append(
            f"### Open loop at fixed rates ({args.open_duration:g}s per measurement x {args.rounds} rounds, "
            f"targets alternating)\n"
        )
        if cells:
            out.append(RATES_LEGEND)
            render_rates(cells, names, rates, out)
            out.append(
                f"EPP background CPU while other targets ran (scraping, housekeeping): "
                f"{_f(background_epp_cpu(cells), '.3f')} s per s (included in the EPP column)."
            )
            out.append("")
        if sgl_note:
            out.append(sgl_note + "\n")
        out.append(f"### Highest rate with p99 added latency <= {args.limit_ms:g} ms (Envoy + llm-epp)\n")
        if verdicts:
            out.append(
                f"Steps {steps}, {args.search_duration:g}s each, Envoy ROUND_ROBIN then Envoy + llm-epp at each step; "
                "a step passes when p99(llm-epp) - p99(ROUND_ROBIN) <= the limit, nothing failed and the achieved "
                "rate is >= 95% of the target; the search stops at the first failing step.\n"
            )
            out.append(
                "| rate req/s | RR p99 ms | llm-epp p99 ms | added p99 ms | llm-epp failed | achieved | verdict |"
            )
            out.append("|---|---|---|---|---|---|---|")
            for rate, ok, why in verdicts:
                rr, ep = search.get((RR, rate)), search.get((EPP, rate))
                if rr is None or ep is None:
                    continue
                out.append(
                    f"| {rate} | {_f(rr.p(99))} | {_f(ep.p(99))} | {_f(ep.p(99) - rr.p(99))} | {ep.load.failed} | "
                    f"{ep.load.achieved_rps:.0f} | {'pass' if ok else 'FAIL: ' + why} |"
                )
            passed = [r for r, ok, _ in verdicts if ok]
            first_fail = next((r for r, ok, _ in verdicts if not ok), None)
            best = f"**{passed[-1]} req/s**" if passed else "none of the steps"
            tail = f" ({first_fail} req/s failed)" if first_fail else " (every step passed)"
            out.append(f"\nHighest passing rate: {best}{tail}.\n")
        else:
            out.append("(not measured)\n")


def _passes(search: dict[tuple[str, int], Cell], rate: int, limit_ms: float) -> tuple[bool, str]:
    rr, ep = search[(RR, rate)], search[(EPP, rate)]
    added = ep.p(99) - rr.p(99)
    if ep.load.failed:
        return False, f"{ep.load.failed} failed"
    if ep.load.achieved_rps < 0.95 * rate:
        return False, f"achieved {ep.load.achieved_rps:.0f}/s"
    if not added <= limit_ms:
        return False, f"p99 added {added:.1f} ms"
    return True, f"p99 added {added:.2f} ms"


def part_rss(args: argparse.Namespace, workdir: Path, out: list[str]) -> None:
    total: int = args.rss_requests
    step = max(1, total // 10)
    samples: list[tuple[int, int, float, float]] = []  # (requests, VmRSS KiB, req/s of the chunk, index size)
    failed = 0
    print(
        f"[rss] seed {args.seed}; {total} requests, closed loop over {args.rss_connections} connections",
        file=sys.stderr,
    )
    try:
        with ExitStack() as stack:
            backends = stack.enter_context(EnvoyProcess(direct_response_backends(3, args.rss_content_type)))
            addrs = [f"127.0.0.1:{p}" for p in backends.listener_ports.values()]
            epp = stack.enter_context(run_epp(addrs, workdir))
            gw = stack.enter_context(
                EnvoyProcess(
                    build_bootstrap(
                        EnvoyConfigOptions(listen_port=0, admin_port=0, epp_port=epp.grpc_port, epp_tls=True)
                    )
                )
            )
            gw.wait_cluster_healthy("epp", timeout=30)
            samples.append((0, rss_kib(epp.pid), 0.0, epp.metric_value(INDEX_SIZE)))
            done = 0
            while done < total:
                n = min(step, total - done)
                bodies = prompt_bodies(args.seed, f"m{done}", n, words=RSS_WORDS)
                res = run_closed_loop("127.0.0.1", gw.listen_port, "/v1/completions", bodies, args.rss_connections)
                done += n
                failed += res.failed
                samples.append((done, rss_kib(epp.pid), res.achieved_rps, epp.metric_value(INDEX_SIZE)))
                print(
                    f"  rss: {done} requests, VmRSS {samples[-1][1] / 1024:.1f} MiB, {res.achieved_rps:.0f} req/s, "
                    f"{res.failed} failed",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        out.append(
            f"### EPP resident memory over {total} requests (Envoy + llm-epp, closed loop, "
            f"{args.rss_connections} connections, distinct prompts, responses `{args.rss_content_type}`)\n"
        )
        out.append(
            f"Each request: one of 16 shared 30-word prefixes, then {RSS_WORDS} random words of its own (~0.8 KB "
            "bodies, ~8 new 64-character prefix blocks), so the prefix index (default LRU capacity 31,250 blocks "
            "per endpoint, 3 endpoints) is full early and later growth is not the index filling up. The index size "
            f"is the EPP's `{INDEX_SIZE}` gauge.\n"
        )
        if samples:
            out.append("| requests | EPP VmRSS MiB | prefix index size (blocks) | req/s over the last chunk |")
            out.append("|---|---|---|---|")
            for n, kib, rps, size in samples:
                out.append(f"| {n} | {kib / 1024:.1f} | {size:.0f} | {f'{rps:.0f}' if n else '-'} |")
            at = {n: kib for n, kib, _, _ in samples}
            ref = 2 * step
            if ref in at and samples[-1][0] > ref:
                last_n, last_kib, _, _ = samples[-1]
                growth = (last_kib - at[ref]) / 1024
                out.append(
                    f"\nGrowth from {ref} to {last_n} requests: {growth:+.1f} MiB "
                    f"({100 * (last_kib - at[ref]) / at[ref]:+.1f}%); {failed} failed requests.\n"
                )
            else:
                out.append(f"\n(incomplete run; {failed} failed requests)\n")
        else:
            out.append("(not measured)\n")


@contextmanager
def run_trivial_picker(endpoints: list[str], workdir: Path, transport: str = "grpcio") -> Iterator[tuple[int, int]]:
    """``benchmarks.trivial_picker`` on a free port; yields (port, pid) once it serves."""
    ports_file = workdir / f"trivial-{time.monotonic_ns()}.json"
    log = open(workdir / "trivial-picker.log", "wb")
    cmd = [sys.executable, "-m", "benchmarks.trivial_picker", "--endpoints", ",".join(endpoints)]
    cmd += ["--transport", transport]
    proc = subprocess.Popen(
        [*cmd, "--ports-file", str(ports_file)], stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT)
    )
    try:
        deadline = time.monotonic() + 30
        while not ports_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the trivial picker did not start: {(workdir / 'trivial-picker.log').read_text()}")
            time.sleep(0.05)
        yield json.loads(ports_file.read_text())["grpc"], proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


TRIVIAL = "Envoy + trivial picker"
TRIVIAL_ASYNCIO = "Envoy + trivial picker on llm-epp's asyncio server"
EPP_PLAIN = "Envoy + llm-epp (default, plaintext)"
EPP_TLS = "Envoy + llm-epp (default, TLS)"


@dataclass
class PickerCell:
    """Open-loop figures of one (target, rate), pooled over rounds."""

    load: LoadResult
    picker_cpu_s: float = 0.0
    envoy_cpu_s: float = 0.0

    def p(self, q: float) -> float:
        return percentile(self.load.service_ms, q)


def part_picker(args: argparse.Namespace, workdir: Path, out: list[str]) -> None:
    """llm-epp (default configuration, plaintext) beside the trivial picker, both behind the same Envoy
    configuration, and Envoy ROUND_ROBIN: closed-loop throughput and CPU per request, then open-loop added
    latency at fixed rates. Targets alternate within each round, in reverse order every other round."""
    rates: list[int] = args.picker_rates
    epp_name = EPP_TLS if args.picker_tls else EPP_PLAIN
    closed: dict[str, Result] = {}
    cells: dict[tuple[str, int], PickerCell] = {}
    pids: dict[str, int] = {}
    extra = [a for a in args.epp_args.split() if a]
    print(f"[picker] rates {rates}; llm-epp extra args {extra}", file=sys.stderr, flush=True)
    script = workdir / "post.lua"
    script.write_text(f"wrk.method = 'POST'\nwrk.body = '{BODY}'\nwrk.headers['content-type'] = 'application/json'\n")
    have_wrk = shutil.which("wrk") is not None
    try:
        with ExitStack() as stack:
            backends = stack.enter_context(EnvoyProcess(direct_response_backends(3)))
            addrs = [f"127.0.0.1:{p}" for p in backends.listener_ports.values()]
            epp = stack.enter_context(
                EppProcess(
                    "--endpoints",
                    ",".join(addrs),
                    "-v",
                    "1",
                    f"--secure-serving={'true' if args.picker_tls else 'false'}",
                    *extra,
                    env=EPP_ENV,
                    log_path=workdir / "epp-picker.log",
                )
            )
            tport, tpid = stack.enter_context(run_trivial_picker(addrs, workdir))
            gport, gpid = stack.enter_context(run_trivial_picker(addrs, workdir, "asyncio"))
            gws = {
                RR: EnvoyProcess(
                    build_bootstrap(
                        EnvoyConfigOptions(listen_port=0, admin_port=0, no_epp=True, fallback_endpoints=tuple(addrs))
                    )
                ),
                TRIVIAL: EnvoyProcess(
                    build_bootstrap(EnvoyConfigOptions(listen_port=0, admin_port=0, epp_port=tport, epp_tls=False))
                ),
                TRIVIAL_ASYNCIO: EnvoyProcess(
                    build_bootstrap(EnvoyConfigOptions(listen_port=0, admin_port=0, epp_port=gport, epp_tls=False))
                ),
                epp_name: EnvoyProcess(
                    build_bootstrap(
                        EnvoyConfigOptions(listen_port=0, admin_port=0, epp_port=epp.grpc_port, epp_tls=args.picker_tls)
                    )
                ),
            }
            for g in gws.values():
                stack.enter_context(g)
            for name in (TRIVIAL, TRIVIAL_ASYNCIO, epp_name):
                gws[name].wait_cluster_healthy("epp", timeout=30)
            pids = {TRIVIAL: tpid, TRIVIAL_ASYNCIO: gpid, epp_name: epp.pid}
            closed = {name: Result(name) for name in gws}
            bodies = {name: prompt_bodies(args.seed, f"p{i}", 300) for i, name in enumerate(gws)}
            for name, g in gws.items():  # warm-up: connections, caches, the first picks
                run_open_loop("127.0.0.1", g.listen_port, "/v1/completions", bodies[name], 300, drain_s=args.drain)
            for rnd in range(args.rounds):
                # every other round in reverse order, so a drift of the machine's speed within a round does not
                # always fall on the same target
                order = list(gws.items()) if rnd % 2 == 0 else list(gws.items())[::-1]
                if have_wrk:
                    for name, g in order:
                        assert g.proc is not None
                        settle([g.proc.pid, *pids.values()])
                        measure(
                            closed[name],
                            g.url("/v1/completions"),
                            script,
                            args.duration,
                            args.connections,
                            pids.get(name),
                            g.proc.pid,
                        )
                        print(
                            f"  round {rnd + 1}: {name}: {closed[name].rps[-1]:.0f} req/s, picker "
                            f"{(closed[name].epp_ms_per_req or [0.0])[-1]:.3f} ms CPU/req",
                            file=sys.stderr,
                            flush=True,
                        )
                for rate in rates:
                    for name, g in order:
                        i = list(gws).index(name)
                        assert g.proc is not None
                        watch = [g.proc.pid, *pids.values()]
                        settle(watch)
                        b = prompt_bodies(args.seed, f"q{rnd}-{rate}-{i}", int(rate * args.open_duration))
                        pid = pids.get(name)
                        c0 = cpu_seconds(pid) if pid else 0.0
                        e0 = cpu_seconds(g.proc.pid)
                        res = run_open_loop("127.0.0.1", g.listen_port, "/v1/completions", b, rate, drain_s=args.drain)
                        cell = cells.setdefault((name, rate), PickerCell(LoadResult(target_rate=rate)))
                        cell.load.merge(res)
                        cell.picker_cpu_s += (cpu_seconds(pid) - c0) if pid else 0.0
                        cell.envoy_cpu_s += cpu_seconds(g.proc.pid) - e0
                        print(
                            f"  round {rnd + 1} {name} @ {rate}/s: {res.ok} ok, {res.failed} failed; ms p50/p99/max "
                            f"{summary(res.service_ms)}",
                            file=sys.stderr,
                            flush=True,
                        )
    finally:
        tls = "TLS" if args.picker_tls else "plaintext"
        out.append(f"### llm-epp beside a trivial ext_proc picker ({tls}; llm-epp args: `{' '.join(extra) or '-'}`)\n")
        out.append(
            "The trivial picker (`benchmarks/trivial_picker.py`: grpc.aio on uvloop, `context.read()/write()`, "
            "pre-serialised answers, endpoints in turn; the goal's yardstick), the same loop behind llm-epp's own "
            "asyncio server (`--transport asyncio`: the floor of llm-epp's default transport) and llm-epp "
            "(default configuration: prefix, queue and "
            "KV-cache scorers, metrics scraped every 50 ms) sit behind the same Envoy configuration "
            "(`llm-epp envoy-config` defaults); backends are Envoy `direct_response` listeners. Targets alternate "
            "within each round, in reverse order every other round. CPU = user + system seconds of the picker "
            "process (/proc/<pid>/stat) over the window, divided by the requests.\n"
        )
        if any(r.rps for r in closed.values()):
            out.append(
                f"Closed loop (wrk, {args.connections} connections, {args.duration}s x {args.rounds} rounds, "
                "medians):\n"
            )
            out.append(
                "| gateway | req/s median (range) | vs round robin | p50 ms | p99 ms | picker CPU ms/req | "
                "Envoy CPU ms/req | errors |"
            )
            out.append("|---|---|---|---|---|---|---|---|")
            base_rps = statistics.median(closed[RR].rps) if closed.get(RR) and closed[RR].rps else 0.0
            out.extend(r.row(base_rps) for r in closed.values() if r.rps)
            t, e = closed.get(TRIVIAL), closed.get(epp_name)
            if t and e and t.rps and e.rps and t.epp_ms_per_req and e.epp_ms_per_req:
                cpu_ratio = statistics.median(e.epp_ms_per_req) / statistics.median(t.epp_ms_per_req)
                rps_ratio = statistics.median(e.rps) / statistics.median(t.rps)
                out.append(
                    f"\n**llm-epp / trivial picker: CPU per request {cpu_ratio:.2f}x, throughput {rps_ratio:.2f}x.**"
                )
                paired = [x / y for x, y in zip(e.epp_ms_per_req, t.epp_ms_per_req, strict=False)]
                out.append(
                    "CPU per request round by round (each round measures both pickers back to back): "
                    + ", ".join(f"{r:.2f}x" for r in paired)
                    + (f"; median {statistics.median(paired):.2f}x" if len(paired) > 1 else "")
                    + ". On a shared machine one round says little: compare medians over several rounds.\n"
                )
            g = closed.get(TRIVIAL_ASYNCIO)
            if g and e and g.rps and e.rps and g.epp_ms_per_req and e.epp_ms_per_req:
                paired = [x / y for x, y in zip(e.epp_ms_per_req, g.epp_ms_per_req, strict=False)]
                out.append(
                    f"Above its own transport's floor (the trivial picker on its asyncio server): CPU per request "
                    f"{statistics.median(e.epp_ms_per_req) / statistics.median(g.epp_ms_per_req):.2f}x "
                    f"(round by round {', '.join(f'{r:.2f}x' for r in paired)}), throughput "
                    f"{statistics.median(e.rps) / statistics.median(g.rps):.2f}x.\n"
                )
        elif not have_wrk:
            out.append("Closed loop skipped: wrk is not installed (Debian: apt-get install wrk).\n")
        if cells:
            out.append(f"Open loop at fixed rates ({args.open_duration:g}s x {args.rounds} rounds, pooled):\n")
            out.append(
                "| rate req/s | target | achieved | failed | p50 ms | p99 ms | added p50 / p99 vs RR ms | "
                "picker CPU ms/req | Envoy CPU ms/req |"
            )
            out.append("|---|---|---|---|---|---|---|---|---|")
            for rate in rates:
                rr = cells.get((RR, rate))
                for name in (RR, TRIVIAL, TRIVIAL_ASYNCIO, epp_name):
                    c = cells.get((name, rate))
                    if c is None:
                        continue
                    ok = c.load.ok or 1
                    added = (
                        f"{c.p(50) - rr.p(50):+.2f} / {c.p(99) - rr.p(99):+.2f}"
                        if rr is not None and name != RR and rr.load.service_ms and c.load.service_ms
                        else "-"
                    )
                    pcpu = f"{c.picker_cpu_s * 1000 / ok:.3f}" if name != RR else "-"
                    out.append(
                        f"| {rate} | {name} | {c.load.achieved_rps:.0f} | {c.load.failed} | {_f(c.p(50))} | "
                        f"{_f(c.p(99))} | {added} | {pcpu} | {c.envoy_cpu_s * 1000 / ok:.3f} |"
                    )
            out.append("")


def _parts(text: str) -> str:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in parts if p not in ("1", "2", "3", "4", "picker", "all")]
    if not parts or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: give 1, 2, 3, 4, picker or all (a comma list for several)")
    return ",".join(parts)


def _split_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _loadavg() -> str:
    return " / ".join(Path("/proc/loadavg").read_text().split()[:2])


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--part",
        type=_parts,
        default="all",
        help="1, 2, 3, 4, picker or all; a comma list runs several in one go (e.g. picker,3,1)",
    )
    p.add_argument("--smoke", action="store_true", help="a tiny run of parts 3 and 4 (< 1 min), for the test suite")
    p.add_argument("--seed", type=int, default=1, help="seed of the prompts (default 1)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of alternating targets (default 2)")
    p.add_argument("--rates", type=_split_ints, default=[100, 300, 1000], help="part 3 fixed rates (req/s)")
    p.add_argument("--open-duration", type=float, default=8.0, help="seconds per open-loop measurement (default 8)")
    p.add_argument("--search-rates", type=_split_ints, default=[50, 100, 200, 300, 500, 700, 1000])
    p.add_argument("--search-duration", type=float, default=5.0, help="seconds per search step and target")
    p.add_argument("--limit-ms", type=float, default=10.0, help="p99 added latency limit of the search (default 10)")
    p.add_argument("--drain", type=float, default=5.0, help="seconds to wait for answers after the last send")
    p.add_argument("--peers", action="store_true", help="include sglang-router in a --smoke run")
    p.add_argument("--no-peers", action="store_true", help="leave sglang-router out")
    p.add_argument("--rss-requests", type=int, default=100_000, help="part 4 requests (default 100000)")
    p.add_argument("--rss-connections", type=int, default=16, help="part 4 closed-loop connections (default 16)")
    p.add_argument(
        "--rss-content-type",
        default="application/json",
        help="part 4: content type of the stand-in answers (text/event-stream: the EPP takes them as streamed)",
    )
    p.add_argument("--duration", type=int, default=10, help="parts 1-2: seconds per measurement (default 10)")
    p.add_argument("--connections", type=int, default=32, help="part 1: wrk connections (default 32)")
    p.add_argument("--stream-concurrency", type=int, default=8, help="part 2: concurrent 1,000-token streams")
    p.add_argument("--picker-rates", type=_split_ints, default=[100, 500], help="part picker: open-loop rates")
    p.add_argument("--picker-tls", action="store_true", help="part picker: llm-epp with TLS (default plaintext)")
    p.add_argument("--epp-args", default="", help="part picker: extra llm-epp serve arguments (space-separated)")
    p.add_argument(
        "--epp-env",
        default="",
        help="extra environment of llm-epp, space-separated KEY=VALUE (e.g. LD_PRELOAD=... PYTHONMALLOC=malloc)",
    )
    p.add_argument("--output", help="also write the Markdown report here")
    args = p.parse_args(argv)
    EPP_ENV.clear()
    for item in args.epp_env.split():
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error(f"--epp-env: {item!r} is not KEY=VALUE")
        EPP_ENV[key] = value
    notes: list[str] = []
    if args.smoke:
        args.rates, args.open_duration, args.rounds, args.drain = [100, 300], 1.0, 1, 1.0
        args.search_rates, args.search_duration, args.rss_requests = [100, 200], 1.0, 1000
        args.picker_rates, args.duration = [100], 1
        if args.part == "all":
            args.part = "3+4"
            notes.append("smoke run: parts 1 (wrk) and 2 (streaming) skipped.")
    selected = "".join({"all": "P3412", "3+4": "34", "picker": "P"}.get(part, part) for part in args.part.split(","))
    if "1" in selected and shutil.which("wrk") is None:
        selected = selected.replace("1", "")
        notes.append("part 1 skipped: wrk is not installed (Debian: apt-get install wrk).")
    for n in notes:
        print(n, file=sys.stderr)
    config = {k: v for k, v in sorted(vars(args).items()) if k != "output"}
    print(f"configuration: {config}", file=sys.stderr, flush=True)
    shown = command_line("benchmarks.overhead", argv)
    out = [
        f"## EPP overhead\n\n`{shown}`; {machine()}\n",
        f"Configuration: {', '.join(f'{k}={v}' for k, v in config.items())}.\n",
        *(f"{n}\n" for n in notes),
    ]
    parts: dict[str, Callable[[argparse.Namespace, Path, list[str]], None]] = {
        "1": part1,
        "2": part2,
        "3": part_rates,
        "4": part_rss,
        "P": part_picker,
    }
    # Ctrl-C and SIGTERM raise KeyboardInterrupt wherever the run is (asyncio.Runner would otherwise turn the first
    # Ctrl-C into a cancellation of the current measurement only); the parts' finally blocks render what was
    # measured and the context managers stop every child process.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    status = 0
    t0 = time.monotonic()
    load0 = _loadavg()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for key in selected:
                parts[key](args, Path(tmp), out)
        except KeyboardInterrupt:
            out.append("(interrupted: partial results)")
            status = 130
        except Exception as e:  # a child process died, a port was refused...: keep what was measured
            out.append(f"(failed: {e!r}; partial results)")
            status = 1
    out.append(
        f"Wall time {time.monotonic() - t0:.0f} s. Load average (1 / 5 min) at the start {load0}, at the end "
        f"{_loadavg()}: anything above the benchmark's own load means other work shared the cores."
    )
    report = "\n".join(out)
    print(report)
    if args.output:
        Path(args.output).write_text(report + "\n")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
