"""Routing quality in virtual time: the llm-d anchor workload through every router, on 8 pods and at scale.

The simulated cluster (``llm_epp.sim.cluster``) runs what ``llm-epp serve`` runs (endpoint store,
configuration, director, plugins) against simulated vLLM pods on a virtual clock; the pods' metrics reach the
endpoint store every 50 ms of virtual time, as in production.  Every router gets the same seeded arrival
trace and the same prompt order (inference-perf's fixed shuffle), on fresh pods.

Workload (llm-d v0.5 inference-scheduling guide): shared_prefix, 150 groups x 5 prompts, system prompt 6000 +
question 1200 tokens -> 1000 output tokens (ignore_eos); inference-perf's stage protocol (each stage sends
rate x duration Poisson arrivals, the next starts when all have finished; req/s = N / (last end - first
start)); warm-up 15 QPS x 50 s, then 3 -> 60 QPS.  Pods: profile ``qwen3-32b-h100-tp2`` (see
``benchmarks/README.md`` for its constants and their calibration).  At 32 and 128 pods the groups and
every rate are scaled by pods / 8 (the same load per pod, the same share of KV held by the prefixes), over
a shorter ladder of stages (:func:`ladder_for`).

Routers:

* ``round-robin`` (the anchor's "Kubernetes Service" baseline), ``random``;
* ``least-queue``: fewest requests in flight (the router's own count, as Envoy's least-request);
* ``llm-epp default``: the default configuration, which is the reference EPP's default algorithm
  (queue 2 / kv-cache 2 / prefix 3 on 50 ms-old scraped metrics, max-score picker);
* ``llm-epp best``: :data:`BEST_CONFIG`, the best configuration found (its docstring says why), or
  ``--best-config FILE``;
* ``locality-bound``: every request of a prefix group to one fixed pod (perfect reuse, no load
  awareness): the upper bound on prefix reuse, not a usable router;
* ``llm-epp + kv-headroom flow control``: the default scorers with flow control gated by
  ``kv-cache-headroom-detector`` (also a filter; affinity-aware dispatch at its defaults), as in
  ``benchmarks.overload`` (llm-d.ai apiVersion: a queued request gets 503 after 60 s); ``... (TTL 300 s)``:
  the same holding requests up to 300 s; ``... (max 80 per endpoint)`` and ``(max 96 ...)``: the detector with
  ``maxConcurrency`` 80 or 96.

``--timeline SECONDS`` also writes, for each ladder run, a CSV sampling every pod's running and waiting
requests and KV use and the EPP's queue length (how a stage fills, drains and where pods idle).

    python -m benchmarks.quality                  # 8 pods full ladder, then 32 and 128 pods (see --help)
    python -m benchmarks.quality --pods 8         # only the anchor size
    python -m benchmarks.quality --smoke          # seconds: tiny profile, tiny workload (for the test suite)
    python -m benchmarks.quality --pods 8 --select   # choose "llm-epp best" among CANDIDATES on the selection
                                                     # seeds first, then report it on the evaluation seeds
    [--routers a,b] [--seeds 1,2,3,4,5 | --seed 42] [--select-seeds 42] [--jobs 2] [--output DIR]
    [--best-config FILE]

Seeds: every router runs on every evaluation seed (each seed draws its own prompts, shuffle and arrival times;
within a seed every router gets the same trace).  The headline gives the mean over the seeds with a 95%
t-interval over the per-seed values (``benchmarks.stats``); gains over round-robin are paired by seed.  The
best configuration is chosen on other seeds than it is reported on: ``BEST_CONFIG`` was chosen on seed 42,
and ``--select`` repeats the choice among ``CANDIDATES`` on ``--select-seeds`` (which must not overlap the
evaluation seeds).  Per-stage tables and the steady-state runs are from the first evaluation seed.

Writes ``quality.md``, ``quality.json`` and PNG plots (TTFT p90 vs QPS, throughput vs QPS per pod count) to
``--output`` (default ``benchmarks/results``).  Ctrl-C stops the runs and writes what has finished.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.overload import KV_CAPPED, KV_HEADROOM
from benchmarks.report import command_line, machine, output_path
from benchmarks.stats import fmt_interval, t_interval
from llm_epp.sim.cluster import Cluster, StageStats, make_router, percentile
from llm_epp.sim.engine import EngineMetrics
from llm_epp.sim.profiles import Profile, get_profile
from llm_epp.sim.routers import Router
from llm_epp.sim.workload import SharedPrefixWorkload, Stage

RESULTS = Path(__file__).resolve().parent / "results"
SLO_TTFT_P90 = 2.0
"""The headline's service level: a stage "holds" when its TTFT p90 is at most this many seconds."""

