"""Live pods (real loopback HTTP, real time) and the virtual-time cluster agree on the same small trace.

The same twelve shared-prefix requests arrive at the same (scaled) times on the same pods, once through
``llm-epp sim`` servers and once through :meth:`Cluster.run_trace`.  Token counts and cached prompt tokens
must be identical per request.  Latencies must agree within the stated tolerance: live minus virtual, in
modelled seconds, within ``max(25% of the virtual value, 10 ms)``.  At a time scale of 20 that is at least
200 ms of wall time per request, far above the event loop's scheduling noise, so the check is about the
model (a live pod must not invent or drop steps), not about this machine's speed.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import httpx

from llm_epp.sim.cluster import Cluster, RoundRobinRouter
from llm_epp.sim.live import LivePod
from llm_epp.sim.profiles import TINY
from llm_epp.sim.server import SimServer
from llm_epp.sim.workload import Prompt, SharedPrefixWorkload

PODS = 2
TIME_SCALE = 20.0
GAP = 0.015  # modelled seconds between arrivals: requests overlap on each pod, but same-group ones don't race
REL_TOL = 0.25
ABS_TOL = 0.01  # modelled seconds


def _trace() -> list[tuple[float, Prompt]]:
    workload = SharedPrefixWorkload(
        num_groups=3, prompts_per_group=3, system_prompt_len=160, question_len=40, output_len=24, seed=5
    )
    return [(k * GAP, workload.next_prompt()) for k in range(12)]


@dataclass
class LiveResult:
    ttft: float
    e2e: float
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    pod: str


async def _send(client: httpx.AsyncClient, url: str, prompt: Prompt, start: float) -> LiveResult:
    body = {
        "model": "sim-model",
        "prompt": prompt.text,
        "max_tokens": prompt.max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    first = 0.0
    usage: dict[str, object] = {}
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        assert r.status_code == 200
        pod = r.headers["x-sim-pod"]
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line.removeprefix("data: "))
            if event["choices"] and not first:
                first = time.monotonic()
            if event.get("usage"):
                usage = event["usage"]
    end = time.monotonic()
    details = usage.get("prompt_tokens_details") or {}
    assert isinstance(details, dict)
    return LiveResult(
        (first - start) / TIME_SCALE,
        (end - start) / TIME_SCALE,
        int(str(usage["prompt_tokens"])),
        int(str(usage["completion_tokens"])),
        int(details.get("cached_tokens", 0)),
        pod,
    )


async def _run_live(trace: list[tuple[float, Prompt]]) -> list[LiveResult]:
    servers = [await SimServer(LivePod(f"sim-{i}", TINY, time_scale=TIME_SCALE)).start() for i in range(PODS)]
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            for s in servers:  # open the connections first: connection setup is not part of the model
                assert (await client.get(f"{s.url}/health")).status_code == 200
            t0 = time.monotonic() + 0.05

            async def one(k: int, offset: float, prompt: Prompt) -> LiveResult:
                start = t0 + offset * TIME_SCALE
                await asyncio.sleep(max(start - time.monotonic(), 0))
                return await _send(client, servers[k % PODS].url, prompt, time.monotonic())

            return list(await asyncio.gather(*(one(k, off, p) for k, (off, p) in enumerate(trace))))
    finally:
        for s in servers:
            await s.stop()


async def test_live_and_virtual_runs_of_one_trace_agree() -> None:
    trace = _trace()
    live = await _run_live(trace)
    cluster = Cluster(TINY, PODS)
    virtual = {r.id: r for r in cluster.run_trace(trace, RoundRobinRouter(PODS))}
    assert len(virtual) == len(trace)

    cached_somewhere = 0
    for k, got in enumerate(live):
        want = virtual[f"req-{k + 1}"]
        assert got.pod == f"sim-{want.pod}", k
        assert (got.prompt_tokens, got.completion_tokens, got.cached_tokens) == (
            want.prompt_tokens,
            want.completion_tokens,
            want.cached_tokens,
        ), k
        cached_somewhere += want.cached_tokens > 0
        for name, live_value, virtual_value in (("TTFT", got.ttft, want.ttft), ("E2E", got.e2e, want.e2e)):
            tolerance = max(REL_TOL * virtual_value, ABS_TOL)
            assert abs(live_value - virtual_value) <= tolerance, (k, name, live_value, virtual_value)
    assert cached_somewhere >= 6  # the trace does exercise the prefix cache (same-group requests share a pod)
