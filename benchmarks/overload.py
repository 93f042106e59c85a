"""Sustained overload in virtual time: what each router does when more work arrives than the pods can serve.

The simulated cluster (``llm_epp.sim``) runs ``llm-epp serve``'s request path (endpoint store, configuration,
director, flow control, plugins) against simulated vLLM pods on a virtual clock, metrics scraped every 50 ms.
Two tenants share the pool for ``--seconds`` of virtual time at a constant offered load of ``--factors`` x the
pool's capacity (Poisson arrivals, then drained):

* ``flood``: priority 0 (no objective), fairness id ``flood``, ``FLOOD_SHARE`` of the load;
* ``interactive``: priority 10 (objective ``interactive``), fairness id ``interactive``, the rest.

Both send the anchor workload (shared_prefix, 150 groups x 5 prompts, 6000 + 1200 -> 1000 tokens; each tenant
its own prompts) to 8 pods of profile ``qwen3-32b-h100-tp2``. Capacity is ``CAPACITY`` req/s: what the
reference algorithm completes per second at a steady 12 QPS on these pods (``results/quality.md``).

Routers:

* ``round-robin``: no EPP (the "Kubernetes Service" baseline);
* ``reference default``: the reference EPP's default algorithm (queue 2 / kv-cache 2 / prefix 3), no flow
  control: every request goes to a pod at once;
* ``reference + flow control``: the same with the ``flowControl`` gate and llm-d-router's defaults
  (``utilization-detector``: queue depth 5, KV 0.8; TTL 60 s; strict priority, global-strict fairness);
* ``llm-epp kv-headroom``: the same flow control with ``kv-cache-headroom-detector`` as the saturation
  detector and as a filter in the profile (dispatch only where the predicted KV peak fits), at its defaults:
  affinity-aware dispatch (``dispatchWindow`` 16, ``dispatchMaxWaitSeconds`` 10, ``dispatchGroups``) and
  ``overcommit`` 0.10;
* ``llm-epp kv-headroom (window only)``: the same with ``dispatchGroups: false`` (no request of a prefix
  group in flight is looked at beyond the window);
* ``llm-epp kv-headroom (no overcommit)``: the same with ``overcommit: 0`` (the predicted peak stays within
  each pod's KV capacity);
* ``llm-epp kv-headroom (in-order dispatch)``: the same with ``dispatchWindow: 0`` (flow control releases
  strictly in queue order);
* ``llm-epp kv-headroom + prefix home``: the detector's ``keepPrefixHome``.

Figures from the requests arriving after ``--skip`` seconds: completions per second in the measured window
(and output tokens/s), the prompt tokens the pods had to compute for them (prompt minus cached, per second and
per request: what prefix sharing saved), TTFT and per-request mean ITL p50/p90/p99 per tenant, preemptions per
finished request, time queued at the EPP (flow control's own account), and 429/503 counts.

    python -m benchmarks.overload                       # 1.5x and 3x, 180 s each, all routers (~30 min)
    python -m benchmarks.overload --smoke               # seconds: tiny profile and workload (tests)
    python -m benchmarks.overload --summarize a.json b.json   # means over seeds of runs saved with --json
    [--factors 1.5,3] [--seconds 180] [--skip 60] [--seed 1] [--routers a,b] [--output FILE] [--append]
    [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.report import command_line, machine, output_path
from benchmarks.stats import fmt_interval
from llm_epp.datalayer.objectives import parse_objectives_file
from llm_epp.flowcontrol import QueueOutcome
from llm_epp.framework.types import InferenceRequest
from llm_epp.sim.cluster import Cluster, RequestResult, TraceRequest, percentile
from llm_epp.sim.engine import EngineMetrics, StepInfo
from llm_epp.sim.profiles import get_profile, itl_floor
from llm_epp.sim.routers import EppRouter, RoundRobinRouter, Router
from llm_epp.sim.workload import SharedPrefixWorkload

RESULTS = Path(__file__).resolve().parent / "results"
CAPACITY = 9.3
"""Requests per second the reference algorithm completes on 8 anchor pods at a steady 12 QPS."""
FLOOD_SHARE = 0.8
OBJECTIVES = "objectives:\n- {name: interactive, priority: 10}\n"
FAIRNESS = "x-gateway-inference-fairness-id"
OBJECTIVE = "x-gateway-inference-objective"
TENANTS = ("interactive", "flood")

_PROFILE = """\
schedulingProfiles:
- name: default
  plugins:
