"""Open-loop load generator for the live benchmark: inference-perf's stage protocol on asyncio + httpx.

Each stage sends its requests at seeded Poisson arrival offsets (:func:`llm_epp.sim.workload.stage_offsets`)
without waiting for answers (open loop); the stage ends when every one of its requests has finished (or hit
the per-request timeout).  Requests are streamed completions as inference-perf sends them::

    {"model", "prompt", "max_tokens", "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}}

Per request it records the send time, the first and last SSE chunk carrying text (TTFT, ITL = mean gap
between text chunks), the end of the response, the usage chunk's token counts (output tokens, and cached
prompt tokens from ``usage.prompt_tokens_details.cached_tokens``), and the ``x-sim-pod`` response header.
Only 127.0.0.1 is targeted.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import orjson

from llm_epp.sim.cluster import StageStats, summarize_stage
from llm_epp.sim.workload import Prompt, Stage

__all__ = ["LiveResult", "PodCounters", "make_body", "run_stage", "scrape_pods", "stage_stats"]


@dataclass(slots=True)
class LiveResult:
    """One request as the client saw it (times in seconds on ``time.perf_counter``)."""

    stage: int
    group: int
    start: float = math.nan
    first_token: float = math.nan
    last_token: float = math.nan
    end: float = math.nan
    status: int = 0
    pod: str = ""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    text_chunks: int = 0
    error: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.error) or self.status != 200 or self.text_chunks == 0

    @property
    def arrival(self) -> float:
        return self.start

    @property
    def finish(self) -> float:
        return self.end

    @property
    def ttft(self) -> float:
        return self.first_token - self.start

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def itl(self) -> float:
        return (self.last_token - self.first_token) / (self.text_chunks - 1) if self.text_chunks > 1 else math.nan


def make_body(model: str, prompt: Prompt) -> bytes:
    return orjson.dumps(
        {
            "model": model,
            "prompt": prompt.text,
            "max_tokens": prompt.max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )


def _local(url: str) -> None:
    if urlsplit(url).hostname not in ("127.0.0.1", "localhost"):
        raise ValueError(f"the load generator only targets 127.0.0.1, not {url}")


async def _send(client: httpx.AsyncClient, url: str, body: bytes, result: LiveResult) -> None:
    clock = time.perf_counter
    result.start = clock()
    try:
        async with client.stream("POST", url, content=body, headers={"content-type": "application/json"}) as r:
            result.status = r.status_code
            result.pod = r.headers.get("x-sim-pod", "")
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                result.error = f"HTTP {r.status_code}: {text[:200]}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = clock()
                event = orjson.loads(data)
                choices = event.get("choices") or ()
                if choices:
                    choice = choices[0]
                    if choice.get("text") or (choice.get("delta") or {}).get("content"):
                        if not result.text_chunks:
                            result.first_token = now
                        result.last_token = now
                        result.text_chunks += 1
                usage = event.get("usage")
                if usage:
                    result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    result.completion_tokens = int(usage.get("completion_tokens") or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    result.cached_tokens = int(details.get("cached_tokens") or 0)
    except (httpx.HTTPError, orjson.JSONDecodeError, ValueError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:200]
    finally:
        result.end = clock()


async def run_stage(
    client: httpx.AsyncClient,
    url: str,
    index: int,
    offsets: Sequence[float],
    prompts: Sequence[Prompt],
    bodies: Sequence[bytes],
    *,
    request_timeout: float,
) -> list[LiveResult]:
    """Sends one stage open loop and waits until each of its requests finished or timed out."""
    _local(url)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    results = [LiveResult(index, p.group) for p in prompts]
    tasks: list[asyncio.Task[None]] = []
    try:
        for offset, body, result in zip(offsets, bodies, results, strict=True):
            delay = t0 + offset - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(asyncio.wait_for(_send(client, url, body, result), request_timeout)))
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for task in tasks:
            task.cancel()
    for outcome, result in zip(outcomes, results, strict=True):
        if isinstance(outcome, BaseException) and not result.error:
            result.error = "timeout" if isinstance(outcome, TimeoutError) else f"{type(outcome).__name__}"
            if math.isnan(result.end):
                result.end = time.perf_counter()
    return results


# ------------------------------------------------------------------------------------------ pod counters

_COUNTERS = {
    "vllm:prefix_cache_hits_total": "hits",
    "vllm:prefix_cache_queries_total": "queries",
    "vllm:num_preemptions_total": "preemptions",
    "vllm:request_success_total": "successes",
}


@dataclass(frozen=True, slots=True)
class PodCounters:
    hits: float = 0.0
    queries: float = 0.0
    preemptions: float = 0.0
    successes: float = 0.0


def parse_counters(text: str) -> PodCounters:
    values = dict.fromkeys(_COUNTERS.values(), 0.0)
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        key = _COUNTERS.get(name)
        if key is not None:
            values[key] += float(line.rpartition(" ")[2])
    return PodCounters(**values)


async def scrape_pods(client: httpx.AsyncClient, pod_urls: Sequence[str]) -> list[PodCounters]:
    async def one(url: str) -> PodCounters:
        r = await client.get(url + "/metrics", timeout=10)
        r.raise_for_status()
        return parse_counters(r.text)

    return list(await asyncio.gather(*(one(u) for u in pod_urls)))


# ------------------------------------------------------------------------------------------ statistics


def stage_stats(
    stage: Stage,
    results: Sequence[LiveResult],
    pod_names: Sequence[str],
    before: Sequence[PodCounters],
    after: Sequence[PodCounters],
    *,
    on_unknown_pod: Callable[[], None] | None = None,
) -> StageStats:
    """The same figures as the virtual-time cluster's :class:`StageStats` (times in wall seconds).

    Requests per pod come from the ``x-sim-pod`` header; when a router drops it, from the pods' own
    ``vllm:request_success_total`` counters over the stage.
    """
    done = [r for r in results if not r.failed]
    index = {name: i for i, name in enumerate(pod_names)}
    if done and all(r.pod in index for r in done):
        per_pod = [0] * len(pod_names)
        for r in done:
            per_pod[index[r.pod]] += 1
    else:
        if on_unknown_pod is not None:
            on_unknown_pod()
        per_pod = [round(a.successes - b.successes) for a, b in zip(after, before, strict=True)]
    return summarize_stage(
        stage,
        results,
        requests_per_pod=per_pod,
        prefix_hits=sum(a.hits - b.hits for a, b in zip(after, before, strict=True)),
        prefix_queries=sum(a.queries - b.queries for a, b in zip(after, before, strict=True)),
        preemptions=round(sum(a.preemptions - b.preemptions for a, b in zip(after, before, strict=True))),
    )
