"""Precise vs approximate prefix-cache routing in virtual time, and what the KV-block index costs.

Routing (``--routing``): the simulated cluster runs the request path ``llm-epp serve`` runs (endpoint store,
configuration, director, plugins) against simulated vLLM pods on a virtual clock. Two configurations with
the same weights (prefix 3, kv-cache utilization 2, queue 2, max-score picker), differing only in where the
prefix information comes from:

* ``approximate``: llm-epp's default configuration (``prefix-cache-scorer`` over the EPP's own record of
  where it sent each prompt);
* ``approximate 1/1/1``: the same with the weights of llm-d-kv-cache's "estimated" scheduler (prefix 1,
  kv-cache utilization 1, queue 1), the one its 73%-capacity benchmark compares with;
* ``precise``: ``precise-prefix-cache-producer`` + ``precise-prefix-cache-scorer``, fed by the pods' own
  KV-cache events (``llm_epp.sim.kv_events``: vLLM's BlockStored / BlockRemoved with vLLM's block hashes,
  msgpack-encoded, decoded by the subscriber's decoder and applied to the index ``--event-delay`` virtual
  seconds after the engine step that produced them). Prompts reach the producer as token ids (what a
  render endpoint would answer), so its keys are the engine's blocks. Block keys use ``xxh64`` (the
  documented choice for large pools; ``cbor-fnv`` routes the same and only costs more wall time);
* ``precise 1/1/1``: the precise producer and scorer with the 1/1/1 weights, to tell the index's part
  from the weights' part.

Workload: the anchor (llm-d's shared_prefix: 150 groups x 5 prompts, system prompt 6000 + question 1200
tokens -> 1000 output tokens, 8 pods of ``qwen3-32b-h100-tp2``). It is also the 73%-capacity workload of
llm-d-kv-cache's benchmark: the prompts' distinct tokens, 150 x 6000 + 750 x 1200 = 1.8 M, are 73% of the
8 pods' 8 x 307,328 = 2.46 M KV tokens. Every configuration gets the same seeded trace on fresh pods:
a warm-up stage, then a short ladder of rates (the published ladder has 16 stages up to 60 QPS; this one
has fewer, see ``--ladder``).

Index cost (``--index``): events decoded and applied per second on one thread (each BlockStored carrying
one engine step's blocks of a request, as the simulated pods publish them), for both request-key hashes;
and the index's memory per million blocks (tracemalloc over an index filled with blocks, scaled to 10^6).

    python -m benchmarks.precise                 # routing + index cost, writes benchmarks/results/precise.md
    python -m benchmarks.precise --smoke         # seconds: tiny profile and workload, for the test suite
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

from benchmarks.report import command_line, machine
from llm_epp.framework.kvindex import install_kv_index_service
from llm_epp.kvcache.events import DecodeStats, decode_batch
from llm_epp.kvcache.index import KVBlockIndex
from llm_epp.kvcache.request_keys import RequestKeyHasher
from llm_epp.sim.cluster import Cluster, StageStats
from llm_epp.sim.engine import Engine, SimRequest
from llm_epp.sim.kv_events import KVEventRecorder, KVEventsOptions, VirtualKVEvents, encode_batch
from llm_epp.sim.profiles import get_profile
from llm_epp.sim.routers import SIM_MODEL, EppRouter
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
- type: prefix-cache-scorer
- type: kv-cache-utilization-scorer
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
    weight: 1
  - pluginRef: kv-cache-utilization-scorer
    weight: 1
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: max-score-picker
"""

CONFIGS: dict[str, str | None] = {
    "approximate": None,
    "approximate 1/1/1": ESTIMATED_CONFIG,
    "precise": PRECISE_CONFIG,
    "precise 1/1/1": PRECISE_CONFIG.replace("weight: 3", "weight: 1").replace("weight: 2", "weight: 1"),
}


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


def smoke_scenario() -> Scenario:
    return Scenario(4, "tiny", 8, 4, 160, 40, 16, (Stage(5, 2), Stage(10, 2), Stage(20, 2)))


@dataclass
class Run:
    label: str
    stages: list[StageStats] = field(default_factory=list)
    wall_seconds: float = 0.0
    batches: int = 0
    malformed: int = 0


