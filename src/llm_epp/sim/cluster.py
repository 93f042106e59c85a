"""A discrete-event cluster of simulated pods (:class:`~llm_epp.sim.engine.Engine`) behind a router.

Everything runs on one virtual clock, in-process: no asyncio loop, no sockets, no wall clock::

    workload = SharedPrefixWorkload(num_groups=10, prompts_per_group=5, system_prompt_len=200,
                                    question_len=50, output_len=20, seed=1)
    cluster = Cluster(get_profile("tiny"), num_pods=4)
    result = cluster.run(workload, [Stage(rate=20, duration=5)], make_router("llm-epp", 4), seed=1)
    print(result.stages[0].req_per_s, result.stages[0].prefix_hit_rate)

Event order at one instant: engine steps that end then (first tokens, completions, which release the
router's in-flight load), then the metrics scrape, then arrivals (each routed and submitted in turn).

Routers (:func:`make_router`):

* ``round-robin``: pods in turn (the "Kubernetes Service" baseline);
* ``random``: a seeded uniform choice;
* ``least-queue``: the pod with the fewest requests sent and not finished (the router's own count, like
  Envoy's least-request), ties broken at random;
* ``locality-bound``: every request of prefix group ``g`` to pod ``g % num_pods`` (perfect affinity, no
  load awareness: the upper bound on prefix reuse);
* ``llm-epp``: the real scheduler, plugins and approximate prefix producer built from an
  EndpointPickerConfig text (``None`` = the default config), run as the director runs them: PrepareData,
  ``Scheduler.schedule``, in-flight reservation, PreRequest; at completion the reservation is released and
  the ResponseComplete hooks run.  The plugins' own tie-breaking generators are re-seeded from the
  router's seed (runs are reproducible).  Endpoints carry the pods' metrics "scraped" every ``scrape_interval``
  (50 ms of virtual time by default) with ``update_time`` = the scrape's virtual time.

Plugins get the virtual clock through ``handle.now()`` (the saturation detectors compare it with
``update_time``), so staleness is judged in virtual time.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

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
    RequestBody,
)
from llm_epp.framework.requestcontrol import ResponseInfo, Usage
from llm_epp.plugins import builtin_registry
from llm_epp.requestcontrol.director import estimate_tokens
from llm_epp.scheduling import SchedulingFailedError
from llm_epp.sim.engine import Engine, EngineMetrics, EventKind, RequestEvent, SimRequest
from llm_epp.sim.profiles import Profile
from llm_epp.sim.workload import Prompt, SharedPrefixWorkload, Stage, stage_offsets

__all__ = [
    "ROUTERS",
    "Cluster",
    "EppRouter",
    "LeastQueueRouter",
    "LocalityBoundRouter",
    "MeasuredRequest",
    "RandomRouter",
    "RequestResult",
    "RoundRobinRouter",
    "RoutedRequest",
    "Router",
    "RunResult",
    "StageStats",
    "make_router",
    "percentile",
    "summarize_stage",
]

DEFAULT_SCRAPE_INTERVAL = 0.05
SIM_MODEL = "sim-model"


@dataclass(frozen=True, slots=True)
class RoutedRequest:
    """What a router is told about a request."""

    id: str
    prompt: Prompt


class RoutingError(Exception):
    """The router could not place the request (counted as a failure)."""


class Router:
    """Base router: picks a pod index for each request; optional hooks for completions and scrapes."""

    name = "router"
    scrape_interval: float | None = None
    """Seconds of virtual time between metric scrapes (``None``: the router needs no metrics)."""

    def pick(self, request: RoutedRequest, now: float) -> int:
        raise NotImplementedError

    def on_finish(self, request: RoutedRequest, pod: int, event: RequestEvent, now: float) -> None:
        """Called when ``request`` finished on ``pod``."""

    def on_scrape(self, metrics: Sequence[EngineMetrics], now: float) -> None:
        """Called every ``scrape_interval`` with every pod's current metrics."""


class RoundRobinRouter(Router):
    name = "round-robin"

    def __init__(self, num_pods: int) -> None:
        self._n = num_pods
        self._next = 0

    def pick(self, request: RoutedRequest, now: float) -> int:
        pod = self._next % self._n
        self._next += 1
        return pod


class RandomRouter(Router):
    name = "random"

    def __init__(self, num_pods: int, seed: int = 0) -> None:
        self._n = num_pods
        self._rng = random.Random(seed)

    def pick(self, request: RoutedRequest, now: float) -> int:
        return self._rng.randrange(self._n)