BEST_CONFIG = """\
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: no-hit-lru-scorer
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: prefix-cache-scorer, weight: 3}
  - {pluginRef: no-hit-lru-scorer, weight: 2}
"""
"""The best llm-epp configuration found for this workload (the search is in ``benchmarks/README.md``): the
default plus ``no-hit-lru-scorer``, which sends a request with no cached prefix anywhere to the endpoint that
least recently received such a request.  Once a group's first request has landed, the prefix scorer keeps the
group there, so where the first request lands decides the balance for good.  The default places new groups by
queue and KV usage, scraped up to 50 ms earlier, and at 32 pods lets them cluster (180-210 requests per pod in
the 240 QPS stage, 14% below the locality bound); spreading the first requests in turn balances the groups
like the locality bound does (180-190) and matches its throughput, without changing anything at 8 pods."""

CANDIDATES: dict[str, str | None] = {
    "default (queue 2, kv 2, prefix 3)": None,
    "default + no-hit-lru-scorer 2": BEST_CONFIG,
    "queue 1, kv 1, prefix 5": """\
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: kv-cache-utilization-scorer, weight: 1}
  - {pluginRef: prefix-cache-scorer, weight: 5}
""",
    "default + active-request-scorer 2": """\
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
""",
}
"""Configurations ``--select`` chooses "llm-epp best" from (the search in ``benchmarks/README.md`` had more)."""

KV_HEADROOM_LONG_TTL = KV_HEADROOM.replace("flowControl:\n", "flowControl:\n  defaultRequestTTL: 300s\n", 1)
"""The same with requests held up to 300 s instead of llm-d-router's 60 (the ladder's top stages queue longer)."""

ROUTERS: dict[str, tuple[str, str | None]] = {
    "round-robin": ("round-robin", None),
    "random": ("random", None),
    "least-queue": ("least-queue", None),
    "llm-epp default": ("llm-epp", None),
    "llm-epp best": ("llm-epp", BEST_CONFIG),
    "locality-bound": ("locality-bound", None),
    "llm-epp + kv-headroom flow control": ("llm-epp", KV_HEADROOM),
    "llm-epp + kv-headroom flow control (TTL 300 s)": ("llm-epp", KV_HEADROOM_LONG_TTL),
    "llm-epp + kv-headroom flow control (max 80 per endpoint)": ("llm-epp", KV_CAPPED),
    "llm-epp + kv-headroom flow control (max 96 per endpoint)": (
        "llm-epp",
        KV_CAPPED.replace("maxConcurrency: 80", "maxConcurrency: 96"),
    ),
}


@dataclass(frozen=True)
class Scenario:
    """One cluster size: the workload and stage ladder every router is run through."""

    pods: int
    profile: str
    num_groups: int
    prompts_per_group: int
    system_prompt_len: int
    question_len: int
    output_len: int
    stages: tuple[Stage, ...]
    warmup_stages: int = 1
    """Leading stages that only warm the cluster (reported, but not in the headline)."""
    compare_rate: float = 0.0
    """The stage rate whose figures are set beside the published anchor (0: the last stage)."""

    def workload(self, seed: int) -> SharedPrefixWorkload:
        return SharedPrefixWorkload(
            num_groups=self.num_groups,
            prompts_per_group=self.prompts_per_group,
            system_prompt_len=self.system_prompt_len,
            question_len=self.question_len,
            output_len=self.output_len,
            seed=seed,
        )


ANCHOR_LADDER = (
    (3, 20), (10, 20), (15, 20), (20, 38), (22, 34), (25, 30), (30, 25), (35, 21),
    (40, 38), (43, 36), (46, 33), (49, 30), (52, 29), (55, 27), (57, 26), (60, 25),
)  # fmt: skip
SCALE_LADDER = ((10, 20), (20, 38), (30, 25), (40, 38), (49, 30), (60, 25))
SHORT_LADDER = ((30, 25), (60, 25))


def ladder_for(pods: int) -> Sequence[tuple[float, float]]:
    """The anchor's full ladder at 8 pods; fewer stages for larger clusters (every stage costs pods / 8 more)."""
    return ANCHOR_LADDER if pods <= 8 else SCALE_LADDER if pods <= 32 else SHORT_LADDER


def anchor_scenario(pods: int = 8, ladder: Sequence[tuple[float, float]] = ANCHOR_LADDER) -> Scenario:
    """The anchor's workload on ``pods`` pods: groups and rates scaled by ``pods / 8``."""
    k = pods / 8
    stages = (Stage(15 * k, 50), *(Stage(rate * k, seconds) for rate, seconds in ladder))
    return Scenario(pods, "qwen3-32b-h100-tp2", round(150 * k), 5, 6000, 1200, 1000, stages, 1, 60 * k)


def smoke_scenario(pods: int) -> Scenario:
    stages = (Stage(5 * pods / 4, 2), Stage(10 * pods / 4, 2), Stage(40 * pods / 4, 2))
    return Scenario(pods, "tiny", 2 * pods, 4, 160, 40, 16, stages, 1)


@dataclass
class RouterRun:
    label: str
    pods: int
    seed: int
    stages: list[StageStats] = field(default_factory=list)
    wall_seconds: float = 0.0
    error: str | None = None
    timeline: list[TimelineRow] = field(default_factory=list)


TIMELINE_COLUMNS = ("t", "stage", "epp_queued", "running", "waiting", "kv_usage")
"""Columns of a ``--timeline`` CSV; the per-pod columns hold one value per pod, separated by spaces."""


