"""Precise vs approximate prefix-cache routing in virtual time, and what the KV-block index costs.

Routing (``--routing``): the simulated cluster runs the request path ``llm-epp serve`` runs (endpoint store,
configuration, director, plugins) against simulated vLLM pods on a virtual clock. The configurations:

* ``approximate``: llm-epp's default configuration (``prefix-cache-scorer`` over the EPP's own record of
  where it sent each prompt; prefix 3, kv-cache utilization 2, queue 2, max-score picker: the weights of
  the reference's default and of llm-d's inference-scheduling guide);
* ``approximate 1/1/1``: llm-d-kv-cache's "estimated-scheduling" as its 73%-capacity benchmark publishes it:
  ``prefix-cache-scorer`` with ``maxPrefixBlocksToMatch: 256`` and ``lruCapacityPerServer: 31250``, weights
  prefix 1, kv-cache 1, queue 1. That run predates ``autoTune``: its index cut prompts into fixed 64-character
  blocks and gave every pod a fixed 31,250-block LRU, so ``autoTune: false`` here (blocks of 16 tokens x 4
  characters, the same 64 characters). Its ``kv-cache-scorer`` is today's ``kv-cache-utilization-scorer``;
* ``precise``: ``precise-prefix-cache-producer`` + ``precise-prefix-cache-scorer`` with the published
  precise-scheduling weights (3/2/2), fed by the pods' own KV-cache events (``llm_epp.sim.kv_events``:
  vLLM's BlockStored / BlockRemoved / AllBlocksCleared with vLLM's block hashes, msgpack-encoded, decoded by
  the subscriber's decoder and applied to the index ``--event-delay`` virtual seconds after the engine step
  that produced them). Prompts reach the producer as token ids (what a render endpoint would answer), so
  its keys are the engine's blocks. Block keys use ``xxh64`` (the documented choice for large pools;
  ``cbor-fnv`` routes the same and only costs more wall time);
* ``precise 1/1/1``: the precise producer and scorer with the 1/1/1 weights, to tell the index's part
  from the weights' part (the published benchmark changed both at once);
* ``random``: the published "random-scheduling" (``random-picker`` through the EPP);
* ``round-robin``: a Kubernetes Service in front of the pods (no EPP).

Scenarios (``--scenario``):

* ``anchor``: llm-d's shared_prefix anchor (150 groups x 5 prompts, system prompt 6000 + question 1200
  tokens -> 1000 output tokens, 8 pods of ``qwen3-32b-h100-tp2``); a 30 s warm-up at 15 QPS, then
  ``--ladder`` rates of ``--stage-seconds`` each;
* ``capacity73``: llm-d-kv-cache's 73%-capacity benchmark: the same prompts and pods (the prompts' distinct
  tokens, 150 x 6000 + 750 x 1200 = 1.8 M, are 73% of the 8 pods' 8 x 307,328 = 2.46 M KV tokens), its
  warm-up (15 QPS for 50 s) and, for each ``--ladder`` rate, the duration that benchmark gave that rate
  (``PUBLISHED_LADDER``; ``--ladder published`` runs all 16 stages).

Every configuration gets the same seeded trace on fresh pods; stages follow inference-perf's protocol
(Poisson arrivals; a stage starts when the previous one has finished).

Restart (``--restart K:P[+P...]``): before stage ``K`` starts (the previous stage has drained, the pods are
idle), pods ``P`` restart: their prefix cache is emptied and, as vLLM does, they publish AllBlocksCleared.
The approximate index is never told; the table shows where stage ``K``'s requests went and what the
restarted pods' prefix cache hit.

Index cost (``--index``): events decoded and applied per second on one thread (each BlockStored carrying
one engine step's blocks of a request, as the simulated pods publish them), for both request-key hashes;
and the index's memory per million blocks (tracemalloc over an index filled with blocks, scaled to 10^6).

    python -m benchmarks.precise                 # routing + index cost, writes benchmarks/results/precise.md
    python -m benchmarks.precise --smoke         # seconds: tiny profile and workload, for the test suite
    python -m benchmarks.precise --scenario capacity73 --ladder 20,30,35,40,49,60 --restart 4:0 --no-index
    [--ladder 30,45,60] [--stage-seconds 20] [--seed 1] [--event-delay 0.05] [--output DIR]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.report import command_line, machine, output_path
from llm_epp.framework import EndpointKey
from llm_epp.framework.kvindex import install_kv_index_service
from llm_epp.kvcache.events import DecodeStats, decode_batch
from llm_epp.kvcache.index import KVBlockIndex
from llm_epp.kvcache.request_keys import RequestKeyHasher
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import (
    AVERAGE_CHARS_PER_TOKEN,
    ApproxPrefixCacheProducer,
    block_hashes,
    seed_hash,
)
from llm_epp.sim.cluster import Cluster, StageStats, percentile
from llm_epp.sim.engine import Engine, EngineMetrics, SimRequest
from llm_epp.sim.kv_events import KVEventRecorder, KVEventsOptions, VirtualKVEvents, encode_batch
from llm_epp.sim.profiles import get_profile
from llm_epp.sim.routers import SIM_MODEL, EppRouter, RoundRobinRouter, Router
from llm_epp.sim.workload import SharedPrefixWorkload, Stage

RESULTS = Path(__file__).resolve().parent / "results"

PRECISE_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {blockSizeTokens: 16, hashAlgorithm: xxh64}
- type: precise-prefix-cache-scorer
- type: kv-cache-utilization-scorer
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
    weight: 3
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: max-score-picker
"""

