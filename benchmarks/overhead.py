"""EPP overhead through a real Envoy, side by side in one run.

Part 1, small non-streamed requests: wrk (closed loop, 32 connections) against
  * Envoy ROUND_ROBIN to the backends (no ext_proc): the baseline;
  * Envoy + llm-epp (FULL_DUPLEX_STREAMED request body, response body NONE, TLS), the default config;
  * the same with response headers SKIPped (one round trip less per request).
Backends are Envoy direct_response listeners (near-zero cost), so the figures are the gateway's.

Part 2, streamed 1,000-token responses (a stub server writing one SSE event per token, 1 ms apart):
Envoy ROUND_ROBIN vs Envoy + llm-epp with response bodies NONE vs FULL_DUPLEX_STREAMED.

Every figure comes from this one run; configurations alternate (A B C A B C) to spread the noise. Needs
`wrk` on PATH (Debian: apt-get install wrk). Takes about 3 minutes. Ctrl-C prints what was measured.

    python -m benchmarks.overhead [--duration 10] [--rounds 2] [--connections 32] [--output FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
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


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def direct_response_backends(n: int) -> dict[str, Any]:
    """One Envoy worker serving a fixed completion on n listeners: stand-in model servers that cost little."""
    listeners = []
    for i in range(n):
        hcm = {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
            "HttpConnectionManager",
            "stat_prefix": f"b{i}",
            "route_config": {
                "virtual_hosts": [
                    {
                        "name": "all",
                        "domains": ["*"],
                        "routes": [
                            {
                                "match": {"prefix": "/"},
                                "direct_response": {"status": 200, "body": {"inline_string": REPLY}},
                                "response_headers_to_add": [
                                    {"header": {"key": "content-type", "value": "application/json"}}
                                ],
                            }
                        ],
                    }
                ]
            },
            "http_filters": [
                {
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
                }
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


@contextmanager
def run_epp(endpoints: list[str], workdir: Path, tls: bool = True) -> Iterator[EppProcess]:
    with EppProcess(
        "--endpoints",
        ",".join(endpoints),
        "-v",
        "1",
        f"--secure-serving={'true' if tls else 'false'}",
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
        base = dict(listen_port=0, admin_port=0, epp_port=epp.grpc_port, epp_tls=True)
        gateways: dict[str, EnvoyProcess] = {
            "Envoy ROUND_ROBIN (no EPP)": EnvoyProcess(
                build_bootstrap(
                    EnvoyConfigOptions(listen_port=0, admin_port=0, no_epp=True, fallback_endpoints=tuple(addrs))
                )
            ),
            "Envoy + llm-epp (default)": EnvoyProcess(build_bootstrap(EnvoyConfigOptions(**base))),  # type: ignore[arg-type]
            "Envoy + llm-epp, response headers SKIP": EnvoyProcess(
                build_bootstrap(EnvoyConfigOptions(**base, response_header_mode="SKIP"))
            ),  # type: ignore[arg-type]
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
        base = dict(listen_port=0, admin_port=0, epp_port=epp.grpc_port, epp_tls=True)
        gateways = {
            "Envoy ROUND_ROBIN (no EPP)": EnvoyProcess(
                build_bootstrap(
                    EnvoyConfigOptions(
                        listen_port=0, admin_port=0, no_epp=True, fallback_endpoints=tuple(pool.addresses)
                    )
                )
            ),
            "llm-epp, response body NONE": EnvoyProcess(build_bootstrap(EnvoyConfigOptions(**base))),  # type: ignore[arg-type]
            "llm-epp, response body FULL_DUPLEX_STREAMED": EnvoyProcess(
                build_bootstrap(EnvoyConfigOptions(**base, response_body_mode="FULL_DUPLEX_STREAMED"))
            ),  # type: ignore[arg-type]
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


def machine() -> str:
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    commit = (
        subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        or "unknown"
    )
    return f"commit {commit}; {os.cpu_count()} CPUs ({cpu}); Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=int, default=10, help="seconds per measurement (default 10)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of alternating configurations (default 2)")
    p.add_argument("--connections", type=int, default=32, help="wrk connections (default 32)")
    p.add_argument("--stream-concurrency", type=int, default=8, help="concurrent 1,000-token streams (default 8)")
    p.add_argument("--part", choices=("1", "2", "all"), default="all")
    p.add_argument("--output", help="also write the Markdown report here")
    args = p.parse_args(argv)
    if shutil.which("wrk") is None and args.part != "2":
        print("wrk is not installed (Debian: apt-get install wrk)", file=sys.stderr)
        return 2
    out = [f"## EPP overhead\n\n`python -m benchmarks.overhead {' '.join(argv or sys.argv[1:])}`; {machine()}\n"]
    parts: list[Callable[[argparse.Namespace, Path, list[str]], None]] = []
    if args.part in ("1", "all"):
        parts.append(part1)
    if args.part in ("2", "all"):
        parts.append(part2)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for part in parts:
                part(args, Path(tmp), out)
        except KeyboardInterrupt:
            out.append("(interrupted: partial results)")
    report = "\n".join(out)
    print(report)
    if args.output:
        Path(args.output).write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