class LeastQueueRouter(Router):
    name = "least-queue"

    def __init__(self, num_pods: int, seed: int = 0) -> None:
        self._outstanding = [0] * num_pods
        self._rng = random.Random(seed)

    def pick(self, request: RoutedRequest, now: float) -> int:
        low = min(self._outstanding)
        pods = [i for i, n in enumerate(self._outstanding) if n == low]
        pod = pods[0] if len(pods) == 1 else self._rng.choice(pods)
        self._outstanding[pod] += 1
        return pod

    def on_finish(self, request: RoutedRequest, pod: int, event: RequestEvent, now: float) -> None:
        self._outstanding[pod] -= 1


class LocalityBoundRouter(Router):
    name = "locality-bound"

    def __init__(self, num_pods: int) -> None:
        self._n = num_pods

    def pick(self, request: RoutedRequest, now: float) -> int:
        return request.prompt.group % self._n


def _run_sync(coro: Coroutine[Any, Any, None]) -> None:
    """Runs a coroutine that never awaits (PrepareData plugins) without an event loop."""
    try:
        coro.send(None)
    except StopIteration:
        return
    coro.close()
    raise RuntimeError("a PrepareData plugin awaited; the simulator cannot run it without an event loop")


def _seed_random_generators(loaded: LoadedConfig, seed: int) -> None:
    """Re-seeds the tie-breaking generators the plugins and profiles create for themselves (seeded from the
    OS by default), in a fixed order, so that a simulated run is reproducible."""
    owners: list[object] = [*loaded.plugins.values()]
    for profile in loaded.scheduler.profiles.values():
        owners += [profile, profile.picker]
    k = 0
    for owner in owners:
        for value in getattr(owner, "__dict__", {}).values():
            if isinstance(value, random.Random):
                k += 1
                value.seed(seed * 1_000_003 + k)


@dataclass(slots=True)
class _Pending:
    request: InferenceRequest
    cycle: CycleState
    endpoint: Endpoint
    reserved_tokens: int


class EppRouter(Router):
    """The llm-epp scheduler with its plugins, run in-process as the director runs them."""

    name = "llm-epp"

    def __init__(
        self,
        num_pods: int,
        config_text: str | None = None,
        scrape_interval: float = DEFAULT_SCRAPE_INTERVAL,
        model: str = SIM_MODEL,
        seed: int = 0,
    ) -> None:
        self.scrape_interval = scrape_interval
        self._model = model
        self._loads = [InFlightLoad() for _ in range(num_pods)]
        self._meta = [
            EndpointMetadata(EndpointKey("default", f"sim-pod-{i}"), f"10.0.{i // 256}.{i % 256}", 8000)
            for i in range(num_pods)
        ]
        self.endpoints: list[Endpoint] = [
            Endpoint(m, Metrics(), load) for m, load in zip(self._meta, self._loads, strict=True)
        ]
        self._pod_of = {m.key: i for i, m in enumerate(self._meta)}
        self.now = 0.0
        """The virtual time of the latest scrape or pick: the clock the plugins see (``handle.now()``)."""
        self.loaded = load_config_text(
            config_text, builtin_registry(), NullRecorder(), lambda: self.endpoints, clock=lambda: self.now
        )
        _seed_random_generators(self.loaded, seed)
        self._pending: dict[str, _Pending] = {}

    def on_scrape(self, metrics: Sequence[EngineMetrics], now: float) -> None:
        self.now = max(self.now, now)
        stamp = now if now > 0 else 1e-9  # update_time 0 means "never scraped"
        self.endpoints = [
            Endpoint(
                meta,
                Metrics(
                    waiting_queue_size=m.num_requests_waiting,
                    running_requests=m.num_requests_running,
                    kv_cache_usage=m.kv_cache_usage_perc,
                    active_models=frozenset(m.running_lora_adapters),
                    waiting_models=frozenset(m.waiting_lora_adapters),
                    max_active_models=m.max_lora,
                    cache_block_size=m.block_size,
                    cache_num_blocks=m.num_gpu_blocks,
                    update_time=stamp,
                ),
                load,
            )
            for meta, m, load in zip(self._meta, metrics, self._loads, strict=True)
        ]

    def pick(self, request: RoutedRequest, now: float) -> int:
        self.now = max(self.now, now)
        prompt = request.prompt
        payload = {"model": self._model, "prompt": prompt.text, "max_tokens": prompt.max_tokens}
        size = len(prompt.text) + 64  # the JSON around the prompt, roughly
        inference = InferenceRequest(
            request.id, self._model, self._model, RequestBody(ApiKind.COMPLETIONS, payload), size_bytes=size
        )
        cycle = CycleState()
        loaded = self.loaded
        candidates = list(self.endpoints)
        for producer in loaded.prepare_data:
            _run_sync(producer.prepare_data(cycle, inference, candidates))
        for admission in loaded.admission:
            coro = admission.admit(cycle, inference, candidates)
            try:
                coro.send(None)
            except StopIteration as stop:
                if stop.value is not None:
                    raise RoutingError(f"not admitted: {stop.value}") from None
            else:
                coro.close()
                raise RuntimeError("an Admission plugin awaited; the simulator cannot run it")
        try:
            result = loaded.scheduler.schedule(inference, candidates, cycle)
        except SchedulingFailedError as e:
            raise RoutingError(str(e)) from None
        primary = result.primary
        if primary is None or not primary.target_endpoints:
            raise RoutingError("no target endpoint")
        endpoint = primary.target_endpoints[0]
        reserved = estimate_tokens(size)
        endpoint.load.requests += 1
        endpoint.load.tokens += reserved
        for hook in loaded.pre_request:
            hook.pre_request(cycle, inference, result)
        self._pending[request.id] = _Pending(inference, cycle, endpoint, reserved)
        return self._pod_of[endpoint.key]

    def on_finish(self, request: RoutedRequest, pod: int, event: RequestEvent, now: float) -> None:
        self.now = max(self.now, now)
        pending = self._pending.pop(request.id)
        load = pending.endpoint.load
        load.requests = max(load.requests - 1, 0)
        load.tokens = max(load.tokens - pending.reserved_tokens, 0)
        usage = Usage(
            prompt_tokens=event.prompt_tokens,
            completion_tokens=event.completion_tokens,
            total_tokens=event.prompt_tokens + event.completion_tokens,
            cached_tokens=event.cached_tokens,
        )
        info = ResponseInfo(status=200, served_endpoint=pending.endpoint.hostport, usage=usage, complete=True)
        for hook in self.loaded.response_complete:
            hook.response_complete(pending.cycle, pending.request, info, pending.endpoint)