ESTIMATED_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: single-profile-handler
- type: prefix-cache-scorer
  parameters:
    autoTune: false
    maxPrefixBlocksToMatch: 256
    lruCapacityPerServer: 31250
- type: kv-cache-utilization-scorer
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: kv-cache-utilization-scorer
    weight: 1
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: prefix-cache-scorer
    weight: 1
  - pluginRef: max-score-picker
"""

RANDOM_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: single-profile-handler
- type: random-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: random-picker
"""

ROUND_ROBIN = "round-robin"
CONFIGS: dict[str, str | None] = {
    "approximate": None,
    "approximate 1/1/1": ESTIMATED_CONFIG,
    "precise": PRECISE_CONFIG,
    "precise 1/1/1": PRECISE_CONFIG.replace("weight: 3", "weight: 1").replace("weight: 2", "weight: 1"),
    "random": RANDOM_CONFIG,
    ROUND_ROBIN: None,
}
DEFAULT_CONFIGS = ("approximate", "approximate 1/1/1", "precise", "precise 1/1/1")

PUBLISHED_WARMUP = Stage(15, 50)
PUBLISHED_LADDER: dict[float, float] = {
    3: 20, 10: 20, 15: 20, 20: 38, 22: 34, 25: 30, 30: 25, 35: 21,
    40: 38, 43: 36, 46: 33, 49: 30, 52: 29, 55: 27, 57: 26, 60: 25,
}  # fmt: skip
"""llm-d-kv-cache's 73%-capacity ladder: rate (QPS) -> stage duration (s), after the warm-up."""
CAPACITY73_LADDER = "20,35,40,60"
"""The stages run by default: below, at and past the published approximate scheduler's collapse (35-40 QPS)."""


@dataclass(frozen=True)
class Scenario:
    pods: int
    profile: str
    num_groups: int
    prompts_per_group: int
    system_prompt_len: int
    question_len: int
    output_len: int
    stages: tuple[Stage, ...]
    warmup_stages: int = 1

    def workload(self, seed: int) -> SharedPrefixWorkload:
        return SharedPrefixWorkload(
            num_groups=self.num_groups,
            prompts_per_group=self.prompts_per_group,
            system_prompt_len=self.system_prompt_len,
            question_len=self.question_len,
            output_len=self.output_len,
            seed=seed,
        )

    def kv_share(self) -> float:
        """Distinct prompt tokens / the cluster's KV capacity in tokens."""
        p = get_profile(self.profile)
        distinct = self.num_groups * (self.system_prompt_len + self.prompts_per_group * self.question_len)
        return distinct / (self.pods * p.kv_capacity_tokens)


def anchor_scenario(rates: Sequence[float], seconds: float) -> Scenario:
    stages = (Stage(15, 30), *(Stage(r, seconds) for r in rates))
    return Scenario(8, "qwen3-32b-h100-tp2", 150, 5, 6000, 1200, 1000, stages)