@dataclass(frozen=True)
class TimelineRow:
    """The cluster at one instant of a run: what each pod reports and what the EPP holds in its queue."""

    t: float
    stage: int
    epp_queued: int | None  # None: the router queues nothing (no flow control)
    running: tuple[int, ...]
    waiting: tuple[int, ...]
    kv_usage: tuple[float, ...]

    def csv(self) -> str:
        queued = "" if self.epp_queued is None else str(self.epp_queued)
        kv = " ".join(f"{v:.3f}" for v in self.kv_usage)
        return f"{self.t:.3f},{self.stage},{queued},{_joined(self.running)},{_joined(self.waiting)},{kv}"


def _joined(values: Sequence[int]) -> str:
    return " ".join(map(str, values))


def _record_timeline(router: Router, run: RouterRun, every: float) -> None:
    """Samples the pods' metrics and the EPP's queue length every ``every`` virtual seconds, at the scrapes."""
    director = getattr(router, "director", None)
    flow = director.flow_control if director is not None else None
    last = -math.inf

    def sample(metrics: Sequence[EngineMetrics], now: float) -> None:
        nonlocal last
        if now - last < every:
            return
        last = now
        run.timeline.append(
            TimelineRow(
                now,
                len(run.stages),
                flow.length if flow is not None else None,
                tuple(m.num_requests_running for m in metrics),
                tuple(m.num_requests_waiting for m in metrics),
                tuple(m.kv_cache_usage_perc for m in metrics),
            )
        )

    router.watch_scrapes(sample, every)  # a router that reads no metrics is scraped for the timeline only


def write_timelines(runs: Sequence[RouterRun], out_dir: Path) -> list[str]:
    """One CSV per run with a timeline; returns the file names."""
    names = []
    for r in runs:
        if not r.timeline:
            continue
        slug = re.sub(r"[^a-z0-9]+", "-", r.label.lower()).strip("-")
        name = f"timeline-{r.pods}pods-{slug}-seed{r.seed}.csv"
        (out_dir / name).write_text(",".join(TIMELINE_COLUMNS) + "\n" + "".join(row.csv() + "\n" for row in r.timeline))
        names.append(name)
    return names


def router_spec(label: str, best_config: str | None) -> tuple[str, str | None]:
    """The router kind and configuration text behind ``label`` (``--best-config`` replaces the best one's)."""
    kind, config = ROUTERS[label]
    return kind, best_config if label == "llm-epp best" and best_config is not None else config


def run_one(
    label: str, scenario: Scenario, seed: int, best_config: str | None, timeline_every: float = 0.0
) -> RouterRun:
    """Plays ``scenario`` through the router called ``label`` on fresh pods (runs in a worker process)."""
    kind, config = router_spec(label, best_config)
    return play(label, kind, config, scenario, seed, timeline_every)


def play(
    label: str, kind: str, config: str | None, scenario: Scenario, seed: int, timeline_every: float = 0.0
) -> RouterRun:
    """Plays ``scenario`` through a ``kind`` router with ``config`` on fresh pods, reporting as ``label``;
    with ``timeline_every`` > 0 the run keeps a :class:`TimelineRow` every that many virtual seconds."""
    started = time.perf_counter()
    run = RouterRun(label, scenario.pods, seed)
    workload = scenario.workload(seed)
    cluster = Cluster(get_profile(scenario.profile), scenario.pods)
    router = make_router(kind, scenario.pods, seed=seed, config_text=config)
    if timeline_every > 0:
        _record_timeline(router, run, timeline_every)
    total = len(scenario.stages)

    def progress(k: int, s: StageStats) -> None:
        run.stages.append(s)
        print(
            f"  [{scenario.pods} pods] {label}: stage {k + 1}/{total} ({s.rate:g} QPS x {s.duration:g} s) "
            f"{s.req_per_s:.2f} req/s, TTFT p90 {s.ttft_p90:.2f} s, hit {s.prefix_hit_rate:.2f} "
            f"({time.perf_counter() - started:.0f} s)",
            file=sys.stderr,
            flush=True,
        )

    try:
        cluster.run(workload, scenario.stages, router, seed=seed, progress=progress)
    except KeyboardInterrupt:
        run.error = "interrupted"
    run.wall_seconds = time.perf_counter() - started
    return run


STEADY_RATES = (4.0, 6.0, 8.0, 10.0, 12.0)
"""Offered rates of the steady-state runs at 8 pods (scaled by pods / 8 elsewhere)."""
STEADY_SECONDS = 300.0
STEADY_SKIP = 60.0
"""Arrivals in the first ``STEADY_SKIP`` seconds of a steady run warm it up and are not measured."""
STEADY_ROUTERS = ("round-robin", "llm-epp default", "llm-epp best", "locality-bound")