ROUTERS = ("round-robin", "random", "least-queue", "locality-bound", "llm-epp")


def make_router(
    name: str,
    num_pods: int,
    *,
    seed: int = 0,
    config_text: str | None = None,
    scrape_interval: float = DEFAULT_SCRAPE_INTERVAL,
) -> Router:
    """A fresh router called ``name`` (one of :data:`ROUTERS`) for ``num_pods`` pods."""
    if name == "round-robin":
        return RoundRobinRouter(num_pods)
    if name == "random":
        return RandomRouter(num_pods, seed)
    if name == "least-queue":
        return LeastQueueRouter(num_pods, seed)
    if name == "locality-bound":
        return LocalityBoundRouter(num_pods)
    if name == "llm-epp":
        return EppRouter(num_pods, config_text, scrape_interval, seed=seed)
    raise KeyError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")


# --------------------------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class RequestResult:
    id: str
    stage: int
    group: int
    pod: int
    """-1 when the request failed before reaching a pod."""
    arrival: float
    first_token: float
    finish: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    preemptions: int
    failed: bool = False

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def e2e(self) -> float:
        return self.finish - self.arrival

    @property
    def itl_mean(self) -> float:
        """Mean inter-token latency (0 for a single-token answer)."""
        if self.completion_tokens < 2:
            return 0.0
        return (self.finish - self.first_token) / (self.completion_tokens - 1)

    @property
    def itl(self) -> float:
        """Mean inter-token latency; NaN for a single-token answer (what :func:`summarize_stage` reads)."""
        return self.itl_mean if self.completion_tokens > 1 else math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100), linear interpolation between closest ranks; NaN when empty."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


@dataclass(frozen=True, slots=True)
class StageStats:
    rate: float
    duration: float
    requests: int
    failures: int
    start: float
    """First arrival."""
    end: float
    """Last completion."""
    req_per_s: float
    """Finished requests / (last end - first start)."""
    output_tokens_per_s: float
    ttft_mean: float
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    itl_mean: float
    itl_p50: float
    e2e_p50: float
    prefix_hit_rate: float
    """Engine counters over the stage: prefix_cache_hits / prefix_cache_queries."""
    requests_per_pod: tuple[int, ...]
    preemptions: int
    mean_concurrency_per_pod: float
    """Sum of E2E over the stage window / (window x pods)."""
    e2e_mean: float = math.nan


