"""The whole director path per request, in-process: what one request costs the EPP beyond `schedule()`.

For 8 / 64 / 256 / 1024 endpoints, each request goes through the request path `llm-epp serve` builds
(`llm_epp.composition.build_request_path`, default configuration): body parsing, candidates from the
endpoint store's snapshot, saturation check, PrepareData (the approximate prefix producer), scheduling,
in-flight reservation and PreRequest; then, 64 requests later, its response starts (ResponseReceived) and
ends (release, ResponseComplete).  Between requests the endpoints' metrics are updated as the data-layer
runtime does it (`Datastore.update_metrics`, each endpoint every 50 ms) at an offered rate of 500
requests/s, so every request sees N / 25 metric updates since the previous one.

Two endpoint stores run side by side on the same requests, in alternating blocks:

* ``kept``: the store as it is, whose snapshot survives metric updates (only the changed endpoints are
  replaced in the next snapshot);
* ``rebuilt``: the same store made to drop its snapshot on every metric update, as it used to, so nearly
  every request rebuilds all N endpoints.

Per request: `schedule()` alone (as the scheduler reports it), the director path (routing + response +
completion), p50 and p99 in microseconds.  Requests: chat completions, 150 shared system prompts of 5/6 of
a 1,000-token prompt and a unique question (4 characters per token).

    python -m benchmarks.director_cost              # 2,000 timed requests per cell (~3 min idle)
    python -m benchmarks.director_cost --quick      # 300 per cell
    [--seed 42] [--output FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from benchmarks.report import command_line, machine
from llm_epp.composition import RequestPath, build_request_path
from llm_epp.datalayer.datastore import Datastore
from llm_epp.framework import EndpointKey, EndpointMetadata, Metrics, NullRecorder, seeded_random
from llm_epp.framework.requestcontrol import Usage
from llm_epp.requestcontrol.decision import Outcome, RequestInput, ResponseSeen, RoutingDecision

ROOT = Path(__file__).resolve().parents[1]
ENDPOINT_COUNTS = (8, 64, 256, 1024)
SCRAPE_INTERVAL = 0.05
OFFERED_RATE = 500.0
IN_FLIGHT = 64
GROUPS = 150
PROMPT_CHARS = 4_000
BLOCK = 50
MODES = ("kept", "rebuilt")


class _RebuildingDatastore(Datastore):
    """The endpoint store as it was: every metric update throws the cached snapshot away."""

    def update_metrics(self, key: EndpointKey, metrics: Metrics) -> None:
        super().update_metrics(key, metrics)
        self._snapshot = None


class _SchedulerTimes(NullRecorder):
    def __init__(self) -> None:
        self.schedule: list[float] = []

    def scheduler_duration(self, seconds: float) -> None:
        self.schedule.append(seconds)


@dataclass
class _Side:
    """One store variant: its request path, its clock of metric updates and its timings."""

    mode: str
    path: RequestPath
    recorder: _SchedulerTimes
    keys: list[EndpointKey]
    rng: random.Random
    now: list[float]
    """The plugins' clock (seconds), advanced with the offered load."""
    due: float = 0.0
    pending: collections.deque[RoutingDecision] = field(default_factory=collections.deque)
    director_times: list[float] = field(default_factory=list)