def capacity73_scenario(rates: Sequence[float]) -> Scenario:
    """The 73%-capacity benchmark's warm-up, then its stages at ``rates`` with their published durations."""
    if unknown := [r for r in rates if r not in PUBLISHED_LADDER]:
        raise ValueError(f"rates {unknown} are not in the published ladder {sorted(PUBLISHED_LADDER)}")
    stages = (PUBLISHED_WARMUP, *(Stage(r, PUBLISHED_LADDER[r]) for r in rates))
    return Scenario(8, "qwen3-32b-h100-tp2", 150, 5, 6000, 1200, 1000, stages)


def smoke_scenario() -> Scenario:
    return Scenario(4, "tiny", 8, 4, 160, 40, 16, (Stage(5, 2), Stage(10, 2), Stage(20, 2)))


@dataclass(frozen=True)
class Restart:
    """Pods restarted (prefix cache emptied, AllBlocksCleared published) right before ``stage`` starts."""

    stage: int
    pods: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> Restart:
        try:
            stage, pods = text.split(":", 1)
            return cls(int(stage), tuple(int(p) for p in pods.split("+")))
        except ValueError:
            raise ValueError(f"--restart {text!r}: expected STAGE:POD[+POD...], e.g. 4:0 or 4:0+3") from None


@dataclass
class RestartOutcome:
    """What the restarted pods saw during the restart stage."""

    cleared: list[bool] = field(default_factory=list)
    """Per restarted pod: whether its cache was emptied (False: it still had running requests)."""
    requests: list[int] = field(default_factory=list)
    """Per restarted pod: requests of the restart stage routed to it."""
    hit_rate: list[float] = field(default_factory=list)
    """Per restarted pod: its prefix cache hit rate (tokens) over the restart stage."""
    others_hit_rate: float = float("nan")
    """The other pods' prefix cache hit rate over the same stage."""


@dataclass
class Run:
    label: str
    stages: list[StageStats] = field(default_factory=list)
    wall_seconds: float = 0.0
    batches: int = 0
    malformed: int = 0
    restart: RestartOutcome | None = None
    census: list[Census] = field(default_factory=list)
    spread: list[float] = field(default_factory=list)
    """Per stage: mean number of distinct pods a group's requests went to."""
    summary: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Census:
    """After a stage: which (group, pod) pairs hold the group's system prompt, and what the approximate index
    believes (its ``believed_*`` fields stay 0 for configurations without one)."""

    holding: int
    """Pairs whose pod caches at least half of the group's system prompt."""
    partial: int
    """Pairs whose pod caches some, but less than half, of it."""
    believed: int
    """Pairs the approximate index lists (the group's first block hash is in the pod's LRU); -1: no such index."""
    believed_stale: int
    """Of those, pods that no longer cache even the first block."""
    believed_partial: int
    """Of those, pods caching less than half of the system prompt."""


def census(cluster: Cluster, router: Router, workload: SharedPrefixWorkload) -> Census:
    approx = None
    if isinstance(router, EppRouter):
        approx = next((p for p in router.config.plugins.values() if isinstance(p, ApproxPrefixCacheProducer)), None)
    keys = [EndpointKey("default", f"sim-pod-{i}") for i in range(cluster.num_pods)]
    seed = seed_hash(SIM_MODEL)
    holding = partial = believed = stale = believed_partial = 0
    firsts = {p.group: p for p in workload.prompts if p.index == 0}
    for _, prompt in sorted(firsts.items()):
        system = prompt.token_ids[: workload.system_prompt_len]
        holders: set[EndpointKey] = set()
        if approx is not None:
            text = prompt.text[: workload.system_prompt_len * AVERAGE_CHARS_PER_TOKEN].encode()
            block_chars = approx.params.block_size_tokens * AVERAGE_CHARS_PER_TOKEN
            first = block_hashes(text, seed, block_chars, 1)
            holders = set(approx.index.holders(first[0])) if first else set()
        for pod, key in enumerate(keys):
            cached = cluster.cached_prefix_tokens(pod, system)
            held = 2 * cached >= len(system)
            holding += held
            partial += 0 < cached and not held
            if key in holders:
                believed += 1
                stale += cached == 0
                believed_partial += not held
    return Census(holding, partial, believed if approx is not None else -1, stale, believed_partial)


def _hit_rate(hits: int, queries: int) -> float:
    return hits / queries if queries else float("nan")