%s  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: prefix-cache-scorer, weight: 3}
"""
_PLUGINS = "plugins:\n- type: queue-scorer\n- type: kv-cache-utilization-scorer\n- type: prefix-cache-scorer\n"
FLOW_CONTROL = (
    "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nfeatureGates: [flowControl]\n"
    + _PLUGINS
    + _PROFILE % ""
)
KV_HEADROOM = (
    "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nfeatureGates: [flowControl]\n"
    + _PLUGINS
    + "- type: kv-cache-headroom-detector\n"
    + "flowControl:\n  saturationDetector: {pluginRef: kv-cache-headroom-detector}\n"
    + _PROFILE % "  - {pluginRef: kv-cache-headroom-detector}\n"
)
KV_HOME = KV_HEADROOM.replace(
    "- type: kv-cache-headroom-detector\n",
    "- type: kv-cache-headroom-detector\n  parameters: {keepPrefixHome: true}\n",
)
KV_IN_ORDER = KV_HEADROOM.replace(
    "- type: kv-cache-headroom-detector\n",
    "- type: kv-cache-headroom-detector\n  parameters: {dispatchWindow: 0}\n",
)
KV_WINDOW_ONLY = KV_HEADROOM.replace(
    "- type: kv-cache-headroom-detector\n",
    "- type: kv-cache-headroom-detector\n  parameters: {dispatchGroups: false}\n",
)
KV_NO_OVERCOMMIT = KV_HEADROOM.replace(
    "- type: kv-cache-headroom-detector\n",
    "- type: kv-cache-headroom-detector\n  parameters: {overcommit: 0}\n",
)
KV_CAPPED = KV_HEADROOM.replace(
    "- type: kv-cache-headroom-detector\n",
    "- type: kv-cache-headroom-detector\n  parameters: {maxConcurrency: 80}\n",
)
ROUTERS: dict[str, str | None] = {
    "round-robin": "",
    "reference default": None,
    "reference + flow control": FLOW_CONTROL,
    "llm-epp kv-headroom": KV_HEADROOM,
    "llm-epp kv-headroom (window only)": KV_WINDOW_ONLY,
    "llm-epp kv-headroom (max 80 per endpoint)": KV_CAPPED,
    "llm-epp kv-headroom (no overcommit)": KV_NO_OVERCOMMIT,
    "llm-epp kv-headroom (in-order dispatch)": KV_IN_ORDER,
    "llm-epp kv-headroom + prefix home": KV_HOME,
}
"""Label -> EndpointPickerConfig (None: the default; "": no EPP)."""


@dataclass(frozen=True)
class Scenario:
    pods: int
    profile: str
    num_groups: int
    prompts_per_group: int
    system_prompt_len: int
    question_len: int
    output_len: int
    capacity: float

    def workload(self, seed: int) -> SharedPrefixWorkload:
        return SharedPrefixWorkload(
            num_groups=self.num_groups,
            prompts_per_group=self.prompts_per_group,
            system_prompt_len=self.system_prompt_len,
            question_len=self.question_len,
            output_len=self.output_len,
            seed=seed,
        )


ANCHOR = Scenario(8, "qwen3-32b-h100-tp2", 150, 5, 6000, 1200, 1000, CAPACITY)
SMOKE = Scenario(2, "tiny", 4, 4, 160, 40, 256, 30.0)
SCENARIOS = {"anchor": ANCHOR, "smoke": SMOKE}


def itl_floor_ms(sc: Scenario, generated_tokens_per_s: float) -> float:
    """The lowest mean ITL (ms) at which the scenario's pods, evenly loaded, generate `generated_tokens_per_s`
    output tokens per second between them, whatever the router (`llm_epp.sim.profiles.itl_floor`; an uneven load
    and prefill only raise it). NaN when the rate is unknown."""
    if not math.isfinite(generated_tokens_per_s):
        return math.nan
    per_pod = generated_tokens_per_s * (sc.output_len - 1) / sc.output_len / sc.pods  # the first tokens: prefill
    return 1000 * itl_floor(get_profile(sc.profile), sc.system_prompt_len + sc.question_len, sc.output_len, per_pod)


class QueueTimes:
    """Flow control's observer: how long each request waited at the EPP and how it left, by tenant."""

    def __init__(self) -> None:
        self.waited: dict[str, list[float]] = {t: [] for t in TENANTS}
        self.outcomes: dict[tuple[str, str], int] = {}

    def enqueued(self, request: InferenceRequest, outcome: QueueOutcome | None, duration: float) -> None:
        pass

    def queue_changed(self, request: InferenceRequest, count: int, size_bytes: int) -> None:
        pass

    def finished(self, request: InferenceRequest, outcome: QueueOutcome, waited: float) -> None:
        tenant = request.fairness_id if request.fairness_id in self.waited else "flood"
        if outcome is QueueOutcome.DISPATCHED:
            self.waited[tenant].append(waited)
        key = (tenant, outcome.value)
        self.outcomes[key] = self.outcomes.get(key, 0) + 1

    def dispatch_cycle(self, duration: float) -> None:
        pass

    def pool_saturation(self, saturation: float) -> None:
        pass