@dataclass(slots=True)
class RunResult:
    router: str
    num_pods: int
    stages: list[StageStats] = field(default_factory=list)
    requests: list[RequestResult] = field(default_factory=list)


class MeasuredRequest(Protocol):
    """What :func:`summarize_stage` reads of a request, however it was measured (virtual or wall seconds)."""

    @property
    def arrival(self) -> float: ...
    @property
    def finish(self) -> float: ...
    @property
    def ttft(self) -> float: ...
    @property
    def e2e(self) -> float: ...
    @property
    def itl(self) -> float:
        """Mean gap between output tokens; NaN with fewer than two."""
        ...

    @property
    def completion_tokens(self) -> int: ...
    @property
    def failed(self) -> bool: ...


def summarize_stage(
    stage: Stage,
    results: Sequence[MeasuredRequest],
    *,
    requests_per_pod: Sequence[int],
    prefix_hits: float,
    prefix_queries: float,
    preemptions: int,
) -> StageStats:
    """One stage's figures from its requests and the pods' counters over the stage (the virtual-time cluster
    and the live benchmark share it, so their tables mean the same)."""
    done = [r for r in results if not r.failed]
    start = min((r.arrival for r in results), default=0.0)
    end = max((r.finish for r in done), default=start)
    window = end - start
    ttfts = [r.ttft for r in done]
    itls = [r.itl for r in done if not math.isnan(r.itl)]
    e2es = [r.e2e for r in done]
    return StageStats(
        rate=stage.rate,
        duration=stage.duration,
        requests=len(results),
        failures=len(results) - len(done),
        start=start,
        end=end,
        req_per_s=len(done) / window if window > 0 else math.nan,
        output_tokens_per_s=sum(r.completion_tokens for r in done) / window if window > 0 else math.nan,
        ttft_mean=_mean(ttfts),
        ttft_p50=percentile(ttfts, 50),
        ttft_p90=percentile(ttfts, 90),
        ttft_p99=percentile(ttfts, 99),
        itl_mean=_mean(itls),
        itl_p50=percentile(itls, 50),
        e2e_p50=percentile(e2es, 50),
        e2e_mean=_mean(e2es),
        prefix_hit_rate=prefix_hits / prefix_queries if prefix_queries else 0.0,
        requests_per_pod=tuple(requests_per_pod),
        preemptions=preemptions,
        mean_concurrency_per_pod=sum(e2es) / (window * len(requests_per_pod)) if window > 0 else math.nan,
    )


def _stage_stats(
    stage: Stage,
    results: Sequence[RequestResult],
    num_pods: int,
    before: Sequence[EngineMetrics],
    after: Sequence[EngineMetrics],
) -> StageStats:
    per_pod = [0] * num_pods
    for r in results:
        if not r.failed:
            per_pod[r.pod] += 1
    return summarize_stage(
        stage,
        results,
        requests_per_pod=per_pod,
        prefix_hits=sum(a.prefix_cache_hits - b.prefix_cache_hits for a, b in zip(after, before, strict=True)),
        prefix_queries=sum(a.prefix_cache_queries - b.prefix_cache_queries for a, b in zip(after, before, strict=True)),
        preemptions=sum(r.preemptions for r in results if not r.failed),
    )


# --------------------------------------------------------------------------------------------- cluster


@dataclass(slots=True)
class _InFlight:
    routed: RoutedRequest
    stage: int
    pod: int
    arrival: float
    first_token: float = math.nan