def run_routing(label: str, scenario: Scenario, seed: int, delay: float, restart: Restart | None = None) -> Run:
    cluster = Cluster(get_profile(scenario.profile), scenario.pods)
    config = CONFIGS[label]
    events: VirtualKVEvents | None = None
    router: Router
    if label.startswith("precise"):
        events = VirtualKVEvents(lambda: cluster.clock, delay=delay, model=SIM_MODEL)
        install_kv_index_service(events)
        try:
            router = EppRouter(scenario.pods, config, seed=seed, token_prompts=True)
        finally:
            install_kv_index_service(None)
        cluster.publish_kv_events(events)
    elif label == ROUND_ROBIN:
        router = RoundRobinRouter(scenario.pods)
    else:
        router = EppRouter(scenario.pods, config, seed=seed)
    run = Run(label)
    start = time.perf_counter()
    tag = f"{label:17s}"
    at_restart: list[EngineMetrics] = []

    workload = scenario.workload(seed)

    def progress(k: int, s: StageStats) -> None:
        run.census.append(census(cluster, router, workload))
        print(
            f"  {tag} stage {k} rate {s.rate:g}: {s.req_per_s:.2f} req/s, TTFT p90 {s.ttft_p90:.2f} s, "
            f"hit {s.prefix_hit_rate:.3f} ({time.perf_counter() - start:.0f} s wall)",
            file=sys.stderr,
            flush=True,
        )
        if restart is None:
            return
        if k + 1 == restart.stage:  # the stage has drained: restart before the next one starts
            outcome = run.restart = RestartOutcome()
            for pod in restart.pods:
                outcome.cleared.append(cluster.engines[pod].reset_prefix_cache())
                if cluster.kv_events is not None:
                    cluster.kv_events.flush(pod, cluster.clock)  # AllBlocksCleared, delivered after the delay
            at_restart[:] = cluster.metrics()
        elif k == restart.stage and run.restart is not None:
            after = cluster.metrics()
            d_hits = [a.prefix_cache_hits - b.prefix_cache_hits for a, b in zip(after, at_restart, strict=True)]
            pairs = list(zip(after, at_restart, strict=True))
            d_queries = [a.prefix_cache_queries - b.prefix_cache_queries for a, b in pairs]
            others = [i for i in range(scenario.pods) if i not in restart.pods]
            run.restart.requests = [s.requests_per_pod[p] for p in restart.pods]
            run.restart.hit_rate = [_hit_rate(d_hits[p], d_queries[p]) for p in restart.pods]
            run.restart.others_hit_rate = _hit_rate(sum(d_hits[i] for i in others), sum(d_queries[i] for i in others))

    result = cluster.run(workload, scenario.stages, router, seed=seed, progress=progress)
    run.stages = result.stages
    pods_of: dict[tuple[int, int], set[int]] = {}
    for r in result.requests:
        if not r.failed:
            pods_of.setdefault((r.stage, r.group), set()).add(r.pod)
    for k in range(len(result.stages)):
        counts = [len(v) for (stage, _), v in pods_of.items() if stage == k]
        run.spread.append(sum(counts) / len(counts) if counts else float("nan"))
    ladder = [r for r in result.requests if r.stage >= scenario.warmup_stages and not r.failed]
    measured = result.stages[scenario.warmup_stages :]
    if ladder and measured:
        ttfts = [r.ttft for r in ladder]
        run.summary = {
            "output_tokens_per_s": sum(s.output_tokens_per_s for s in measured) / len(measured),
            "req_per_s": sum(s.req_per_s for s in measured) / len(measured),
            "ttft_p90": percentile(ttfts, 90),
            "ttft_mean": sum(ttfts) / len(ttfts),
            "prefix_hit_rate": sum(s.prefix_hit_rate for s in measured) / len(measured),
        }
    run.wall_seconds = time.perf_counter() - start
    if events is not None:
        run.batches = events.batches
        run.malformed = events.decode.malformed_messages + events.decode.malformed_events
    return run


# ------------------------------------------------------------------------------------------ index cost