def run_routing(label: str, scenario: Scenario, seed: int, delay: float) -> Run:
    cluster = Cluster(get_profile(scenario.profile), scenario.pods)
    config = CONFIGS[label]
    events: VirtualKVEvents | None = None
    if label.startswith("precise"):
        events = VirtualKVEvents(lambda: cluster.clock, delay=delay, model=SIM_MODEL)
        install_kv_index_service(events)
        try:
            router = EppRouter(scenario.pods, config, seed=seed, token_prompts=True)
        finally:
            install_kv_index_service(None)
        cluster.publish_kv_events(events)
    else:
        router = EppRouter(scenario.pods, config, seed=seed)
    run = Run(label)
    start = time.perf_counter()
    tag = f"{label:17s}"

    def progress(k: int, s: StageStats) -> None:
        print(
            f"  {tag} stage {k} rate {s.rate:g}: {s.req_per_s:.2f} req/s, TTFT p90 {s.ttft_p90:.2f} s, "
            f"hit {s.prefix_hit_rate:.3f} ({time.perf_counter() - start:.0f} s wall)",
            file=sys.stderr,
            flush=True,
        )

    result = cluster.run(scenario.workload(seed), scenario.stages, router, seed=seed, progress=progress)
    run.stages = result.stages
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
        "| configuration | stage | QPS | requests | req/s | TTFT p50 (s) | TTFT p90 (s) | prefix hit rate "
        "| preemptions |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        for k, s in enumerate(run.stages):
            tag = " (warm-up)" if k < scenario.warmup_stages else ""
            lines.append(
                f"| {run.label} | {k}{tag} | {s.rate:g} | {s.requests} | {_f(s.req_per_s)} | {_f(s.ttft_p50)} | "
                f"{_f(s.ttft_p90)} | {_f(s.prefix_hit_rate, 3)} | {s.preemptions} |"
            )
    return lines


def report(args: argparse.Namespace, scenario: Scenario, runs: Sequence[Run], cost: dict[str, Any]) -> str:
    out = [
        "# Precise vs approximate prefix-cache routing",
        "",
        f"Command: `{command_line('benchmarks.precise', args.argv)}`  ",
        f"Machine: {machine()}  ",
        f"Seed {args.seed}; KV events delivered {args.event_delay:g} s (virtual) after the step that produced them.",
        "",
    ]
    if runs:
        p = get_profile(scenario.profile)
        out += [
            "## Routing in virtual time",
            "",
            f"{scenario.pods} pods `{scenario.profile}` ({p.kv_capacity_tokens:,} KV tokens each); shared prefix "
            f"{scenario.num_groups} groups x {scenario.prompts_per_group} prompts, system {scenario.system_prompt_len}"
            f" + question {scenario.question_len} tokens -> {scenario.output_len} output tokens: distinct prompt "
            f"tokens are {scenario.kv_share():.0%} of the cluster's KV capacity. Stage 0 is a warm-up; each later "
            "stage sends rate x duration Poisson arrivals and starts when the previous one has finished "
            f"(inference-perf's protocol). Ladder: {', '.join(f'{s.rate:g}' for s in scenario.stages[1:])} QPS, "
            f"{scenario.stages[-1].duration:g} s each (the published ladder has 16 stages; this one is shorter to "
            "keep a run within minutes).",
            "",
            *routing_table(runs, scenario),
            "",
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
    ap.add_argument("--ladder", default="30,45,60", help="QPS of the stages after the warm-up")
    ap.add_argument("--stage-seconds", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--event-delay", type=float, default=0.05, help="virtual seconds from engine step to index")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"routing configurations: {', '.join(CONFIGS)}")
    ap.add_argument("--no-routing", action="store_true")
    ap.add_argument("--no-index", action="store_true")
    ap.add_argument("--output", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    args.argv = argv
    if args.smoke:
        scenario = smoke_scenario()
    else:
        scenario = anchor_scenario([float(x) for x in args.ladder.split(",") if x.strip()], args.stage_seconds)
    runs: list[Run] = []
    cost: dict[str, Any] = {}
    args.output.mkdir(parents=True, exist_ok=True)
    labels = [c.strip() for c in args.configs.split(",") if c.strip()]
    if unknown := [c for c in labels if c not in CONFIGS]:
        ap.error(f"unknown configuration(s) {unknown}; known: {', '.join(CONFIGS)}")
    if not args.no_routing:
        for label in labels:
            print(f"routing: {label}", file=sys.stderr, flush=True)
            runs.append(run_routing(label, scenario, args.seed, args.event_delay))
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
    print(f"wrote {args.output / 'precise.md'}", file=sys.stderr)
    return 0


def _run_json(r: Run) -> dict[str, Any]:
    return {
        "label": r.label,
        "wall_seconds": r.wall_seconds,
        "batches": r.batches,
        "malformed": r.malformed,
        "stages": [asdict(s) for s in r.stages],
    }


def write(args: argparse.Namespace, scenario: Scenario, runs: Sequence[Run], cost: dict[str, Any]) -> None:
    (args.output / "precise.md").write_text(report(args, scenario, runs, cost))
    data = {
        "seed": args.seed,
        "event_delay": args.event_delay,
        "scenario": {**asdict(scenario), "stages": [asdict(s) for s in scenario.stages]},
        "runs": [_run_json(r) for r in runs],
        "index": cost,
    }
    (args.output / "precise.json").write_text(json.dumps(data, indent=1, default=float))


if __name__ == "__main__":
    raise SystemExit(main())
