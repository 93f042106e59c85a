"""`make demo`: Envoy + llm-epp + three stub model servers on free loopback ports.

Sends a short burst of requests through Envoy and prints, for each, the endpoint the EPP chose, then a
summary. Stays up for `curl` until Ctrl-C, or exits at once with DEMO_ONCE=1.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from pathlib import Path

import httpx

from llm_epp.gateway.envoy_config import EnvoyConfigOptions, build_bootstrap
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess
from llm_epp.sim.stub import BackendPool

PROMPTS = [
    ("chat", "You are a helpful assistant. What is the capital of France?"),
    ("chat", "You are a helpful assistant. Summarise the plot of Hamlet."),
    ("completion", "def fibonacci(n):"),
    ("completion", "Once upon a time"),
    ("chat", "Translate 'good morning' into Spanish."),
    ("completion", "The three laws of thermodynamics are"),
]


def send(client: httpx.Client, url: str, kind: str, text: str, headers: dict[str, str] | None = None) -> httpx.Response:
    if kind == "chat":
        body = {"model": "demo-model", "messages": [{"role": "user", "content": text}], "max_tokens": 8}
        return client.post(url + "/v1/chat/completions", json=body, headers=headers or {})
    return client.post(
        url + "/v1/completions", json={"model": "demo-model", "prompt": text, "max_tokens": 8}, headers=headers or {}
    )


def main() -> int:
    once = os.environ.get("DEMO_ONCE") == "1"
    workdir = Path(tempfile.mkdtemp(prefix="llm-epp-demo-"))
    with BackendPool(3, names=["pod-a", "pod-b", "pod-c"], model="demo-model", ttft_s=0.01) as pool:
        epp = EppProcess("--endpoints", ",".join(pool.addresses), "-v", "1", log_path=workdir / "epp.log").start()
        ports = epp.ports
        try:
            opts = EnvoyConfigOptions(
                listen_port=0,
                admin_port=0,
                epp_port=ports["grpc"],
                epp_tls=True,
                response_body_mode="FULL_DUPLEX_STREAMED",
            )
            with EnvoyProcess(build_bootstrap(opts)) as envoy:
                url = envoy.url()
                print(f"model servers: {', '.join(f'{b.name}={b.address}' for b in pool)}")
                print(
                    f"llm-epp: ext_proc 127.0.0.1:{ports['grpc']} (TLS), metrics "
                    f"http://127.0.0.1:{ports['metrics']}/metrics"
                )
                print(f"envoy:   {url}\n")
                print(f"{'#':>3}  {'api':<10} {'status':>6}  {'served by':<10} {'endpoint':<22} request")
                with httpx.Client(timeout=30) as client:
                    n = 0
                    for _ in range(2):
                        for kind, text in PROMPTS:
                            n += 1
                            r = send(client, url, kind, text)
                            print(
                                f"{n:>3}  {kind:<10} {r.status_code:>6}  {r.headers.get('x-backend-name', '-'):<10} "
                                f"{r.headers.get('x-conformance-test-served-endpoint', '-'):<22} {text[:40]}"
                            )
                    only_c = pool[2].address
                    r = send(client, url, "completion", "pinned", {"test-epp-endpoint-selection": only_c})
                    print(
                        f"\nwith test-epp-endpoint-selection: {only_c} -> served by {r.headers.get('x-backend-name')}"
                    )
                    r = client.post(url + "/v1/completions", content=b'{"prompt": "no model"}')
                    print(f'a body without "model" -> {r.status_code}: {r.json()["error"]["message"]}')
                counts = pool.served_counts()
                print("\nsummary: requests per model server")
                for name, count in counts.items():
                    print(f"  {name:<8} {count:>3}  {'#' * count}")
                print(f"  total    {sum(counts.values()):>3}")
                if once:
                    return 0
                print(
                    f"\nUp for curl until Ctrl-C, e.g.\n  curl -s {url}/v1/completions "
                    '-H \'content-type: application/json\' -d \'{"model":"demo-model","prompt":"hi"}\''
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
            epp.stop()


if __name__ == "__main__":
    raise SystemExit(main())