def recorded_batches(n_requests: int, prompt_tokens: int, groups: int, seed: int = 1) -> list[bytes]:
    """Batches a simulated pod publishes while serving a shared-prefix stream (one engine, one step each)."""
    profile = get_profile("qwen3-32b-h100-tp2")
    recorder = KVEventRecorder(profile.block_size)
    engine = Engine(profile, token_events=False, kv_listener=recorder)
    options = KVEventsOptions()
    workload = SharedPrefixWorkload(
        num_groups=groups, prompts_per_group=4, system_prompt_len=prompt_tokens * 4 // 5,
        question_len=prompt_tokens // 5, output_len=64, seed=seed,
    )  # fmt: skip
    payloads: list[bytes] = []
    for i in range(n_requests):
        p = workload.next_prompt()
        engine.submit(SimRequest(f"r{i}", p.token_ids, 64), engine.clock)
        while (t := engine.next_event_time()) is not None:
            engine.advance(t)
            events = recorder.take()
            if events:
                payloads.append(encode_batch(t, events, options))
    return payloads


def apply_rate(payloads: Sequence[bytes], algorithm: str, repeat: int = 1) -> dict[str, float]:
    """Decode + apply on this thread: events/s and blocks/s (fresh index per pass)."""
    events = blocks = 0
    elapsed = 0.0
    for _ in range(repeat):
        index = KVBlockIndex(RequestKeyHasher(16, "", algorithm))
        stats = DecodeStats()
        gc.collect()
        t0 = time.perf_counter()
        for payload in payloads:
            batch = decode_batch(payload, stats)
            if batch is not None:
                index.apply("10.0.0.1:8000", SIM_MODEL, batch)
        elapsed += time.perf_counter() - t0
        events += index.stats.applied + sum(index.stats.skipped.values())
        blocks += index.stats.admissions
    return {"events_per_s": events / elapsed, "blocks_per_s": blocks / elapsed, "us_per_event": 1e6 * elapsed / events}


def memory_per_million_blocks(blocks: int) -> dict[str, float]:
    """Bytes the index holds for `blocks` distinct blocks (one endpoint, chained 16-token blocks), per 10^6."""
    index = KVBlockIndex(RequestKeyHasher(16, "", "xxh64"))
    from llm_epp.kvcache.events import BlockStored, EventBatch

    chain = 64  # blocks per BlockStored
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    made = 0
    parent: int | None = None
    while made < blocks:
        toks = tuple(range(made * 16, (made + chain) * 16))
        hashes = tuple(range(made + 1, made + chain + 1))
        ev = BlockStored(block_hashes=hashes, parent_block_hash=parent if made % 1024 else None, token_ids=toks,
                         block_size=16)  # fmt: skip
        index.apply("10.0.0.1:8000", SIM_MODEL, EventBatch(0.0, (ev,)))
        parent = hashes[-1]
        made += chain
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return {"blocks": float(len(index)), "bytes": float(used), "mib_per_million": used / len(index) * 1e6 / 2**20}


# ------------------------------------------------------------------------------------------ report


def _f(v: float, d: int = 2) -> str:
    return "n/a" if v != v else f"{v:.{d}f}"