@dataclass
class TenantRow:
    router: str
    factor: float
    tenant: str
    offered: float
    measured: int
    completion_rate: float
    output_tokens_per_s: float
    ttft: tuple[float, float, float]
    itl: tuple[float, float, float]
    preemptions_per_request: float
    queued: tuple[float, float]
    """Time waited at the EPP, p50 and p99 (0 without flow control)."""
    rejected_429: int
    expired_503: int
    other_failed: int
    prefill_tokens_per_s: float = 0.0
    """Prompt tokens the pods computed (prompt minus cached) for the requests completed in the window, per second."""
    uncached_prompt_per_request: float = 0.0
    """The same per completed request."""


@dataclass
class RunResult:
    router: str
    factor: float
    rows: list[TenantRow] = field(default_factory=list)
    wall_seconds: float = 0.0
    generated_tokens_per_s: float = math.nan
    """Output tokens all pods generated per second of the measured window (their counters, read at the scrapes):
    the work done in the window, which completions inside it (started before it, under overload) overstate."""
    steps: dict[str, float] = field(default_factory=dict)
    """The pods' steps that started in the measured window (`StepAccounting.summary`)."""


class StepAccounting:
    """Adds up the engine steps that start between `lo` and `hi` on every pod: where the pods' time went."""

    def __init__(self, cluster: Cluster, lo: float, hi: float) -> None:
        self.pods = len(cluster.engines)
        self.window = hi - lo
        self.busy = self.prefill_time = 0.0
        self.steps = self.decoded = self.prefill_tokens = 0
        self.decode_weighted = 0.0  # sum over steps of decoding sequences x duration
        prefill_cost = cluster.engines[0].profile.prefill_cost_per_token

        def observe(step: StepInfo) -> None:
            if lo <= step.start < hi:
                self.busy += step.duration
                self.steps += 1
                self.decoded += step.decoding
                self.prefill_tokens += step.prefill_tokens
                self.prefill_time += prefill_cost * step.prefill_tokens
                self.decode_weighted += step.decoding * step.duration

        for engine in cluster.engines:
            engine.step_observer = observe

    def summary(self) -> dict[str, float]:
        """Per pod: share of the window busy, of it computing prompt tokens, decode and prompt tokens per second,
        the mean batch of decoding sequences and the mean step a decoded token waited for (ms)."""
        pod_seconds = self.window * self.pods
        if pod_seconds <= 0 or not self.steps:
            return {}
        return {
            "busy_share": self.busy / pod_seconds,
            "prefill_share": self.prefill_time / pod_seconds,
            "decode_tokens_per_pod_s": self.decoded / pod_seconds,
            "prefill_tokens_per_pod_s": self.prefill_tokens / pod_seconds,
            "mean_decode_batch": self.decoded / self.steps,
            "token_weighted_step_ms": 1000 * self.decode_weighted / self.decoded if self.decoded else math.nan,
        }


