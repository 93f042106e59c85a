"""SLO attainment and goodput on a mixed workload, in virtual time through the real request path.

Two classes of requests share a pool of simulated pods (`llm_epp.sim`, profile `qwen3-32b-h100-tp2`):

* interactive: short prompts (a 512-token system prompt shared by 16 groups + a 128-token question), 64
  output tokens, a tight TTFT SLO in `x-llm-d-slo-ttft-ms`, InferenceObjective `interactive` (priority 10);
* batch: long prompts (6000 tokens, nothing shared), 256 output tokens, no SLO header, objective `batch`
  (priority 0).

Arrivals are two merged Poisson streams. Each EPP configuration routes the same trace through
`EppRouter` (the store, configuration loading, director and plugins of `llm-epp serve`):

* `default`: the default configuration (queue, KV-cache and prefix-cache scorers);
* `predicted-latency`: the reference chart's `latencyPredictor.enabled` profile (predicted-latency-producer,
  prefix affinity gates, slo-headroom-tier-filter, latency-scorer, weighted-random-picker,
  latency-slo-admitter), the predictor trained online from the run's own responses;
* `predicted-latency-scorer`: the single-plugin form (predicted-latency-scorer alone, max-score-picker), with
  `streamingMode: false` since the workload sets TTFT SLOs only;
* `flow-control`: the default scorers behind the `flowControl` gate, interactive and batch in separate
  priority bands, dispatched while a concurrency detector says the pool has room.

Reported per configuration: interactive SLO attainment (TTFT <= SLO; a refused request misses), interactive
TTFT p50/p90, batch completions and TTFT p50, goodput (requests per second that met their goal: interactive
within the SLO, batch completed) and output tokens per second of those requests.

The predictor refits on the request path's clock, virtual here, and its fits run inline at a fixed virtual
instant, so a repeated run gives the same numbers (all but the wall time).

Run: python -m benchmarks.slo [--seeds 1,2] [--duration 60] [--output benchmarks/results/slo.md]
(`make bench-slo`; --smoke: the tiny profile and a few seconds, for `make bench-smoke`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.report import output_path
from llm_epp.datalayer.objectives import parse_objectives_file
from llm_epp.sim.cluster import Cluster, RequestResult, TraceRequest, percentile
from llm_epp.sim.profiles import get_profile
from llm_epp.sim.routers import EppRouter
from llm_epp.sim.workload import Prompt, SharedPrefixWorkload, poisson_offsets

RESULTS = Path(__file__).parent / "results" / "slo.md"
BATCH_GROUP = 1000  # batch prompts' group numbers start here (to tell the classes apart in the results)
OBJECTIVES = "objectives: [{name: interactive, priority: 10}, {name: batch, priority: 0}]"

PREDICTED_LATENCY = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: predicted-latency-producer
- name: strict-affinity-filter
  type: prefix-cache-affinity-filter
  parameters: {affinityThreshold: 0.99}
- name: loose-affinity-filter
  type: prefix-cache-affinity-filter
  parameters: {affinityThreshold: 0.80}
- type: latency-scorer
- type: weighted-random-picker
- type: slo-headroom-tier-filter
- type: latency-slo-admitter
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-producer
  - pluginRef: strict-affinity-filter
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: loose-affinity-filter
  - pluginRef: latency-scorer
  - pluginRef: weighted-random-picker
"""

PREDICTED_LATENCY_SCORER = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: predicted-latency-scorer
  parameters: {streamingMode: false}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-scorer
  - pluginRef: max-score-picker
"""

FLOW_CONTROL = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- name: detector
  type: concurrency-detector
  parameters: {{maxConcurrency: {max_concurrency}}}
flowControl:
  saturationDetector: {{pluginRef: detector}}
  priorityBands:
  - {{priority: 10}}
  - {{priority: 0}}
schedulingProfiles:
- name: default
  plugins:
  - {{pluginRef: queue-scorer, weight: 2}}
  - {{pluginRef: kv-cache-utilization-scorer, weight: 2}}
  - {{pluginRef: prefix-cache-scorer, weight: 3}}
"""

CONFIGS = ("default", "predicted-latency", "predicted-latency-scorer", "flow-control")


@dataclass(frozen=True, slots=True)
class Scenario:
    profile: str
    pods: int
    duration: float  # seconds of arrivals
    interactive_rate: float
    batch_rate: float
    ttft_slo_ms: float
    interactive: tuple[int, int, int, int]  # groups, prompts per group, system prompt, question tokens
    interactive_output: int
    batch_prompt: int
    batch_output: int
    max_concurrency: int  # flow control: in-flight requests per pod before the pool counts as saturated


