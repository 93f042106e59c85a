"""Scheduler cost in-process, no network: the reference default configuration (queue 2 / kv-cache 2 /
prefix 3, max-score picker, approximate prefix producer) for 8 / 64 / 256 / 1024 endpoints x prompts of
1k / 8k / 32k / 128k tokens, and the prefix index's memory after many requests.

Per request it runs what the director runs around scheduling: the producer's PrepareData (prompt text,
chained block hashes, index match), `Scheduler.schedule()` (filters, scorers, picker) and the PreRequest
hooks (index update), and times each. PrepareData is driven without an event loop (it never awaits), so
the figures are the plugin's own cost, not asyncio's.

Workload: chat completions, [system, user]; 150 groups of shared system prompts (5/6 of the prompt, as
the llm-d anchor's 6000 + 1200 tokens), a unique question per request; 4 characters per token. Endpoints
get random metrics (queue 0-20, KV usage 0-1, block size 16, 19,208 KV blocks = the anchor's 307,328
tokens per pod). Each cell starts from an empty index, warms it, then times.

Memory: the prefix index (tracemalloc) after a long stream of 1k-token requests (system 600 + question
400 tokens, 150 groups, so the unique questions fill the LRUs) on 8 endpoints without `cache_num_blocks`
(LRU capacity = the default 31,250 entries per endpoint); tracing covers the final stretch, long enough
for the index to turn over completely several times. Targets there are chosen by best prefix match
(random among equals), not by the full scheduler, to keep a million requests affordable.

    python -m benchmarks.scheduler_cost            # full: 2,000 timed requests per cell, 1M for memory
                                                   # (~7 min on an idle 2-core machine; memory is most of it)
    python -m benchmarks.scheduler_cost --quick    # < 60 s: fewer requests, memory after 30k requests
    [--seed 42] [--output FILE]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.report import command_line, machine
from llm_epp.config.loader import LoadedConfig, load_config_text
from llm_epp.framework import (
    ApiKind,
    CycleState,
    Endpoint,
    EndpointKey,
    EndpointMetadata,
    InferenceRequest,
    InFlightLoad,
    Metrics,
    NullRecorder,
    ProfileResult,
    RequestBody,
    SchedulingResult,
    TypedName,
)
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import (
    PREFIX_MATCH_KEY,
    ApproxPrefixCacheProducer,
    Params,
)

ROOT = Path(__file__).resolve().parents[1]
CHARS_PER_TOKEN = 4
GROUPS = 150
SYSTEM_SHARE = 5 / 6
ENDPOINT_COUNTS = (8, 64, 256, 1024)
PROMPT_TOKENS = (1_000, 8_000, 32_000, 128_000)
KV_BLOCKS = 19_208

CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: max-score-picker
"""


def run_sync(coro: Coroutine[Any, Any, None]) -> None:
    """Runs a coroutine that never awaits (PrepareData plugins here) without an event loop."""
    try:
        coro.send(None)
    except StopIteration:
        return
    coro.close()
    raise RuntimeError("prepare_data awaited; run it on an event loop")


def make_endpoints(n: int, rng: random.Random, with_blocks: bool = True) -> list[Endpoint]:
    out = []
    for i in range(n):
        meta = EndpointMetadata(
            EndpointKey("default", f"vllm-{i}-rank-0"), f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", 8000
        )
        metrics = Metrics(
            waiting_queue_size=rng.randrange(21),
            running_requests=rng.randrange(64),
            kv_cache_usage=rng.random(),
            cache_block_size=16,
            cache_num_blocks=KV_BLOCKS if with_blocks else 0,
            update_time=1.0,
        )
        out.append(Endpoint(meta, metrics, InFlightLoad()))
    return out