class GeneratedTokens:
    """Reads the pods' cumulative output-token counters at the router's scrapes between `lo` and `hi` (virtual
    time); a router that reads no metrics gets scrapes for this alone, which change nothing it does."""

    def __init__(self, router: Router, lo: float, hi: float, every: float = 0.05) -> None:
        self.first: tuple[float, int] | None = None
        self.last: tuple[float, int] | None = None

        def observe(metrics: Sequence[EngineMetrics], now: float) -> None:
            if lo <= now <= hi:
                total = sum(m.generation_tokens for m in metrics)
                if self.first is None:
                    self.first = (now, total)
                self.last = (now, total)

        router.watch_scrapes(observe, every)

    def per_s(self) -> float:
        if self.first is None or self.last is None or self.last[0] <= self.first[0]:
            return math.nan
        return (self.last[1] - self.first[1]) / (self.last[0] - self.first[0])


TWINS: dict[str, dict[str, Any]] = {
    "deployed": {},
    "ideal": {"response_headers_at": "first-token", "response_usage": True},
}
"""What the EPP learns of each response (EppRouter's keyword arguments): `deployed` is EppRouter's default,
what it learns behind `llm-epp envoy-config`'s defaults (a streamed response's headers when the pod takes the
request, no usage with response bodies NONE); `ideal` adds the first-token time and the usage, which no
deployment gives it (the reports before this option)."""


def _router(label: str, pods: int, seed: int, queue: QueueTimes, twin: str = "deployed") -> Router:
    config = ROUTERS[label]
    if config == "":
        return RoundRobinRouter(pods)
    objectives = parse_objectives_file(OBJECTIVES, "objectives.yaml")
    return EppRouter(pods, config, seed=seed, objectives=objectives, flow_observer=queue, **TWINS[twin])


def trace(sc: Scenario, factor: float, seconds: float, seed: int) -> tuple[list[TraceRequest], list[str]]:
    """The two tenants' merged Poisson arrivals and each request's tenant (in trace order)."""
    rng = random.Random(seed)
    rate = factor * sc.capacity
    arrivals: list[tuple[float, str]] = []
    for tenant, share in (("flood", FLOOD_SHARE), ("interactive", 1.0 - FLOOD_SHARE)):
        t = 0.0
        while True:
            t += rng.expovariate(rate * share)
            if t > seconds:
                break
            arrivals.append((t, tenant))
    arrivals.sort()
    workloads = {"flood": sc.workload(seed), "interactive": sc.workload(seed + 1000)}
    out: list[TraceRequest] = []
    for t, tenant in arrivals:
        headers = {FAIRNESS: tenant}
        if tenant == "interactive":
            headers[OBJECTIVE] = "interactive"
        out.append(TraceRequest(t, workloads[tenant].next_prompt(), headers))
    return out, [tenant for _, tenant in arrivals]


def _p(values: Sequence[float], q: float) -> float:
    return percentile(values, q) if values else math.nan