FULL = Scenario("qwen3-32b-h100-tp2", 4, 60.0, 20.0, 5.0, 400.0, (16, 8, 512, 128), 64, 6000, 256, 24)
SMOKE = Scenario("tiny", 2, 3.0, 10.0, 1.0, 200.0, (4, 4, 64, 16), 8, 600, 16, 8)


def config_text(name: str, scenario: Scenario) -> str | None:
    if name == "default":
        return None
    if name == "predicted-latency":
        return PREDICTED_LATENCY
    if name == "predicted-latency-scorer":
        return PREDICTED_LATENCY_SCORER
    if name == "flow-control":
        return FLOW_CONTROL.format(max_concurrency=scenario.max_concurrency)
    raise KeyError(f"unknown configuration {name!r}; known: {', '.join(CONFIGS)}")


def trace(scenario: Scenario, seed: int) -> list[TraceRequest]:
    groups, per_group, system, question = scenario.interactive
    interactive = SharedPrefixWorkload(
        num_groups=groups,
        prompts_per_group=per_group,
        system_prompt_len=system,
        question_len=question,
        output_len=scenario.interactive_output,
        seed=seed,
    )
    n_batch = max(round(scenario.batch_rate * scenario.duration), 1)
    batch = SharedPrefixWorkload(
        num_groups=n_batch,
        prompts_per_group=1,
        system_prompt_len=0,
        question_len=scenario.batch_prompt,
        output_len=scenario.batch_output,
        seed=seed + 1,
    )
    rng = random.Random(seed)
    slo = {"x-llm-d-slo-ttft-ms": f"{scenario.ttft_slo_ms:g}", "x-llm-d-inference-objective": "interactive"}
    batch_headers = {"x-llm-d-inference-objective": "batch"}
    out: list[tuple[float, Prompt, dict[str, str]]] = []
    n_inter = max(round(scenario.interactive_rate * scenario.duration), 1)
    for t in poisson_offsets(scenario.interactive_rate, n_inter, rng):
        out.append((t, interactive.next_prompt(), slo))
    for t in poisson_offsets(scenario.batch_rate, n_batch, rng):
        p = batch.next_prompt()
        out.append((t, dataclasses.replace(p, group=BATCH_GROUP + p.group), batch_headers))
    out.sort(key=lambda x: x[0])
    return [TraceRequest(t, p, h) for t, p, h in out]


@dataclass(frozen=True, slots=True)
class Outcome:
    config: str
    seed: int
    interactive: int
    met: int
    interactive_failed: int
    ttft_p50: float
    ttft_p90: float
    batch: int
    batch_done: int
    batch_ttft_p50: float
    span: float  # first arrival to last finish, seconds
    goodput: float  # requests/s that met their goal
    good_tokens: float  # output tokens/s of those requests
    wall: float  # seconds this run took

    @property
    def attainment(self) -> float:
        return self.met / self.interactive if self.interactive else 0.0


def measure(config: str, seed: int, scenario: Scenario, results: Sequence[RequestResult], wall: float) -> Outcome:
    slo_s = scenario.ttft_slo_ms / 1000.0
    inter = [r for r in results if r.group < BATCH_GROUP]
    batch = [r for r in results if r.group >= BATCH_GROUP]
    met = [r for r in inter if not r.failed and r.ttft <= slo_s]
    done = [r for r in batch if not r.failed]
    ok_ttft = [r.ttft for r in inter if not r.failed]
    span = max(r.finish for r in results) - min(r.arrival for r in results)
    good = met + done
    return Outcome(
        config=config,
        seed=seed,
        interactive=len(inter),
        met=len(met),
        interactive_failed=sum(r.failed for r in inter),
        ttft_p50=percentile(ok_ttft, 50) if ok_ttft else float("nan"),
        ttft_p90=percentile(ok_ttft, 90) if ok_ttft else float("nan"),
        batch=len(batch),
        batch_done=len(done),
        batch_ttft_p50=percentile([r.ttft for r in done], 50) if done else float("nan"),
        span=span,
        goodput=len(good) / span if span > 0 else 0.0,
        good_tokens=sum(r.completion_tokens for r in good) / span if span > 0 else 0.0,
        wall=wall,
    )


def run_one(config: str, seed: int, scenario: Scenario) -> Outcome:
    cluster = Cluster(get_profile(scenario.profile), scenario.pods)
    objectives = parse_objectives_file(OBJECTIVES, "objectives.yaml")
    # The latency predictor trains on TTFT and TPOT, which an EPP reads only with response bodies streamed to
    # it: the hooks run at the first token and the completion carries its usage.
    router = EppRouter(
        scenario.pods,
        config_text(config, scenario),
        seed=seed,
        objectives=objectives,
        response_headers_at="first-token",
        response_usage=True,
    )
    t0 = time.perf_counter()
    try:
        results = cluster.run_trace(trace(scenario, seed), router)
    finally:
        for plugin in router.config.plugins.values():
            close = getattr(plugin, "close", None)
            if callable(close):
                close()
    return measure(config, seed, scenario, results, time.perf_counter() - t0)