class Workload:
    """Shared system prompts per group (a random head, then shared filler) and a unique question each."""

    def __init__(self, rng: random.Random, prompt_tokens: int, system_share: float = SYSTEM_SHARE) -> None:
        self.rng = rng
        chars = prompt_tokens * CHARS_PER_TOKEN
        self.system_chars = int(chars * system_share)
        self.question_chars = chars - self.system_chars
        self.heads = [rng.randbytes(128).hex() for _ in range(GROUPS)]
        filler = rng.randbytes(32_768).hex()
        self.filler = filler * (self.system_chars // len(filler) + 1)
        self.n = 0

    def request(self) -> InferenceRequest:
        rng = self.rng
        g = rng.randrange(GROUPS)
        system = (self.heads[g] + self.filler)[: self.system_chars]
        question = rng.randbytes(self.question_chars // 2 + 1).hex()[: self.question_chars]
        payload = {
            "model": "qwen3-32b",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": 1000,
        }
        self.n += 1
        return InferenceRequest(
            f"req-{self.n}", "qwen3-32b", "qwen3-32b", RequestBody(ApiKind.CHAT_COMPLETIONS, payload)
        )


@dataclass
class Cell:
    endpoints: int
    tokens: int
    prepare: list[float]
    schedule: list[float]
    pre_request: list[float]
    prefix_scorer: list[float]
    hit_ratio: float

    def row(self) -> str:
        total = [a + b + c for a, b, c in zip(self.prepare, self.schedule, self.pre_request, strict=True)]
        return (
            f"| {self.endpoints} | {self.tokens // 1000}k | {len(total)} | {us(p50(self.prepare))} | "
            f"{us(p50(self.schedule))} | {us(p99(self.schedule))} | {us(p50(self.prefix_scorer))} | "
            f"{us(p50(self.pre_request))} | "
            f"{us(p50(total))} | {us(p99(total))} | {self.hit_ratio:.2f} |"
        )


def p50(v: Sequence[float]) -> float:
    return statistics.median(v)


def p99(v: Sequence[float]) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, int(len(s) * 0.99))]


def us(seconds: float) -> str:
    micro = seconds * 1e6
    return f"{micro:,.0f}" if micro >= 100 else f"{micro:.1f}"