@dataclass
class SteadyRow:
    """One router at one constant offered rate, measured after the warm-up (see :func:`run_steady`)."""

    label: str
    pods: int
    rate: float
    measured: int
    completion_rate: float
    """Completions per second inside the measured window (arrival window after ``STEADY_SKIP``)."""
    output_tokens_per_s: float
    ttft_p50: float
    ttft_p90: float
    itl_p50: float
    e2e_p50: float
    cached_fraction: float
    """Cached prompt tokens / prompt tokens of the measured requests (at their first admission)."""
    preemptions_per_request: float
    overloaded: bool
    """Completions in the window fell behind the arrivals in it (< 95%): the queue grew for the whole run, so
    the latencies are lower bounds that depend on the run's length."""


def run_steady(
    label: str,
    scenario: Scenario,
    rate: float,
    seed: int,
    best_config: str | None,
    seconds: float = STEADY_SECONDS,
    skip: float = STEADY_SKIP,
) -> SteadyRow:
    """The scenario's warm-up stage, then ``rate`` QPS for ``seconds`` (one Poisson stage, drained at the end);
    figures from the requests arriving after ``skip`` seconds of it."""
    kind, config = router_spec(label, best_config)
    workload = scenario.workload(seed)
    cluster = Cluster(get_profile(scenario.profile), scenario.pods)
    router = make_router(kind, scenario.pods, seed=seed, config_text=config)
    stages = (*scenario.stages[: scenario.warmup_stages], Stage(rate, seconds))
    started = time.perf_counter()
    result = cluster.run(workload, stages, router, seed=seed)
    steady = [r for r in result.requests if r.stage == len(stages) - 1]
    t0 = min(r.arrival for r in steady)
    lo, hi = t0 + skip, t0 + seconds
    measured = [r for r in steady if lo <= r.arrival <= hi and not r.failed]
    done_in_window = [r for r in steady if not r.failed and lo <= r.finish <= hi]
    arrived = sum(1 for r in steady if lo <= r.arrival <= hi)
    window = hi - lo
    completion_rate = len(done_in_window) / window
    prompt = sum(r.prompt_tokens for r in measured)
    row = SteadyRow(
        label=label,
        pods=scenario.pods,
        rate=rate,
        measured=len(measured),
        completion_rate=completion_rate,
        output_tokens_per_s=sum(r.completion_tokens for r in done_in_window) / window,
        ttft_p50=percentile([r.ttft for r in measured], 50),
        ttft_p90=percentile([r.ttft for r in measured], 90),
        itl_p50=percentile([r.itl_mean for r in measured if r.completion_tokens > 1], 50),
        e2e_p50=percentile([r.e2e for r in measured], 50),
        cached_fraction=sum(r.cached_tokens for r in measured) / prompt if prompt else 0.0,
        preemptions_per_request=sum(r.preemptions for r in measured) / max(len(measured), 1),
        overloaded=len(done_in_window) < 0.95 * arrived,
    )
    print(
        f"  [{scenario.pods} pods, steady] {label} at {rate:g} QPS: {completion_rate:.2f} completions/s, TTFT p90 "
        f"{row.ttft_p90:.2f} s{' (overloaded)' if row.overloaded else ''} ({time.perf_counter() - started:.0f} s)",
        file=sys.stderr,
        flush=True,
    )
    return row