def _mean(values: Sequence[float]) -> str:
    m = statistics.fmean(values)
    if len(values) < 2:
        return f"{m:.3g}"
    return f"{m:.3g} ± {statistics.stdev(values):.2g}"


def report(scenario: Scenario, outcomes: Sequence[Outcome], seeds: Sequence[int]) -> str:
    lines = [
        "# SLO attainment and goodput on a mixed workload",
        "",
        f"`python -m benchmarks.slo --seeds {','.join(map(str, seeds))} --duration {scenario.duration:g}`"
        f" — profile `{scenario.profile}`, {scenario.pods} pods, virtual time, through `EppRouter` (the"
        " request path of `llm-epp serve`).",
        "",
        f"Workload: interactive {scenario.interactive_rate:g} req/s (prompts {sum(scenario.interactive[2:])}"
        f" tokens, {scenario.interactive[2]} shared per group, {scenario.interactive_output} output tokens,"
        f" TTFT SLO {scenario.ttft_slo_ms:g} ms in `x-llm-d-slo-ttft-ms`) and batch {scenario.batch_rate:g}"
        f" req/s (prompts {scenario.batch_prompt} tokens, {scenario.batch_output} output tokens, no SLO) for"
        f" {scenario.duration:g} s; the same trace for every configuration. Flow control: a"
        f" `concurrency-detector` with `maxConcurrency: {scenario.max_concurrency}` per pod as its saturation"
        " detector. Mean over seeds (± standard deviation when there are several).",
        "",
        "| configuration | interactive SLO attainment | interactive TTFT p50 / p90 (s) | interactive refused |"
        " batch completed | batch TTFT p50 (s) | goodput (req/s) | good output tok/s | wall s/run |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for config in dict.fromkeys(o.config for o in outcomes):
        rows = [o for o in outcomes if o.config == config]
        lines.append(
            f"| {config} | {_mean([o.attainment * 100 for o in rows])}% |"
            f" {_mean([o.ttft_p50 for o in rows])} / {_mean([o.ttft_p90 for o in rows])} |"
            f" {_mean([o.interactive_failed for o in rows])} |"
            f" {_mean([o.batch_done for o in rows])} of {rows[0].batch} |"
            f" {_mean([o.batch_ttft_p50 for o in rows])} | {_mean([o.goodput for o in rows])} |"
            f" {_mean([o.good_tokens for o in rows])} | {_mean([o.wall for o in rows])} |"
        )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="1,2", help="comma-separated seeds (default 1,2)")
    ap.add_argument("--duration", type=float, help="seconds of arrivals (default 60)")
    ap.add_argument("--batch-rate", type=float, help="batch requests per second (default 5)")
    ap.add_argument("--interactive-rate", type=float, help="interactive requests per second (default 20)")
    ap.add_argument("--ttft-slo-ms", type=float, help="the interactive TTFT SLO (default 400)")
    ap.add_argument("--max-concurrency", type=int, help="flow control: in-flight requests per pod (default 24)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of: {', '.join(CONFIGS)}")
    ap.add_argument("--smoke", action="store_true", help="tiny profile, a few seconds (for make bench-smoke)")
    ap.add_argument(
        "--output",
        help="markdown report, a .json with the rows beside it (default results/slo.md; with --smoke a temporary "
        "directory)",
    )
    args = ap.parse_args(argv)
    scenario = SMOKE if args.smoke else FULL
    for field_name in ("duration", "batch_rate", "interactive_rate", "ttft_slo_ms", "max_concurrency"):
        if getattr(args, field_name) is not None:
            scenario = dataclasses.replace(scenario, **{field_name: getattr(args, field_name)})
    seeds = [int(s) for s in args.seeds.split(",") if s]
    configs = [c for c in args.configs.split(",") if c]
    for c in configs:
        config_text(c, scenario)  # unknown names fail before any run
    outcomes = []
    for seed in seeds:
        for config in configs:
            o = run_one(config, seed, scenario)
            print(
                f"seed {seed} {config}: SLO attainment {o.attainment * 100:.1f}% ({o.met}/{o.interactive}),"
                f" batch {o.batch_done}/{o.batch}, goodput {o.goodput:.2f} req/s ({o.wall:.0f} s)",
                file=sys.stderr,
            )
            outcomes.append(o)
    out = output_path(args.output, RESULTS, args.smoke)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report(scenario, outcomes, seeds))
    out.with_suffix(".json").write_text(
        json.dumps(
            {
                "scenario": dataclasses.asdict(scenario),
                "seeds": seeds,
                "runs": [dataclasses.asdict(o) for o in outcomes],
            },
            indent=2,
        )
        + "\n"
    )
    print(out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
