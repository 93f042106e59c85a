"""Long chaos run: real Envoy + `llm-epp serve` + stub pods on loopback under steady open-loop load, while
pods die and come back and, at the end, the EPP is sent SIGTERM. Counts what a client would see.

Per pod death the report gives the requests that failed in the first second (the EPP learns of the death
from a refused scrape; requests already routed there fail) and after it (should be none), the requests
the dead pod received after its first second, the in-flight streams cut by the drain, and the EPP's
memory before and after.

    python -m benchmarks.chaos                       # 4 pods, 20 req/s, 120 s, a pod killed every 15 s
    python -m benchmarks.chaos --duration 20 --kill-every 5   # a quick look
    make bench-chaos                                 # this, then the fuzz suite with 20x the examples
"""

from __future__ import annotations

import argparse
import random
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.report import command_line, machine
from llm_epp.gateway.envoy_config import EnvoyConfigOptions, build_bootstrap
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess
from llm_epp.sim.stub import BackendPool


@dataclass
class Outcome:
    sent_at: float
    status: int
    backend: str


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _one(client: httpx.Client, url: str, i: int, t0: float) -> Outcome:
    sent = time.monotonic() - t0
    body = {"model": "m", "prompt": f"chaos request {i} " * 8, "max_tokens": 8}
    try:
        r = client.post(url, json=body)
        return Outcome(sent, r.status_code, r.headers.get("x-backend-name", ""))
    except httpx.HTTPError:
        return Outcome(sent, 0, "")


def run(args: argparse.Namespace) -> str:
    header = f"`{command_line('benchmarks.chaos', None)}`; seed {args.seed}; {machine()}"
    print(header, flush=True)
    rng = random.Random(args.seed)
    deaths: list[tuple[float, float, str]] = []  # (died at, back at, name), seconds since start
    with BackendPool(args.pods, itl_s=0.01) as pods:
        epp = EppProcess("--endpoints", ",".join(pods.addresses), "--secure-serving=false", "--drain-timeout", "5s")
        epp.start()
        envoy = EnvoyProcess(
            build_bootstrap(
                EnvoyConfigOptions(
                    listen_port=0, admin_port=0, epp_port=epp.grpc_port, epp_tls=False, failure_mode="FailClose"
                )
            )
        ).start()
        outcomes: list[Future[Outcome]] = []
        url = envoy.url("/v1/completions")
        rss_before = _rss_mib(epp.pid)
        t0 = time.monotonic()
        stop = threading.Event()

        def chaos() -> None:
            while not stop.wait(args.kill_every):
                victim = pods[rng.randrange(len(pods))]
                died = time.monotonic() - t0
                pods.call(victim.stop())
                print(f"  {died:6.1f} s: {victim.name} killed", flush=True)
                if stop.wait(args.kill_every / 2):
                    pods.call(victim.start())
                    deaths.append((died, time.monotonic() - t0, victim.name))
                    return
                pods.call(victim.start())
                deaths.append((died, time.monotonic() - t0, victim.name))

        killer = threading.Thread(target=chaos, daemon=True)
        killer.start()
        with httpx.Client(timeout=30, limits=httpx.Limits(max_connections=64)) as client, ThreadPoolExecutor(64) as ex:
            i = 0
            while (now := time.monotonic() - t0) < args.duration:
                outcomes.append(ex.submit(_one, client, url, i, t0))
                i += 1
                time.sleep(max(i / args.rate - now, 0))
            stop.set()
            killer.join(60)
            # the drain: SIGTERM while requests keep coming for 2 s
            drain_start = time.monotonic() - t0
            epp.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
            while time.monotonic() - t0 < drain_start + 2:
                outcomes.append(ex.submit(_one, client, url, i, t0))
                i += 1
                time.sleep(1 / args.rate)
            results = [f.result() for f in outcomes]
        rss_after = _rss_mib(epp.pid) if epp.proc and epp.proc.poll() is None else float("nan")
        envoy.stop()
        epp.stop()
    lines = [
        "# Chaos run",
        "",
        header,
        "",
        f"{args.pods} pods, {args.rate} req/s for {args.duration:g} s, a pod killed every {args.kill_every:g} s "
        f"(back after half that), seed {args.seed}; then SIGTERM with requests still coming.",
        "",
        "| pod died at (s) | back at (s) | failed in its first second | failed after | sent to it after 1 s |",
        "| --- | --- | --- | --- | --- |",
    ]
    for died, back, name in deaths:
        window = [o for o in results if died <= o.sent_at < back]
        early = sum(o.status != 200 for o in window if o.sent_at < died + 1)
        late = sum(o.status != 200 for o in window if o.sent_at >= died + 1)
        misrouted = sum(o.backend == name for o in window if o.sent_at >= died + 1)
        lines.append(f"| {died:.1f} | {back:.1f} | {early} | {late} | {misrouted} |")
    drained = [o for o in results if o.sent_at >= drain_start]
    lines += [
        "",
        f"Requests: {len(results)}, failed {sum(o.status != 200 for o in results)}. During the drain: "
        f"{len(drained)} sent, {sum(o.status != 200 for o in drained)} failed.",
        f"EPP memory: {rss_before:.0f} MiB before, {rss_after:.0f} MiB at the end.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", type=int, default=4)
    p.add_argument("--rate", type=float, default=20.0, help="requests per second (open loop)")
    p.add_argument("--duration", type=float, default=120.0, help="seconds of load before the drain")
    p.add_argument("--kill-every", type=float, default=15.0, help="seconds between pod deaths")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--output", help="also write the report here (markdown)")
    args = p.parse_args()
    report = run(args)
    print(report)
    if args.output:
        Path(args.output).write_text(report)


if __name__ == "__main__":
    main()