class Cluster:
    """``num_pods`` engines of one profile; :meth:`run` plays a staged workload through a router."""

    def __init__(self, profile: Profile, num_pods: int) -> None:
        if num_pods < 1:
            raise ValueError("num_pods must be >= 1")
        self.profile = profile
        self.num_pods = num_pods
        self.engines = [Engine(profile, token_events=False) for _ in range(num_pods)]
        self.clock = 0.0
        self._next_id = 0

    def metrics(self) -> list[EngineMetrics]:
        return [e.metrics() for e in self.engines]

    def run(
        self,
        workload: SharedPrefixWorkload,
        stages: Sequence[Stage],
        router: Router,
        *,
        seed: int = 0,
        progress: Callable[[int, StageStats], None] | None = None,
    ) -> RunResult:
        """Plays ``stages`` one after the other (the next starts when the previous stage's last request
        finished) with arrival offsets drawn from ``seed``; prompts come from ``workload.next_prompt()``."""
        result = RunResult(router.name, self.num_pods)
        offsets = stage_offsets(stages, seed)
        next_scrape = self.clock if router.scrape_interval is not None else math.inf
        for k, stage in enumerate(stages):
            before = self.metrics()
            arrivals = [(self.clock + off, workload.next_prompt()) for off in offsets[k]]
            stage_results, next_scrape = self._run_stage(k, arrivals, router, next_scrape)
            stats = _stage_stats(stage, stage_results, self.num_pods, before, self.metrics())
            result.stages.append(stats)
            result.requests.extend(stage_results)
            if progress is not None:
                progress(k, stats)
        return result

    def run_trace(self, arrivals: Sequence[tuple[float, Prompt]], router: Router) -> list[RequestResult]:
        """Plays requests arriving at the given offsets (seconds after the cluster's clock) until every one of
        them has finished; results in completion order.  The lower-level sibling of :meth:`run`, for traces
        that are not Poisson stages."""
        if any(b[0] < a[0] for a, b in itertools.pairwise(arrivals)):
            raise ValueError("arrivals must be sorted by time")
        timed = [(self.clock + offset, prompt) for offset, prompt in arrivals]
        next_scrape = self.clock if router.scrape_interval is not None else math.inf
        results, _ = self._run_stage(0, timed, router, next_scrape)
        return results

    def _run_stage(
        self, stage: int, arrivals: list[tuple[float, Prompt]], router: Router, next_scrape: float
    ) -> tuple[list[RequestResult], float]:
        engines = self.engines
        interval = router.scrape_interval
        inflight: dict[str, _InFlight] = {}
        results: list[RequestResult] = []
        i = 0
        while i < len(arrivals) or inflight:
            t_arrival = arrivals[i][0] if i < len(arrivals) else math.inf
            t_engine = math.inf
            for engine in engines:
                t = engine.next_event_time()
                if t is not None and t < t_engine:
                    t_engine = t
            if t_engine == math.inf and t_arrival == math.inf:
                raise RuntimeError("requests in flight but no engine has work")  # cannot happen
            if t_engine <= t_arrival and t_engine <= next_scrape:
                for pod, engine in enumerate(engines):
                    if engine.next_event_time() == t_engine:
                        self._handle(engine.advance(t_engine), pod, inflight, results, router)
                self.clock = max(self.clock, t_engine)
            elif next_scrape <= t_arrival:
                assert interval is not None
                router.on_scrape(self.metrics(), next_scrape)
                self.clock = max(self.clock, next_scrape)
                next_scrape += interval
            else:
                now, prompt = arrivals[i]
                i += 1
                self.clock = max(self.clock, now)
                self._next_id += 1
                routed = RoutedRequest(f"req-{self._next_id}", prompt)
                try:
                    pod = router.pick(routed, now)
                except RoutingError:
                    results.append(self._failed(routed, stage, -1, now))
                    continue
                engine = engines[pod]
                self._handle(engine.advance(now), pod, inflight, results, router)
                try:
                    engine.submit(SimRequest(routed.id, prompt.token_ids, prompt.max_tokens), now)
                except ValueError:
                    results.append(self._failed(routed, stage, pod, now))
                    continue
                inflight[routed.id] = _InFlight(routed, stage, pod, now)
        if interval is not None and next_scrape < self.clock:  # keep the scrape grid, skip the past ticks
            next_scrape += math.ceil((self.clock - next_scrape) / interval) * interval
        return results, next_scrape

    @staticmethod
    def _failed(routed: RoutedRequest, stage: int, pod: int, now: float) -> RequestResult:
        prompt = routed.prompt
        return RequestResult(
            routed.id, stage, prompt.group, pod, now, now, now, len(prompt.token_ids), 0, 0, 0, failed=True
        )

    @staticmethod
    def _handle(
        events: list[RequestEvent],
        pod: int,
        inflight: dict[str, _InFlight],
        results: list[RequestResult],
        router: Router,
    ) -> None:
        for ev in events:
            if ev.kind is EventKind.FIRST_TOKEN:
                inflight[ev.request_id].first_token = ev.time
            elif ev.kind is EventKind.FINISHED:
                f = inflight.pop(ev.request_id)
                results.append(
                    RequestResult(
                        ev.request_id,
                        f.stage,
                        f.routed.prompt.group,
                        pod,
                        f.arrival,
                        f.first_token,
                        ev.time,
                        ev.prompt_tokens,
                        ev.cached_tokens,
                        ev.completion_tokens,
                        ev.preemptions,
                    )
                )
                router.on_finish(f.routed, pod, ev, ev.time)
