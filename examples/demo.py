"""`make demo`: four simulated vLLM pods, llm-epp and a real Envoy on free loopback ports.

The same burst of shared-prefix chat traffic goes through Envoy with the EPP, then through the same Envoy
setup with plain round robin. Each request prints its pod, cached prompt tokens and time to first
token; a summary table sets the two side by side. Then the stack stays up for `curl` until Ctrl-C, or
exits at once with DEMO_ONCE=1.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson

from llm_epp.datalayer.static import parse_endpoints_file
from llm_epp.gateway.envoy_config import EnvoyConfigOptions, build_bootstrap
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess

PODS = 4
GROUPS = 6  # distinct system prompts (think: six applications sharing the pool)
PER_GROUP = 4  # questions per system prompt
CONCURRENCY = 4
MODEL = "demo-model"
# The tiny profile models a small, fast pod; slowed down 10x its prefill (~0.1 ms per prompt token) outweighs
# the gateway's own per-request cost, as a real GPU's does.
TIME_SCALE = 10
# The reference default (queue 2, kv-cache 2, prefix 3) plus the EPP's own in-flight load: between two
# metric scrapes a burst would otherwise pile onto whichever pod holds the prefixes.
CONFIG = """\
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: active-request-scorer
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: prefix-cache-scorer, weight: 3}
  - {pluginRef: active-request-scorer, weight: 2}
"""


@dataclass
class Result:
    pod: str
    status: int
    prompt_tokens: int
    cached_tokens: int
    ttft_ms: float


def workload(run: str) -> list[tuple[str, str]]:
    """GROUPS system prompts (~450 tokens each), PER_GROUP questions each. `run` makes each burst's
    prompts its own, so the second burst does not find the first one's prefixes cached."""
    systems = [
        f"[{run}] You are assistant number {g} of the demo company. " + f"Policy {g}: be accurate and brief. " * 50
        for g in range(GROUPS)
    ]
    return [
        (systems[g], f"Question {q} for assistant {g}: what should I do next?")
        for q in range(PER_GROUP)
        for g in range(GROUPS)
    ]


def chat(client: httpx.Client, url: str, system: str, question: str) -> Result:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft = 0.0
    usage: dict[str, object] = {}
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = orjson.loads(line[6:])
            if not ttft and event.get("choices") and event["choices"][0].get("delta", {}).get("content"):
                ttft = (time.perf_counter() - start) * 1000
            if event.get("usage"):
                usage = event["usage"]
        pod = r.headers.get("x-sim-pod", "-")
        status = r.status_code
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens", 0) if isinstance(details, dict) else 0
    return Result(pod, status, int(usage.get("prompt_tokens", 0)), int(cached or 0), ttft)  # type: ignore[call-overload]


def burst(url: str, label: str) -> list[Result]:
    requests = workload(label)
    results: list[Result | None] = [None] * len(requests)
    with httpx.Client(timeout=60) as client, ThreadPoolExecutor(CONCURRENCY) as pool:
        futures = {pool.submit(chat, client, url, s, q): i for i, (s, q) in enumerate(requests)}
        for future, i in futures.items():
            results[i] = future.result()
    done = [r for r in results if r is not None]
    for i, r in enumerate(done):
        group = i % GROUPS
        print(
            f"{label:<12} #{i + 1:<3} group {group}  pod {r.pod:<6} status {r.status}  "
            f"cached {r.cached_tokens:>4}/{r.prompt_tokens:<4}  TTFT {r.ttft_ms:7.1f} ms"
        )
    return done


def summary(rows: dict[str, list[Result]]) -> None:
    print("\n" + f"{'':<28}" + "".join(f"{name:>14}" for name in rows))

    def line(title: str, fn: object) -> None:
        print(f"{title:<28}" + "".join(f"{fn(r):>14}" for r in rows.values()))  # type: ignore[operator]

    line("requests ok", lambda rs: f"{sum(r.status == 200 for r in rs)}/{len(rs)}")
    line(
        "prefix cache hit rate",
        lambda rs: f"{sum(r.cached_tokens for r in rs) / max(1, sum(r.prompt_tokens for r in rs)):.0%}",
    )
    line("TTFT p50 (ms)", lambda rs: f"{statistics.median(r.ttft_ms for r in rs):.1f}")
    line("TTFT p90 (ms)", lambda rs: f"{statistics.quantiles([r.ttft_ms for r in rs], n=10)[-1]:.1f}")
    pods = sorted({r.pod for rs in rows.values() for r in rs})
    for pod in pods:
        line(f"requests on {pod}", lambda rs, p=pod: str(sum(r.pod == p for r in rs)))


def main() -> int:
    once = os.environ.get("DEMO_ONCE") == "1"
    workdir = Path(tempfile.mkdtemp(prefix="llm-epp-demo-"))
    pool_file = workdir / "pool.yaml"
    sim = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llm_epp",
            "sim",
            "--pods",
            str(PODS),
            "--profile",
            "tiny",
            "--time-scale",
            str(TIME_SCALE),
            "--model",
            MODEL,
            "--endpoints-file",
            str(pool_file),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while not pool_file.exists():
            if sim.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the simulated pods did not start")
            time.sleep(0.05)
        _, endpoints = parse_endpoints_file(pool_file.read_text(), str(pool_file))
        addresses = tuple(e.hostport for e in endpoints)
        with EppProcess(
            "--endpoints-file", str(pool_file), "--config-text", CONFIG, "-v", "1", log_path=workdir / "epp.log"
        ) as epp:
            with_epp = EnvoyProcess(
                build_bootstrap(EnvoyConfigOptions(listen_port=0, admin_port=0, epp_port=epp.grpc_port, epp_tls=True))
            )
            round_robin = EnvoyProcess(
                build_bootstrap(
                    EnvoyConfigOptions(listen_port=0, admin_port=0, no_epp=True, fallback_endpoints=addresses)
                )
            )
            with with_epp, round_robin:
                print(f"{PODS} simulated vLLM pods: {', '.join(addresses)}")
                print(
                    f"llm-epp (TLS) on 127.0.0.1:{epp.grpc_port}, metrics http://127.0.0.1:{epp.ports['metrics']}/metrics"
                )
                print(f"Envoy with llm-epp: {with_epp.url()}   Envoy round robin: {round_robin.url()}\n")
                time.sleep(0.3)  # let the EPP scrape the pods' /metrics once
                rows = {"llm-epp": burst(with_epp.url(), "llm-epp")}
                print()
                rows["round-robin"] = burst(round_robin.url(), "round-robin")
                summary(rows)
                if once:
                    return 0
                print(
                    f"\nUp for curl until Ctrl-C, e.g.\n  curl -s {with_epp.url()}/v1/completions "
                    f'-H \'content-type: application/json\' -d \'{{"model":"{MODEL}","prompt":"hi"}}\''
                )
                stop = False

                def _stop(*_: object) -> None:
                    nonlocal stop
                    stop = True

                signal.signal(signal.SIGTERM, _stop)
                try:
                    while not stop:
                        time.sleep(0.5)
                except KeyboardInterrupt:
                    pass
                return 0
    finally:
        sim.terminate()
        sim.wait(10)


if __name__ == "__main__":
    raise SystemExit(main())