def steady_table(rows: Sequence[SteadyRow]) -> list[str]:
    out = [
        "| router | offered QPS | measured | completions/s | out tok/s | TTFT p50 s | TTFT p90 s | ITL p50 ms | "
        "E2E p50 s | cached prompt | preempt/req | state |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    order = {name: i for i, name in enumerate(ROUTERS)}
    for r in sorted(rows, key=lambda r: (order[r.label], r.rate)):
        bound = "≥ " if r.overloaded else ""
        out.append(
            f"| {r.label} | {r.rate:g} | {r.measured} | {_fmt(r.completion_rate)} | {_fmt(r.output_tokens_per_s, 0)} | "
            f"{bound}{_fmt(r.ttft_p50)} | {bound}{_fmt(r.ttft_p90)} | {_fmt(r.itl_p50 * 1000, 1)} | "
            f"{bound}{_fmt(r.e2e_p50, 1)} | {r.cached_fraction:.3f} | {r.preemptions_per_request:.2f} | "
            f"{'**overloaded**' if r.overloaded else 'steady'} |"
        )
    return out


# --------------------------------------------------------------------------------------------- report


def max_qps_at_slo(stages: Sequence[StageStats], skip: int, slo: float = SLO_TTFT_P90) -> float:
    """The highest stage rate up to which every measured stage kept TTFT p90 <= ``slo`` (0: none did)."""
    best = 0.0
    for s in sorted(stages[skip:], key=lambda s: s.rate):
        if s.failures or not s.ttft_p90 <= slo:
            break
        best = s.rate
    return best


def _fmt(v: float, digits: int = 2) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "-"
    return f"{v:,.{digits}f}"


def stage_row(label: str, s: StageStats, warmup: bool) -> str:
    n_done = s.requests - s.failures
    per_pod = s.requests_per_pod
    return (
        f"| {label} | {s.rate:g}{' (warm-up)' if warmup else ''} | {s.requests} | {_fmt(s.req_per_s)} | "
        f"{_fmt(s.output_tokens_per_s, 0)} | {_fmt(s.ttft_p50)} | {_fmt(s.ttft_p90)} | {_fmt(s.ttft_p99)} | "
        f"{_fmt(s.itl_p50 * 1000, 1)} | {_fmt(s.e2e_p50, 1)} | {s.prefix_hit_rate:.3f} | "
        f"{min(per_pod)}-{max(per_pod)} | {s.preemptions / max(n_done, 1):.2f} | {s.failures} |"
    )


STAGE_HEADER = [
    "| router | QPS | n | req/s | out tok/s | TTFT p50 s | p90 | p99 | ITL p50 ms | E2E p50 s | prefix hit "
    "| req/pod | preempt/req | fail |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
]


def _compare_stage(run: RouterRun, scenario: Scenario) -> StageStats | None:
    if not run.stages:
        return None
    if scenario.compare_rate:
        for s in run.stages[scenario.warmup_stages :]:
            if math.isclose(s.rate, scenario.compare_rate):
                return s
        return None
    return run.stages[-1]


def _by_label(runs: Sequence[RouterRun]) -> dict[str, dict[int, RouterRun]]:
    """Runs grouped by router label, then by seed (labels in ``ROUTERS`` order, seeds ascending)."""
    order = {name: i for i, name in enumerate(ROUTERS)}
    out: dict[str, dict[int, RouterRun]] = {}
    for r in sorted(runs, key=lambda r: (order.get(r.label, len(order)), r.seed)):
        out.setdefault(r.label, {})[r.seed] = r
    return out


def headline(runs: Sequence[RouterRun], scenario: Scenario) -> list[str]:
    """One row per router: means over the seeds with 95% intervals; changes against round-robin paired by seed."""
    grouped = _by_label(runs)
    base = {seed: _compare_stage(r, scenario) for seed, r in grouped.get("round-robin", {}).items()}
    rate = _fmt(scenario.compare_rate or (scenario.stages[-1].rate), 0)
    out = [
        f"| router | seeds | max QPS with TTFT p90 ≤ {SLO_TTFT_P90:g} s (min-max) | req/s at {rate} QPS | "
        f"vs round-robin | TTFT mean at {rate} QPS (s) | vs round-robin | ITL mean (ms) | prefix hit | preempt/req |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, by_seed in grouped.items():
        bests = [max_qps_at_slo(r.stages, scenario.warmup_stages) for r in by_seed.values()]
        lowest = min((st.rate for r in by_seed.values() for st in r.stages[scenario.warmup_stages :]), default=0.0)
        qps = " - ".join(f"< {lowest:g}" if b == 0 else _fmt(b, 0) for b in (min(bests), max(bests)))
        if min(bests) == max(bests):
            qps = f"< {lowest:g}" if bests[0] == 0 else _fmt(bests[0], 0)
        stages = {seed: _compare_stage(r, scenario) for seed, r in by_seed.items()}
        got = {seed: st for seed, st in stages.items() if st is not None}
        if not got:
            out.append(f"| {label} | {len(by_seed)} | {qps} | - | - | - | - | - | - | - |")
            continue
        paired = [(st, base[seed]) for seed, st in got.items() if base.get(seed) is not None]
        d_rps = fmt_interval([st.req_per_s / b.req_per_s - 1 for st, b in paired if b], 1, percent=True)
        d_ttft = fmt_interval([st.ttft_mean / b.ttft_mean - 1 for st, b in paired if b], 1, percent=True)
        vals = list(got.values())
        out.append(
            f"| {label} | {len(vals)} | {qps} | {fmt_interval([v.req_per_s for v in vals])} | {d_rps} | "
            f"{fmt_interval([v.ttft_mean for v in vals])} | {d_ttft} | "
            f"{fmt_interval([v.itl_mean for v in vals], 1, scale=1000)} | "
            f"{fmt_interval([v.prefix_hit_rate for v in vals], 3)} | "
            f"{fmt_interval([v.preemptions / max(v.requests - v.failures, 1) for v in vals])} |"
        )
    return out


def plot(runs: Sequence[RouterRun], scenario: Scenario, out_dir: Path, suffix: str) -> list[str]:
    """TTFT p90 vs QPS and output tokens/s vs QPS, one line per router; returns the files written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots", file=sys.stderr)
        return []
    written = []
    for name, key, ylabel, log in (
        ("ttft", "ttft_p90", "TTFT p90 (s)", True),
        ("throughput", "output_tokens_per_s", "output tokens/s", False),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, by_seed in _by_label(runs).items():
            per_seed = [r.stages[scenario.warmup_stages :] for r in by_seed.values()]
            n = min((len(st) for st in per_seed), default=0)
            if n == 0:
                continue
            rates = [per_seed[0][k].rate for k in range(n)]
            means = [t_interval([getattr(st[k], key) for st in per_seed])[0] for k in range(n)]
            ax.plot(rates, means, marker="o", ms=3, label=label)
        if log:
            ax.set_yscale("log")
            ax.axhline(SLO_TTFT_P90, color="grey", lw=0.8, ls="--")
        ax.set_xlabel("offered load (QPS, stage rate)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{scenario.pods} simulated pods ({scenario.profile}), shared prefix; mean over seeds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"quality_{name}{suffix}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path.name)
    return written


def report(
    scenarios: Sequence[Scenario],
    results: dict[int, list[RouterRun]],
    steady: Sequence[SteadyRow],
    args: argparse.Namespace,
    command: str,
    out_dir: Path,
    interrupted: bool,
    selection: Sequence[str] = (),
) -> str:
    seeds: list[int] = args.seeds
    lines = [
        "## Routing quality in virtual time",
        "",
        f"`{command}`; seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}; {machine()}",
        "",
        f"Headline figures are means over {len(seeds)} seed{'s' if len(seeds) > 1 else ''} ± the half-width of "
        "a 95% t-interval over the per-seed values (changes against round-robin: per-seed paired changes); each "
        "seed draws its own prompts, shuffle and arrival times. Per-stage rows are from seed "
        f"{seeds[0]} (every seed's stages are in quality.json).",
        "",
        "Same seeded arrival trace and prompt order for every router, fresh pods for each. Stage protocol of "
        "inference-perf (the next stage starts when the previous one has drained; req/s = N / (last end - first "
        "start)). `prefix hit` = the pods' prefix_cache_hits / prefix_cache_queries over the stage; `req/pod` = "
        "fewest-most requests per pod; `preempt/req` = preemptions (recompute) per finished request.",
    ]
    if interrupted:
        lines += ["", "**Interrupted: partial results.**"]
    if selection:
        lines += ["", *selection]
    for sc in scenarios:
        runs = results.get(sc.pods, [])
        profile: Profile = get_profile(sc.profile)
        lines += [
            "",
            f"### {sc.pods} pods",
            "",
            f"Profile `{profile.name}` ({profile.kv_capacity_tokens:,} KV tokens per pod). Workload: shared_prefix "
            f"{sc.num_groups} groups x {sc.prompts_per_group} prompts, system {sc.system_prompt_len} + question "
            f"{sc.question_len} → {sc.output_len} tokens. Stages (QPS x s): "
            + ", ".join(f"{s.rate:g}x{s.duration:g}" for s in sc.stages)
            + f" (the first {sc.warmup_stages} a warm-up).",
            "",
            *headline(runs, sc),
            "",
        ]
        suffix = "" if sc.pods == 8 and sc.profile != "tiny" else f"_{sc.pods}"
        pngs = plot(runs, sc, out_dir, suffix) if runs else []
        lines += [f"![{p}]({p})" for p in pngs]
        lines += ["", f"Seed {seeds[0]}:", "", *STAGE_HEADER]
        first = [r for r in runs if r.seed == seeds[0]]
        for r in first:
            lines += [stage_row(r.label, s, k < sc.warmup_stages) for k, s in enumerate(r.stages)]
        walls = {label: sum(r.wall_seconds for r in by_seed.values()) for label, by_seed in _by_label(runs).items()}
        lines += ["", "Wall time per router, all seeds: " + ", ".join(f"{k} {v:.0f} s" for k, v in walls.items()) + "."]
        rows = [r for r in steady if r.pods == sc.pods]
        if rows:
            lines += [
                "",
                f"#### Steady state, {sc.pods} pods",
                "",
                "After the warm-up stage, one Poisson stage at a constant offered rate for "
                f"{STEADY_SECONDS if not args.smoke else 8:g} s; figures from the requests arriving after its first "
                f"{STEADY_SKIP if not args.smoke else 2:g} s (completions/s and output "
                "tokens/s: completions inside that window). `cached prompt` = cached / prompt tokens of those "
                "requests at admission. **overloaded**: completions in the window fell below 95% of the arrivals in "
                "it, the queue grew for the whole run, and latencies marked ≥ are lower bounds (they grow with the "
                "run's length).",
                "",
                *steady_table(rows),
            ]
    return "\n".join(lines) + "\n"


def to_json(
    scenarios: Sequence[Scenario],
    results: dict[int, list[RouterRun]],
    steady: Sequence[SteadyRow],
    seeds: Sequence[int],
    best_config: str | None = None,
) -> dict[str, Any]:
    return {
        "seed": seeds[0],
        "seeds": list(seeds),
        "best_config": best_config if best_config is not None else BEST_CONFIG,
        "steady": [asdict(r) for r in steady],
        "slo_ttft_p90_s": SLO_TTFT_P90,
        "scenarios": [
            {
                **{k: v for k, v in asdict(sc).items() if k != "stages"},
                "stages": [asdict(s) for s in sc.stages],
                "routers": [
                    {
                        "router": r.label,
                        "seed": r.seed,
                        "max_qps_at_slo": max_qps_at_slo(r.stages, sc.warmup_stages),
                        "wall_seconds": r.wall_seconds,
                        "error": r.error,
                        "stages": [asdict(s) for s in r.stages],
                    }
                    for by_seed in _by_label(results.get(sc.pods, [])).values()
                    for r in by_seed.values()
                ],
            }
            for sc in scenarios
        ],
    }


# --------------------------------------------------------------------------------------------- selection


def selection_scenario(sc: Scenario) -> Scenario:
    """``sc``'s warm-up stages followed by its compare stage only (what a candidate is judged on)."""
    stages = list(sc.stages[: sc.warmup_stages])
    rest = sc.stages[sc.warmup_stages :]
    target = next((st for st in rest if sc.compare_rate and math.isclose(st.rate, sc.compare_rate)), rest[-1])
    return Scenario(
        sc.pods,
        sc.profile,
        sc.num_groups,
        sc.prompts_per_group,
        sc.system_prompt_len,
        sc.question_len,
        sc.output_len,
        (*stages, target),
        sc.warmup_stages,
        sc.compare_rate,
    )


def select_best(sc: Scenario, seeds: Sequence[int], pool: ProcessPoolExecutor) -> tuple[str | None, list[str]]:
    """Runs every ``CANDIDATES`` configuration on ``seeds`` and returns the one with the highest mean req/s at the
    compare stage (ties: lower mean TTFT p90), and the report's lines about the choice."""
    scenario = selection_scenario(sc)
    futures = {
        (name, seed): pool.submit(play, name, "llm-epp", config, scenario, seed)
        for name, config in CANDIDATES.items()
        for seed in seeds
    }
    stats: dict[str, list[StageStats]] = {name: [] for name in CANDIDATES}
    for (name, _seed), future in futures.items():
        run = future.result()
        if run.stages:
            stats[name].append(run.stages[-1])
    scored = {
        name: (t_interval([s.req_per_s for s in got])[0], -t_interval([s.ttft_p90 for s in got])[0])
        for name, got in stats.items()
        if got
    }
    chosen = max(scored, key=lambda name: scored[name])
    lines = [
        f"### Choosing 'llm-epp best' (selection seed{'s' if len(seeds) > 1 else ''} "
        f"{', '.join(map(str, seeds))}, not reported below)",
        "",
        f"{sc.pods} pods; warm-up, then the {scenario.stages[-1].rate:g} QPS stage; the highest mean req/s wins.",
        "",
        "| configuration | req/s | TTFT p90 s | prefix hit | preempt/req | chosen |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, got in stats.items():
        lines.append(
            f"| {name} | {fmt_interval([s.req_per_s for s in got])} | {fmt_interval([s.ttft_p90 for s in got])} | "
            f"{fmt_interval([s.prefix_hit_rate for s in got], 3)} | "
            f"{fmt_interval([s.preemptions / max(s.requests - s.failures, 1) for s in got])} | "
            f"{'**yes**' if name == chosen else ''} |"
        )
    print(f"  selection: {chosen}", file=sys.stderr, flush=True)
    return CANDIDATES[chosen], lines


# --------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", default="8,32,128", help="cluster sizes, comma-separated (default 8,32,128)")
    p.add_argument("--routers", default=",".join(ROUTERS), help=f"comma-separated, of: {', '.join(ROUTERS)}")
    p.add_argument(
        "--scale-routers",
        default="round-robin,llm-epp default,llm-epp best,locality-bound",
        help="routers run at sizes other than 8 pods (default: round-robin, both llm-epp, locality-bound)",
    )
    p.add_argument("--smoke", action="store_true", help="tiny profile and workload, 4 and 8 pods (seconds)")
    p.add_argument(
        "--ladder",
        choices=("auto", "anchor", "scale", "short"),
        default="auto",
        help="stages after the warm-up: the anchor's 16 (3 -> 60 QPS), the scale ladder's 6, or 30 and 60 QPS "
        "(rates x pods / 8); default: the anchor's at 8 pods, fewer for larger clusters",
    )
    p.add_argument(
        "--steady",
        default=",".join(f"{r:g}" for r in STEADY_RATES),
        help="offered rates of the steady-state runs at 8 pods, comma-separated ('' for none; default %(default)s)",
    )
    p.add_argument("--seeds", help="evaluation seeds, comma-separated (default 1,2,3,4,5; --smoke: 42)")
    p.add_argument("--seed", type=int, help="one evaluation seed (the same as --seeds N)")
    p.add_argument(
        "--select",
        action="store_true",
        help="first choose 'llm-epp best' among CANDIDATES on --select-seeds (warm-up and the compare stage)",
    )
    p.add_argument("--select-seeds", default="42", help="seeds of the --select runs (default 42)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes (default 2)")
    p.add_argument("--best-config", help="EndpointPickerConfig file for the 'llm-epp best' router")
    p.add_argument(
        "--output", help="directory for quality.md/.json/.png (default results; with --smoke a temporary directory)"
    )
    p.add_argument(
        "--timeline",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="also write, per ladder run, a CSV of each pod's running and waiting requests and KV use and the "
        "EPP's queue length every SECONDS of virtual time (timeline-*.csv; default 0: none)",
    )
    args = p.parse_args(argv)
    if args.timeline < 0 or not math.isfinite(args.timeline):
        p.error("--timeline: give a number of seconds > 0 (or 0 for none)")
    command = command_line("benchmarks.quality", argv)

    routers = [r.strip() for r in args.routers.split(",") if r.strip()]
    scale_routers = [r.strip() for r in args.scale_routers.split(",") if r.strip()]
    for name in (*routers, *scale_routers):
        if name not in ROUTERS:
            p.error(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")
    best_config = Path(args.best_config).read_text() if args.best_config else None
    if args.seed is not None and args.seeds:
        p.error("give --seed or --seeds, not both")
    if args.seed is not None:
        args.seeds = [args.seed]
    elif args.seeds:
        args.seeds = sorted({int(x) for x in args.seeds.split(",") if x.strip()})
    else:
        args.seeds = [42] if args.smoke else [1, 2, 3, 4, 5]
    if not args.seeds:
        p.error("--seeds: give at least one seed")
    select_seeds = sorted({int(x) for x in args.select_seeds.split(",") if x.strip()})
    if args.select and (not select_seeds or set(select_seeds) & set(args.seeds)):
        p.error("--select-seeds must be given and must not overlap the evaluation seeds")
    if args.select and best_config is not None:
        p.error("give --select or --best-config, not both")
    if args.smoke:
        scenarios = [smoke_scenario(4), smoke_scenario(8)]
        scale_routers = routers
    else:
        sizes = [int(x) for x in args.pods.split(",") if x.strip()]
        ladders = {"anchor": ANCHOR_LADDER, "scale": SCALE_LADDER, "short": SHORT_LADDER}
        scenarios = [
            anchor_scenario(n, ladder_for(n) if args.ladder == "auto" else ladders[args.ladder]) for n in sizes
        ]
    out_dir = output_path(args.output, RESULTS, args.smoke)
    out_dir.mkdir(parents=True, exist_ok=True)

    print(f"{command}\nseeds {args.seeds}; jobs {args.jobs}; {machine()}", file=sys.stderr)
    for sc in scenarios:
        names = routers if sc.pods == 8 or args.smoke else scale_routers
        print(f"  {sc.pods} pods ({sc.profile}): routers {', '.join(names)}; {sc}", file=sys.stderr)
    jobs: list[tuple[str, Scenario, int]] = []
    for seed in args.seeds:
        for sc in scenarios:
            names = routers if sc.pods == 8 or args.smoke else scale_routers
            jobs += [(name, sc, seed) for name in names]

    steady_rates = [float(x) for x in args.steady.split(",") if x.strip()]
    steady_seconds, steady_skip = STEADY_SECONDS, STEADY_SKIP
    if args.smoke:
        steady_rates, steady_seconds, steady_skip = [10.0, 40.0], 8.0, 2.0
    steady_scenario = next((sc for sc in scenarios if sc.pods == (4 if args.smoke else 8)), None)
    steady_jobs = (
        [(name, rate) for name in STEADY_ROUTERS if name in routers for rate in steady_rates]
        if steady_scenario is not None
        else []
    )

    results: dict[int, list[RouterRun]] = {}
    steady: list[SteadyRow] = []
    interrupted = False
    started = time.perf_counter()
    selection: list[str] = []
    pool = ProcessPoolExecutor(max_workers=max(args.jobs, 1))
    futures: dict[Future[Any], str] = {}
    try:
        if args.select:
            best_config, selection = select_best(scenarios[0], select_seeds, pool)
        futures = {pool.submit(run_one, name, sc, seed, best_config, args.timeline): name for name, sc, seed in jobs}
        if steady_scenario is not None:
            first = args.seeds[0]
            futures.update(
                {
                    pool.submit(
                        run_steady, name, steady_scenario, rate, first, best_config, steady_seconds, steady_skip
                    ): name
                    for name, rate in steady_jobs
                }
            )
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                got = f.result()
                if isinstance(got, SteadyRow):
                    steady.append(got)
                    continue
                results.setdefault(got.pods, []).append(got)
                if got.error:
                    interrupted = True
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: writing the runs that finished", file=sys.stderr)
        for f in futures:
            f.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
    else:
        pool.shutdown()
    order = {name: i for i, name in enumerate(ROUTERS)}
    for runs in results.values():
        runs.sort(key=lambda r: (order[r.label], r.seed))

    text = report(scenarios, results, steady, args, command, out_dir, interrupted, selection)
    timelines = [name for runs in results.values() for name in write_timelines(runs, out_dir)]
    if timelines:
        text += (
            f"\nTimelines (every {args.timeline:g} virtual s: t, stage index, requests held in the EPP's queue "
            "(empty without flow control), then per pod running, waiting, KV use): "
            + ", ".join(f"[{n}]({n})" for n in timelines)
            + ".\n"
        )
    text += f"\nTook {time.perf_counter() - started:.0f} s.\n"
    (out_dir / "quality.md").write_text(text)
    data = to_json(scenarios, results, steady, args.seeds, best_config)
    (out_dir / "quality.json").write_text(json.dumps(data, indent=1) + "\n")
    print(text)
    return 130 if interrupted else 0


if __name__ == "__main__":
    raise SystemExit(main())