def _bodies(n: int, rng: random.Random) -> list[bytes]:
    systems = [
        f"system {g} " + "".join(rng.choice("abcdefgh ") for _ in range(PROMPT_CHARS * 5 // 6)) for g in range(GROUPS)
    ]
    out = []
    for i in range(n):
        question = f"question {i} " + "".join(rng.choice("ijklmnop ") for _ in range(PROMPT_CHARS // 6))
        body = {
            "model": "m",
            "max_tokens": 100,
            "messages": [{"role": "system", "content": rng.choice(systems)}, {"role": "user", "content": question}],
        }
        out.append(orjson.dumps(body))
    return out


def _metrics(rng: random.Random, now: float) -> Metrics:
    return Metrics(
        waiting_queue_size=rng.randrange(21),
        running_requests=rng.randrange(64),
        kv_cache_usage=rng.random(),
        cache_block_size=16,
        cache_num_blocks=19_208,
        update_time=now,
    )


def _side(mode: str, n: int, seed: int) -> _Side:
    recorder = _SchedulerTimes()
    store = _RebuildingDatastore("bench") if mode == "rebuilt" else Datastore("bench")
    now = [1.0]
    path = build_request_path(
        recorder=recorder, datastore=store, clock=lambda: now[0], random_source=seeded_random(seed)
    )
    keys = [EndpointKey("default", f"vllm-{i}") for i in range(n)]
    store.replace_all(
        EndpointMetadata(k, f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", 8000) for i, k in enumerate(keys)
    )
    rng = random.Random(seed)
    for k in keys:
        store.update_metrics(k, _metrics(rng, 1.0))
    return _Side(mode, path, recorder, keys, rng, now)


def _update_metrics(side: _Side, gap: float) -> None:
    """The data layer's work between two requests: each endpoint updated every 50 ms, round robin."""
    n = len(side.keys)
    side.now[0] += gap
    side.due += n * gap / SCRAPE_INTERVAL
    store, keys, rng = side.path.datastore, side.keys, side.rng
    while side.due >= 1.0:
        side.due -= 1.0
        store.update_metrics(keys[rng.randrange(n)], _metrics(rng, side.now[0]))


async def _one(side: _Side, request_id: str, body: bytes) -> float:
    director = side.path.director
    clock = time.perf_counter
    headers = {":path": "/v1/chat/completions", "content-type": "application/json"}
    t0 = clock()
    decision = await director.route(RequestInput(request_id, headers, body))
    side.pending.append(decision)
    if len(side.pending) > IN_FLIGHT:
        done = side.pending.popleft()
        seen = ResponseSeen(status=200, served_endpoint=done.endpoint.hostport, streaming=True)
        director.response_received(done.handle, seen)
        usage = Usage(prompt_tokens=1000, completion_tokens=100, total_tokens=1100)
        director.finish(done.handle, Outcome(complete=True, status=200, usage=usage))
    return clock() - t0


async def measure(n: int, warm: int, timed: int, seed: int) -> dict[str, tuple[list[float], list[float]]]:
    """Per mode: (schedule times, director-path times) of the timed requests."""
    rng = random.Random(seed * 1_009 + n)
    bodies = _bodies(warm + timed, rng)
    sides = [_side(mode, n, seed) for mode in MODES]
    gap = 1.0 / OFFERED_RATE
    for start in range(0, warm + timed, BLOCK):
        for side in sides:  # alternate blocks: both variants see the same load on this noisy machine
            for i in range(start, min(start + BLOCK, warm + timed)):
                _update_metrics(side, gap)
                elapsed = await _one(side, f"r{i}", bodies[i])
                if i == warm:
                    side.recorder.schedule.clear()
                if i >= warm:
                    side.director_times.append(elapsed)
    return {s.mode: (list(s.recorder.schedule[-timed:]), s.director_times) for s in sides}


def p50(v: Sequence[float]) -> float:
    return statistics.median(v)


def p99(v: Sequence[float]) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, int(len(s) * 0.99))]


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.0f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="300 timed requests per cell")
    p.add_argument("--smoke", action="store_true", help="8 and 64 endpoints, a handful of requests (for tests)")
    p.add_argument("--seed", type=int, default=42, help="random seed (default 42)")
    p.add_argument("--output", help="also write the Markdown report here")
    args = p.parse_args(argv)
    warm, timed = (10, 40) if args.smoke else (100, 300) if args.quick else (300, 2_000)
    counts = (8, 64) if args.smoke else ENDPOINT_COUNTS
    command = command_line("benchmarks.director_cost", argv)
    print(f"{command}\nseed {args.seed}; {machine()}", file=sys.stderr, flush=True)
    out = [
        "## Director cost per request (in-process)",
        "",
        f"`{command.strip()}`; seed {args.seed}; {machine()}",
        "",
        f"Default configuration; chat requests of ~{PROMPT_CHARS // 4:,} tokens ({GROUPS} shared system prompts); "
        f"metric updates at {SCRAPE_INTERVAL * 1000:.0f} ms per endpoint and {OFFERED_RATE:.0f} requests/s offered; "
        f"{IN_FLIGHT} requests in flight; {warm} warm-up and {timed} timed requests per cell, the two stores in "
        f"alternating blocks of {BLOCK}. Times in microseconds. `schedule` = `Scheduler.schedule()` alone; `director` "
        "= the whole path per request (routing, response start, completion); `kept` = the snapshot survives "
        "metric updates; `rebuilt` = every update drops it (the old behaviour).",
        "",
        "| endpoints | store | n | schedule p50 | schedule p99 | director p50 | director p99 "
        "| director / schedule (p50) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    summary: list[str] = []
    started = time.perf_counter()
    try:
        for n in counts:
            cells = asyncio.run(measure(n, warm, timed, args.seed))
            for mode in MODES:
                sched, director = cells[mode]
                out.append(
                    f"| {n} | {mode} | {len(director)} | {us(p50(sched))} | {us(p99(sched))} | {us(p50(director))} | "
                    f"{us(p99(director))} | {p50(director) / p50(sched):.2f} |"
                )
            kept, rebuilt = p50(cells["kept"][1]), p50(cells["rebuilt"][1])
            summary.append(f"| {n} | {us(kept)} | {us(rebuilt)} | {rebuilt / kept - 1:+.0%} |")
            print(
                f"  {n} endpoints: director p50 kept {us(kept)} us, rebuilt {us(rebuilt)} us "
                f"({time.perf_counter() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    except KeyboardInterrupt:
        out.append("")
        out.append("(interrupted: partial results)")
    out += [
        "",
        "Snapshot kept vs rebuilt on every metric update (director path, p50):",
        "",
        "| endpoints | kept | rebuilt | rebuilt costs |",
        "|---:|---:|---:|---:|",
        *summary,
    ]
    text = "\n".join(out) + "\n"
    print(text)
    if args.output:
        Path(args.output).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