class _PluginTimes(NullRecorder):
    """Keeps the scheduling core's per-plugin timings (it reports them through the Recorder)."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}

    def plugin_duration(self, extension_point: str, plugin: TypedName, seconds: float) -> None:
        self.times.setdefault(plugin.type, []).append(seconds)


def measure_cell(n: int, tokens: int, warm: int, timed: int, seed: int) -> Cell:
    rng = random.Random(seed * 1_000_003 + n * 1_009 + tokens)
    eps = make_endpoints(n, rng)
    recorder = _PluginTimes()
    loaded: LoadedConfig = load_config_text(CONFIG, builtin_registry(), recorder, lambda: eps)
    producers = loaded.prepare_data
    hooks = loaded.pre_request
    scheduler = loaded.scheduler
    work = Workload(rng, tokens)
    prepare: list[float] = []
    sched: list[float] = []
    pre: list[float] = []
    hits = 0.0
    clock = time.perf_counter
    for i in range(warm + timed):
        if i == warm:
            recorder.times.clear()
        request = work.request()  # built here: a few thousand 128k-token prompts would not fit in memory
        cycle = CycleState()
        t0 = clock()
        for producer in producers:
            run_sync(producer.prepare_data(cycle, request, eps))
        t1 = clock()
        result = scheduler.schedule(request, eps, cycle)
        t2 = clock()
        for hook in hooks:
            hook.pre_request(cycle, request, result)
        t3 = clock()
        if i >= warm:
            prepare.append(t1 - t0)
            sched.append(t2 - t1)
            pre.append(t3 - t2)
            match = cycle.read(PREFIX_MATCH_KEY)
            primary = result.primary
            if match is not None and primary is not None:
                hits += match.score(primary.target_endpoints[0].key)
    return Cell(n, tokens, prepare, sched, pre, recorder.times["prefix-cache-scorer"], hits / max(timed, 1))


def measure_memory(total: int, window: int, seed: int, out: Callable[[str], None]) -> tuple[list[str], float]:
    """Streams `total` requests through the producer; tracemalloc traces the last `window` of them. The
    index turns over completely every ~10k requests here (25 new blocks per request, 250k entries), and
    its hash tables are reallocated as they churn, so everything it holds at the end was allocated while
    traced. Returns the table rows (entries at checkpoints; memory at the end) and bytes per entry."""
    rng = random.Random(seed)
    eps = make_endpoints(8, rng, with_blocks=False)

    class _Handle:
        recorder = NullRecorder()

        def plugin(self, name: str) -> None:
            return None

        def endpoints(self) -> Sequence[Endpoint]:
            return eps

        def now(self) -> float:
            return 0.0

        def rng(self, name: str) -> random.Random:
            return random.Random(name)

    producer = ApproxPrefixCacheProducer("approx-prefix-cache-producer", Params(), _Handle())
    index = producer.index
    work = Workload(rng, 1_000, system_share=0.6)
    checkpoints = sorted({total // 100, total // 10, total // 2, total - window, total})
    rows = []
    started = time.perf_counter()
    base = used = 0
    done = 0
    for target in checkpoints:
        if target == total - window:
            gc.collect()
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
        while done < target:
            request = work.request()
            cycle = CycleState()
            run_sync(producer.prepare_data(cycle, request, eps))
            match = cycle.read(PREFIX_MATCH_KEY)
            assert match is not None
            best = max(match.matches.values(), default=0)
            if best:
                chosen = rng.choice([e for e in eps if match.matches.get(e.key, 0) == best])
            else:
                chosen = rng.choice(eps)
            producer.pre_request(cycle, request, SchedulingResult({"default": ProfileResult((chosen,))}, "default"))
            done += 1
        memory = ""
        if done == total:
            gc.collect()
            used = tracemalloc.get_traced_memory()[0] - base
            tracemalloc.stop()
            memory = f"{used / 2**20:,.1f}"
        rows.append(f"| {done:,} | {len(index):,} | {index.distinct_hashes():,} | {memory or '-'} |")
        out(f"  memory: {done:,} requests, {len(index):,} entries ({time.perf_counter() - started:.0f} s)")
    per_entry = used / len(index) if len(index) else 0.0
    return rows, per_entry


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer requests; finishes in under a minute")
    p.add_argument("--smoke", action="store_true", help="two sizes, a handful of requests (seconds; for tests)")
    p.add_argument("--seed", type=int, default=42, help="random seed (default 42)")
    p.add_argument("--output", help="also write the Markdown report here")
    args = p.parse_args(argv)
    warm, timed = (20, 30) if args.smoke else (150, 200) if args.quick else (500, 2_000)
    mem_total, mem_window = (3_000, 2_000) if args.smoke else (30_000, 20_000) if args.quick else (1_000_000, 40_000)
    endpoint_counts = (8, 64) if args.smoke else ENDPOINT_COUNTS
    prompt_tokens = (1_000, 8_000) if args.smoke else PROMPT_TOKENS

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    command = command_line("benchmarks.scheduler_cost", argv)
    out = [
        "## Scheduler cost (in-process)",
        "",
        f"`{command.strip()}`; seed {args.seed}; {machine()}",
        "",
        f"Default config (queue 2 / kv-cache 2 / prefix 3, max-score, approx-prefix-cache-producer); chat requests, "
        f"{GROUPS} shared system prompts (5/6 of the prompt) + unique questions; per cell {warm} warm-up and "
        f"{timed} timed requests. Times in microseconds. `prepare` = producer PrepareData (text, hashes, match); "
        "`schedule` = Scheduler.schedule(); `prefix scorer` = prefix-cache-scorer's share of schedule; "
        "`pre-request` = PreRequest hooks (index update); "
        "`total` = prepare + schedule + pre-request; "
        "`hit` = mean prefix score of the chosen endpoint.",
        "",
        "| endpoints | prompt | n | prepare p50 | schedule p50 | schedule p99 | prefix scorer p50 | pre-request p50 "
        "| total p50 | total p99 | hit |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    started = time.perf_counter()
    try:
        for n in endpoint_counts:
            for tokens in prompt_tokens:
                cell = measure_cell(n, tokens, warm, timed, args.seed)
                out.append(cell.row())
                progress(f"  {n} endpoints x {tokens // 1000}k tokens done ({time.perf_counter() - started:.0f} s)")
        out += [
            "",
            "### Prefix index memory (tracemalloc)",
            "",
            f"8 endpoints, LRU capacity 31,250 entries each (the default, no `cache_num_blocks`), {mem_total:,} "
            f"1k-token chat requests (600 shared + 400 unique tokens, {GROUPS} groups), targets by best prefix "
            f"match. tracemalloc traces the last {mem_window:,} requests: the index turns over completely about "
            "every 10k requests, so all it holds at the end was allocated while traced."
            + (
                " --quick: 30k requests instead of 1M; the LRUs are full after ~10k requests and the size is flat "
                "from then on, so the 1M figure is the same (flat by construction, not a linear extrapolation)."
                if args.quick
                else " --smoke: a few thousand requests; the LRUs do not fill, so the size is NOT the full one."
                if args.smoke
                else ""
            ),
            "",
            "| requests | index entries | distinct hashes | MiB (traced) |",
            "|---:|---:|---:|---:|",
        ]
        rows, per_entry = measure_memory(mem_total, mem_window, args.seed, progress)
        out += rows
        out += [
            "",
            f"{per_entry:,.0f} bytes per entry (the reference's sizing guide estimates ~358 bytes per entry for its Go "
            "index). At full capacity (31,250 entries per endpoint), extrapolated from bytes per entry: "
            + ", ".join(f"{n} endpoints ≈ {per_entry * 31_250 * n / 2**20:,.0f} MiB" for n in ENDPOINT_COUNTS)
            + ".",
        ]
    except KeyboardInterrupt:
        out.append("\n(interrupted: partial results)")
    out.append(f"\nTook {time.perf_counter() - started:.0f} s.")
    report = "\n".join(out)
    print(report)
    if args.output:
        Path(args.output).write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