def run(
    label: str, sc: Scenario, factor: float, seconds: float, skip: float, seed: int, twin: str = "deployed"
) -> RunResult:
    started = time.perf_counter()
    requests, tenants = trace(sc, factor, seconds, seed)
    queue = QueueTimes()
    cluster = Cluster(get_profile(sc.profile), sc.pods)
    router = _router(label, sc.pods, seed, queue, twin)
    start = min(r.offset for r in requests)
    generated = GeneratedTokens(router, start + skip, start + seconds)
    steps = StepAccounting(cluster, start + skip, start + seconds)
    results = cluster.run_trace(requests, router)
    by_id: dict[str, RequestResult] = {r.id: r for r in results}
    out = RunResult(label, factor, generated_tokens_per_s=generated.per_s(), steps=steps.summary())
    t0 = min(r.arrival for r in results)
    lo, hi = t0 + skip, t0 + seconds
    window = hi - lo
    for tenant in TENANTS:
        mine = [by_id[f"req-{k + 1}"] for k, name in enumerate(tenants) if name == tenant]
        arrived = [r for r in mine if lo <= r.arrival <= hi]
        served = [r for r in arrived if not r.failed]
        done = [r for r in mine if not r.failed and lo <= r.finish <= hi]
        computed = sum(r.prompt_tokens - r.cached_tokens for r in done)
        waited = queue.waited[tenant]
        share = FLOOD_SHARE if tenant == "flood" else 1.0 - FLOOD_SHARE
        out.rows.append(
            TenantRow(
                router=label,
                factor=factor,
                tenant=tenant,
                offered=factor * sc.capacity * share,
                measured=len(arrived),
                completion_rate=len(done) / window,
                output_tokens_per_s=sum(r.completion_tokens for r in done) / window,
                ttft=tuple(_p([r.ttft for r in served], q) for q in (50, 90, 99)),  # type: ignore[arg-type]
                itl=tuple(_p([r.itl_mean for r in served if r.completion_tokens > 1], q) for q in (50, 90, 99)),  # type: ignore[arg-type]
                preemptions_per_request=sum(r.preemptions for r in served) / max(len(served), 1),
                queued=(_p(waited, 50), _p(waited, 99)) if waited else (0.0, 0.0),
                rejected_429=sum(1 for r in arrived if r.status == 429),
                expired_503=sum(1 for r in arrived if r.status == 503),
                other_failed=sum(1 for r in arrived if r.failed and r.status not in (429, 503)),
                prefill_tokens_per_s=computed / window,
                uncached_prompt_per_request=computed / max(len(done), 1),
            )
        )
    out.wall_seconds = time.perf_counter() - started
    total = sum(r.completion_rate for r in out.rows)
    print(
        f"  {label} at {factor:g}x: {total:.2f} completions/s, interactive TTFT p90 {out.rows[0].ttft[1]:.2f} s, "
        f"flood TTFT p90 {out.rows[1].ttft[1]:.2f} s ({out.wall_seconds:.0f} s)",
        file=sys.stderr,
        flush=True,
    )
    return out


def _f(v: float, digits: int = 2) -> str:
    if math.isnan(v):
        return "n/a"
    return f"{v:,.{digits}f}"