def routing_table(runs: Sequence[Run], scenario: Scenario) -> list[str]:
    lines = [
        "| configuration | stage | QPS | requests | req/s | output tok/s | TTFT mean (s) | TTFT p50 (s) "
        "| TTFT p90 (s) | prefix hit rate | pods per group | preemptions |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        for k, s in enumerate(run.stages):
            tag = " (warm-up)" if k < scenario.warmup_stages else ""
            spread = run.spread[k] if k < len(run.spread) else float("nan")
            lines.append(
                f"| {run.label} | {k}{tag} | {s.rate:g} | {s.requests} | {_f(s.req_per_s)} | "
                f"{_f(s.output_tokens_per_s, 0)} | {_f(s.ttft_mean)} | {_f(s.ttft_p50)} | {_f(s.ttft_p90)} | "
                f"{_f(s.prefix_hit_rate, 3)} | {_f(spread)} | {s.preemptions} |"
            )
    return lines


def summary_table(runs: Sequence[Run]) -> list[str]:
    lines = [
        "| configuration | output tok/s | req/s | TTFT p90 (s) | TTFT mean (s) | prefix hit rate |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        if r.summary:
            m = r.summary
            lines.append(
                f"| {r.label} | {m['output_tokens_per_s']:,.0f} | {_f(m['req_per_s'])} | {_f(m['ttft_p90'])} | "
                f"{_f(m['ttft_mean'])} | {_f(m['prefix_hit_rate'], 3)} |"
            )
    return lines


def census_table(runs: Sequence[Run], scenario: Scenario) -> list[str]:
    lines = [
        "| configuration | after stage | pods holding a group (sum over groups) | partly holding | approximate "
        "index lists | of which hold nothing | of which hold < half |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        for k, c in enumerate(run.census):
            listed = f"{c.believed} | {c.believed_stale} | {c.believed_partial}" if c.believed >= 0 else "- | - | -"
            lines.append(f"| {run.label} | {k} | {c.holding} | {c.partial} | {listed} |")
    return lines


def restart_table(runs: Sequence[Run], restart: Restart) -> list[str]:
    lines = [
        "| configuration | restarted pod | cache emptied | stage requests sent to it (of all) | its prefix hit rate "
        "| other pods' prefix hit rate | stage TTFT p90 (s) |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for run in runs:
        o = run.restart
        if o is None or not o.requests:
            continue
        stage = run.stages[restart.stage]
        for i, pod in enumerate(restart.pods):
            lines.append(
                f"| {run.label} | {pod} | {'yes' if o.cleared[i] else 'no'} | {o.requests[i]} ({stage.requests}) | "
                f"{_f(o.hit_rate[i], 3)} | {_f(o.others_hit_rate, 3)} | {_f(stage.ttft_p90)} |"
            )
    return lines


def describe(scenario: Scenario, name: str) -> str:
    p = get_profile(scenario.profile)
    rates = ", ".join(f"{s.rate:g} ({s.duration:g} s)" for s in scenario.stages[scenario.warmup_stages :])
    warm = scenario.stages[0]
    origin = (
        "llm-d-kv-cache's 73%-capacity benchmark: its warm-up and, for each rate run here, the duration it gave "
        "that rate (its full ladder has 16 stages, 3 to 60 QPS)"
        if name == "capacity73"
        else "a short ladder (the published ladder has 16 stages)"
    )
    return (
        f"{scenario.pods} pods `{scenario.profile}` ({p.kv_capacity_tokens:,} KV tokens each, blocks of "
        f"{p.block_size} tokens); shared prefix {scenario.num_groups} groups x {scenario.prompts_per_group} "
        f"prompts, system {scenario.system_prompt_len} + question {scenario.question_len} tokens -> "
        f"{scenario.output_len} output tokens: distinct prompt tokens are {scenario.kv_share():.0%} of the "
        f"cluster's KV capacity. Stage 0 is a warm-up ({warm.rate:g} QPS for {warm.duration:g} s); each later "
        "stage sends rate x duration Poisson arrivals and starts when the previous one has finished "
        f"(inference-perf's protocol). Stages, QPS (duration): {rates}; {origin}."
    )


def report(args: argparse.Namespace, scenario: Scenario, runs: Sequence[Run], cost: dict[str, Any]) -> str:
    sources: list[tuple[str, str]] = getattr(args, "sources", None) or [
        (command_line("benchmarks.precise", args.argv), machine())
    ]
    if len(sources) == 1:
        head = [f"Command: `{sources[0][0]}`  ", f"Machine: {sources[0][1]}  "]
    else:
        head = ["Combined (`--combine`) from runs made in separate processes:", ""]
        head += [f"* `{command}` ({where})" for command, where in sources]
        head += [""]
    out = [
        "# Precise vs approximate prefix-cache routing",
        "",
        *head,
        f"Seed {args.seed}; KV events delivered {args.event_delay:g} s (virtual) after the step that produced them.",
        "",
    ]
    if runs:
        out += [
            "## Routing in virtual time",
            "",
            describe(scenario, args.scenario),
            "",
            "Summary over the stages after the warm-up (output tok/s, req/s and hit rate: mean of the stages; "
            "TTFT over all their requests):",
            "",
            *summary_table(runs),
            "",
            "Per stage (pods per group: the mean number of distinct pods a group's requests went to in the stage):",
            "",
            *routing_table(runs, scenario),
            "",
            "Where the groups' system prompts are after each stage, and what the approximate index believes "
            f"(a pair is one group on one pod; {scenario.num_groups} groups x {scenario.pods} pods = "
            f"{scenario.num_groups * scenario.pods} pairs):",
            "",
            *census_table(runs, scenario),
            "",
        ]
        if args.restart is not None:
            out += [
                f"Restart: before stage {args.restart.stage}, pod(s) {', '.join(map(str, args.restart.pods))} "
                "restarted (prefix cache emptied, AllBlocksCleared published):",
                "",
                *restart_table(runs, args.restart),
                "",
            ]
        out += [
            "| configuration | wall time (s) | event batches delivered | malformed |",
            "|---|---:|---:|---:|",
            *(f"| {r.label} | {r.wall_seconds:.0f} | {r.batches} | {r.malformed} |" for r in runs),
            "",
        ]
    if cost:
        out += [
            "## Index cost (one thread)",
            "",
            f"{cost['batches']} batches ({cost['events']} events) recorded from one simulated pod serving a "
            "shared-prefix stream, decoded and applied to a fresh index:",
            "",
            "| request-key hash | events/s | blocks/s | µs per event |",
            "|---|---:|---:|---:|",
            *(
                f"| {alg} | {v['events_per_s']:,.0f} | {v['blocks_per_s']:,.0f} | {v['us_per_event']:.1f} |"
                for alg, v in cost["apply"].items()
            ),
            "",
            f"Memory: {cost['memory']['blocks']:,.0f} blocks held (one endpoint) took "
            f"{cost['memory']['bytes'] / 2**20:.1f} MiB (tracemalloc): **{cost['memory']['mib_per_million']:.0f} MiB "
            "per million blocks** (linear scaling from that size). A block held by several endpoints adds one "
            "holder entry per endpoint.",
            "",
        ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    ap.add_argument(
        "--ladder",
        default=None,
        help="QPS of the stages after the warm-up (anchor: 30,45,60; capacity73: 20,30,35,40,49,60, or 'published')",
    )
    ap.add_argument("--stage-seconds", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--event-delay", type=float, default=0.05, help="virtual seconds from engine step to index")
    ap.add_argument("--configs", default=None, help=f"routing configurations: {', '.join(CONFIGS)}")
    ap.add_argument("--scenario", choices=("anchor", "capacity73"), default="anchor")
    ap.add_argument("--restart", type=Restart.parse, default=None, help="STAGE:POD[+POD...]")
    ap.add_argument("--no-routing", action="store_true")
    ap.add_argument("--no-index", action="store_true")
    ap.add_argument(
        "--output", type=Path, help="result directory (default results; with --smoke a temporary directory)"
    )
    ap.add_argument("--name", default="precise", help="result file name (NAME.md, NAME.json) under --output")
    ap.add_argument(
        "--combine",
        nargs="+",
        type=Path,
        default=None,
        help="write one report from the runs of these result files (same scenario; e.g. configurations run apart)",
    )
    args = ap.parse_args(argv)
    args.argv = argv
    args.output = output_path(args.output, RESULTS, args.smoke)
    if args.combine:
        return combine(args)
    if args.smoke:
        scenario = smoke_scenario()
    elif args.scenario == "capacity73":
        ladder = args.ladder or CAPACITY73_LADDER
        rates = list(PUBLISHED_LADDER) if ladder == "published" else _rates(ladder)
        try:
            scenario = capacity73_scenario(rates)
        except ValueError as e:
            ap.error(str(e))
    else:
        scenario = anchor_scenario(_rates(args.ladder or "30,45,60"), args.stage_seconds)
    if args.restart is not None and not (
        1 <= args.restart.stage < len(scenario.stages) and all(0 <= p < scenario.pods for p in args.restart.pods)
    ):
        ap.error(f"--restart: stage must be 1..{len(scenario.stages) - 1}, pods 0..{scenario.pods - 1}")
    runs: list[Run] = []
    cost: dict[str, Any] = {}
    args.output.mkdir(parents=True, exist_ok=True)
    default = CONFIGS if args.scenario == "capacity73" else DEFAULT_CONFIGS
    labels = [c.strip() for c in (args.configs or ",".join(default)).split(",") if c.strip()]
    if unknown := [c for c in labels if c not in CONFIGS]:
        ap.error(f"unknown configuration(s) {unknown}; known: {', '.join(CONFIGS)}")
    if not args.no_routing:
        for label in labels:
            print(f"routing: {label}", file=sys.stderr, flush=True)
            runs.append(run_routing(label, scenario, args.seed, args.event_delay, args.restart))
            write(args, scenario, runs, cost)  # what has finished survives an interrupted run
    if not args.no_index:
        print("index cost", file=sys.stderr, flush=True)
        n_req, tokens, groups, mem_blocks = (20, 256, 4, 20_000) if args.smoke else (150, 2048, 15, 100_000)
        payloads = recorded_batches(n_req, tokens, groups)
        stats = DecodeStats()
        events = 0
        for payload in payloads:
            batch = decode_batch(payload, stats)
            events += len(batch.events) if batch is not None else 0
        cost = {
            "batches": len(payloads),
            "events": events,
            "apply": {alg: apply_rate(payloads, alg) for alg in ("cbor-fnv", "xxh64")},
            "memory": memory_per_million_blocks(mem_blocks),
        }
    write(args, scenario, runs, cost)
    print(f"wrote {args.output / (args.name + '.md')}", file=sys.stderr)
    return 0


def _run_from_json(d: dict[str, Any]) -> Run:
    run = Run(d["label"], [StageStats(**{**s, "requests_per_pod": tuple(s["requests_per_pod"])}) for s in d["stages"]])
    run.wall_seconds, run.batches, run.malformed = d["wall_seconds"], d["batches"], d["malformed"]
    run.summary, run.spread = d["summary"], d["spread"]
    run.census = [Census(**c) for c in d["census"]]
    run.restart = RestartOutcome(**d["restart"]) if d["restart"] else None
    return run


def combine(args: argparse.Namespace) -> int:
    """One report from runs written apart (each file holds some configurations of one scenario and seed)."""
    runs: list[Run] = []
    cost: dict[str, Any] = {}
    sources: list[tuple[str, str]] = []
    first: dict[str, Any] | None = None
    for path in args.combine:
        data = json.loads(path.read_text())
        if first is None:
            first = data
        elif (data["scenario"], data["seed"], data["restart"]) != (first["scenario"], first["seed"], first["restart"]):
            raise SystemExit(f"{path}: another scenario, seed or restart than {args.combine[0]}; cannot combine")
        runs += [_run_from_json(r) for r in data["runs"]]
        sources += [tuple(x) for x in data.get("sources", [(str(path.name), "machine not recorded")])]
        cost = data["index"] or cost
    assert first is not None
    sc = first["scenario"]
    scenario = Scenario(**{**sc, "stages": tuple(Stage(**st) for st in sc["stages"])})
    args.scenario, args.seed, args.event_delay = first["scenario_name"], first["seed"], first["event_delay"]
    args.restart = Restart(first["restart"]["stage"], tuple(first["restart"]["pods"])) if first["restart"] else None
    args.sources = sources
    order = list(CONFIGS)
    runs.sort(key=lambda r: order.index(r.label) if r.label in order else len(order))
    args.output.mkdir(parents=True, exist_ok=True)
    write(args, scenario, runs, cost)
    print(f"wrote {args.output / (args.name + '.md')}", file=sys.stderr)
    return 0


def _rates(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _run_json(r: Run) -> dict[str, Any]:
    return {
        "label": r.label,
        "wall_seconds": r.wall_seconds,
        "batches": r.batches,
        "malformed": r.malformed,
        "summary": r.summary,
        "spread": r.spread,
        "census": [asdict(c) for c in r.census],
        "restart": asdict(r.restart) if r.restart is not None else None,
        "stages": [asdict(s) for s in r.stages],
    }


def write(args: argparse.Namespace, scenario: Scenario, runs: Sequence[Run], cost: dict[str, Any]) -> None:
    (args.output / f"{args.name}.md").write_text(report(args, scenario, runs, cost))
    sources: list[tuple[str, str]] = getattr(args, "sources", None) or [
        (command_line("benchmarks.precise", args.argv), machine())
    ]
    data = {
        "sources": sources,
        "scenario_name": args.scenario,
        "restart": asdict(args.restart) if args.restart is not None else None,
        "seed": args.seed,
        "event_delay": args.event_delay,
        "scenario": {**asdict(scenario), "stages": [asdict(s) for s in scenario.stages]},
        "runs": [_run_json(r) for r in runs],
        "index": cost,
    }
    (args.output / f"{args.name}.json").write_text(json.dumps(data, indent=1, default=float))


if __name__ == "__main__":
    raise SystemExit(main())