def table(runs: Sequence[RunResult]) -> list[str]:
    lines = [
        "| load | router | tenant | offered/s | measured | done/s | out tok/s | prompt tok computed/s (per req) | "
        "TTFT p50/p90/p99 s | ITL p50/p90/p99 ms | preempt/req | queued at EPP p50/p99 s | 429 | 503 |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run_ in runs:
        for r in run_.rows:
            ttft = "/".join(_f(v) for v in r.ttft)
            itl = "/".join(_f(v * 1000, 1) for v in r.itl)
            lines.append(
                f"| {r.factor:g}x | {r.router} | {r.tenant} | {_f(r.offered)} | {r.measured} | "
                f"{_f(r.completion_rate)} | {_f(r.output_tokens_per_s, 0)} | "
                f"{_f(r.prefill_tokens_per_s, 0)} ({_f(r.uncached_prompt_per_request, 0)}) | {ttft} | {itl} | "
                f"{_f(r.preemptions_per_request)} | {_f(r.queued[0])}/{_f(r.queued[1])} | {r.rejected_429} | "
                f"{r.expired_503} |"
            )
    return lines


def totals(runs: Sequence[RunResult], sc: Scenario) -> list[str]:
    lines = [
        "| load | router | done/s (both tenants) | vs reference default | prompt tok computed/s | preempt/req | "
        "ITL p50 ms (flood) | pods' tok/s | ITL floor ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = {r.factor: sum(t.completion_rate for t in r.rows) for r in runs if r.router == "reference default"}
    for run_ in runs:
        done = sum(t.completion_rate for t in run_.rows)
        served = sum(t.measured for t in run_.rows)
        pre = sum(t.preemptions_per_request * t.measured for t in run_.rows) / max(served, 1)
        ref = base.get(run_.factor)
        vs = f"{(done / ref - 1) * 100:+.1f}%" if ref else "n/a"
        itl = _f(run_.rows[1].itl[0] * 1000, 1)
        computed = _f(sum(t.prefill_tokens_per_s for t in run_.rows), 0)
        gen = run_.generated_tokens_per_s
        floor = _f(itl_floor_ms(sc, gen), 1)
        lines.append(
            f"| {run_.factor:g}x | {run_.router} | {_f(done)} | {vs} | {computed} | {_f(pre)} | {itl} | {_f(gen, 0)} | "
            f"{floor} |"
        )
    return lines


def step_table(runs: Sequence[RunResult]) -> list[str]:
    """Where the pods' time went in the window (the engine's steps)."""
    lines = [
        "| load | router | pod time busy | in prefill | prompt tok/s per pod | decode tok/s per pod | "
        "mean decode batch | mean step per decoded token ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for run_ in runs:
        st = run_.steps
        if not st:
            continue
        lines.append(
            f"| {run_.factor:g}x | {run_.router} | {st['busy_share']:.0%} | {st['prefill_share']:.0%} | "
            f"{_f(st['prefill_tokens_per_pod_s'], 0)} | {_f(st['decode_tokens_per_pod_s'], 0)} | "
            f"{_f(st['mean_decode_batch'], 1)} | {_f(st['token_weighted_step_ms'], 1)} |"
        )
    return lines


def report(runs: Sequence[RunResult], sc: Scenario, args: argparse.Namespace) -> str:
    lines = [
        "# Sustained overload: two tenants, four routers (virtual time)",
        "",
        f"`{command_line('benchmarks.overload', args.argv)}`; seed {args.seed}; {machine()}",
        "",
        f"{sc.pods} pods, profile `{sc.profile}`; workload shared_prefix {sc.num_groups} groups x "
        f"{sc.prompts_per_group}, system {sc.system_prompt_len} + question {sc.question_len} -> {sc.output_len} "
        f"tokens. Capacity {sc.capacity:g} req/s; offered {', '.join(f'{f:g}x' for f in args.factors)} of it for "
        f"{args.seconds:g} s of virtual time ({FLOOD_SHARE:.0%} `flood` at priority 0, the rest `interactive` at "
        f"priority 10), Poisson, then drained. Measured: requests arriving after {args.skip:g} s; `done/s` = "
        "completions inside the measured window. ITL is each request's mean inter-token latency; `pods' tok/s` "
        "the output tokens all pods generated per second of the window; `ITL floor` the lowest mean ITL at which "
        "these pods can generate that many at all, whatever the router (`llm_epp.sim.profiles.itl_floor`). "
        "`queued at EPP` "
        "is flow control's queue time of dispatched requests (0 without flow control). The EPP learns of each "
        + (
            "response what it learns behind `llm-epp envoy-config`'s defaults: a streamed response's headers when "
            "the pod takes the request, no token usage (response bodies NONE)."
            if args.twin == "deployed"
            else "response its first-token time and its usage (`--twin ideal`: no deployment gives it both)."
        ),
        "",
        *totals(runs, sc),
        "",
        "Where the pods' time went (the engine steps that started in the window; a step that prefills delays every "
        "sequence decoding in it):",
        "",
        *step_table(runs),
        "",
        *table(runs),
        "",
    ]
    return "\n".join(lines)


def save_json(
    path: Path, runs: Sequence[RunResult], seed: int, seconds: float, skip: float, scenario: str = "anchor"
) -> None:
    """Adds the runs to the JSON list in `path` (created when missing), one object per router, factor and seed;
    `scenario` names the entry of `SCENARIOS` they ran (entries without one ran the anchor)."""
    entries: list[dict[str, object]] = json.loads(path.read_text()) if path.exists() else []
    for run_ in runs:
        entry = dataclasses.asdict(run_)
        entry.update(seed=seed, seconds=seconds, skip=skip, scenario=scenario)
        entries.append(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entries, indent=1) + "\n")


def _entry_totals(entry: dict[str, Any]) -> dict[str, float]:
    """One run's headline figures from its JSON entry (both tenants; ITL of the flood, TTFT of interactive)."""
    rows = {r["tenant"]: r for r in entry["rows"]}
    measured = sum(r["measured"] for r in rows.values())
    done = sum(r["completion_rate"] for r in rows.values())
    generated = entry.get("generated_tokens_per_s", math.nan)  # runs saved before it was measured: unknown
    generated = math.nan if generated is None else generated
    return {
        "done": done,
        "generated": generated,
        "floor": itl_floor_ms(SCENARIOS[entry.get("scenario", "anchor")], generated),
        "preempt": sum(r["preemptions_per_request"] * r["measured"] for r in rows.values()) / max(measured, 1),
        "itl": rows["flood"]["itl"][0] * 1000,
        "ttft90": rows["interactive"]["ttft"][1],
        "expired": sum(r["expired_503"] for r in rows.values()),
    }


def _interval_or_na(values: Sequence[float], digits: int) -> str:
    return "n/a" if any(math.isnan(v) for v in values) else fmt_interval(values, digits)


def seeds_summary(entries: Sequence[dict[str, Any]]) -> list[str]:
    """Means over seeds with 95% t-intervals, per load and router; the change in completions against the
    reference default is paired by seed (routers on the same seed share the trace)."""
    runs: dict[tuple[float, str], dict[int, dict[str, float]]] = {}
    for e in entries:
        runs.setdefault((e["factor"], e["router"]), {})[e["seed"]] = _entry_totals(e)
    lines = [
        "| load | router | seeds | done/s (both tenants) | vs reference default (paired) | preempt/req | "
        "ITL p50 ms (flood) | pods' tok/s | ITL floor ms | TTFT p90 s (interactive) | 503 |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    order = {name: i for i, name in enumerate(ROUTERS)}
    for factor, router in sorted(runs, key=lambda k: (k[0], order.get(k[1], 99))):
        by_seed = runs[(factor, router)]
        seeds = sorted(by_seed)
        ref = runs.get((factor, "reference default"), {})
        paired = [by_seed[s]["done"] / ref[s]["done"] - 1 for s in seeds if s in ref]
        keys = ("done", "preempt", "itl", "generated", "floor", "ttft90", "expired")
        col = {k: [by_seed[s][k] for s in seeds] for k in keys}
        lines.append(
            f"| {factor:g}x | {router} | {','.join(map(str, seeds))} | {fmt_interval(col['done'])} | "
            f"{fmt_interval(paired, 1, percent=True) if paired else 'n/a'} | {fmt_interval(col['preempt'])} | "
            f"{fmt_interval(col['itl'], 1)} | {_interval_or_na(col['generated'], 0)} | "
            f"{_interval_or_na(col['floor'], 1)} | {fmt_interval(col['ttft90'], 1)} | "
            f"{fmt_interval(col['expired'], 0)} |"
        )
    return lines


def steps_summary(entries: Sequence[dict[str, Any]]) -> list[str]:
    """Means over seeds of where the pods' time went, per load and router (runs saved with the step accounting)."""
    runs: dict[tuple[float, str], list[dict[str, float]]] = {}
    for e in entries:
        if e.get("steps"):
            runs.setdefault((e["factor"], e["router"]), []).append(e["steps"])
    if not runs:
        return []
    lines = [
        "| load | router | seeds | in prefill | prompt tok/s per pod | decode tok/s per pod | mean decode batch | "
        "mean step per decoded token ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    order = {name: i for i, name in enumerate(ROUTERS)}
    for factor, router in sorted(runs, key=lambda k: (k[0], order.get(k[1], 99))):
        rows = runs[(factor, router)]

        def col(key: str, rows: list[dict[str, float]] = rows) -> list[float]:
            return [r[key] for r in rows]

        lines.append(
            f"| {factor:g}x | {router} | {len(rows)} | {fmt_interval(col('prefill_share'), 1, scale=100)}% | "
            f"{fmt_interval(col('prefill_tokens_per_pod_s'), 0)} | {fmt_interval(col('decode_tokens_per_pod_s'), 0)} | "
            f"{fmt_interval(col('mean_decode_batch'), 1)} | {fmt_interval(col('token_weighted_step_ms'), 1)} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--factors", default="1.5,3", help="offered load as multiples of capacity")
    ap.add_argument("--seconds", type=float, default=180.0, help="virtual seconds of arrivals")
    ap.add_argument("--skip", type=float, default=60.0, help="arrivals before this are not measured")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--routers", default=",".join(ROUTERS))
    ap.add_argument("--smoke", action="store_true", help="tiny profile and workload, seconds of wall time")
    ap.add_argument(
        "--twin",
        choices=sorted(TWINS),
        default="deployed",
        help="what llm-epp learns of each response: as deployed behind response bodies NONE (default), or "
        "ideal (first-token times and usage, as reports before this option assumed)",
    )
    ap.add_argument(
        "--output", type=Path, help="report file (default results/overload.md; with --smoke a temporary directory)"
    )
    ap.add_argument("--append", action="store_true", help="add the report to the end of --output")
    ap.add_argument("--json", type=Path, help="also add each run's figures (with its seed) to this JSON list")
    ap.add_argument(
        "--summarize", type=Path, nargs="+", metavar="JSON", help="print the means over seeds of these --json files"
    )
    args = ap.parse_args(argv)
    args.argv = argv
    if args.summarize:
        entries = [e for path in args.summarize for e in json.loads(path.read_text())]
        print("\n".join(seeds_summary(entries)))
        steps = steps_summary(entries)
        if steps:
            print("\n" + "\n".join(steps))
        return 0
    args.output = output_path(args.output, RESULTS / "overload.md", args.smoke)
    args.factors = [float(f) for f in args.factors.split(",")]
    labels = [r.strip() for r in args.routers.split(",") if r.strip()]
    unknown = [r for r in labels if r not in ROUTERS]
    if unknown:
        ap.error(f"unknown routers {unknown}; known: {', '.join(ROUTERS)}")
    sc = SMOKE if args.smoke else ANCHOR
    if args.smoke:
        args.seconds, args.skip = min(args.seconds, 5.0), min(args.skip, 1.5)
    print(f"overload: {sc} factors {args.factors} seconds {args.seconds} seed {args.seed}", file=sys.stderr)
    runs: list[RunResult] = []
    try:
        for factor in args.factors:
            for label in labels:
                runs.append(run(label, sc, factor, args.seconds, args.skip, args.seed, args.twin))
    except KeyboardInterrupt:
        print("interrupted: writing what has finished", file=sys.stderr)
    text = report(runs, sc, args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    if args.append and args.output.exists():
        text = args.output.read_text().rstrip("\n") + "\n\n" + text
    args.output.write_text(text)
    if args.json is not None:
        save_json(args.json, runs, args.seed, args.seconds, args.skip, "smoke" if args.smoke else "anchor")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
