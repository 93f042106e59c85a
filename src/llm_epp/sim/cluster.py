"""A discrete-event cluster of simulated pods (:class:`~llm_epp.sim.engine.Engine`) behind a router.

Everything runs in-process on one virtual clock, on an asyncio loop whose clock is virtual
(:class:`~llm_epp.sim.virtual_loop.VirtualEventLoop`): no sockets, no wall clock, and simulated seconds
pass only when nothing is left to do at the current instant::

    workload = SharedPrefixWorkload(num_groups=10, prompts_per_group=5, system_prompt_len=200,
                                    question_len=50, output_len=20, seed=1)
    cluster = Cluster(get_profile("tiny"), num_pods=4)
    result = cluster.run(workload, [Stage(rate=20, duration=5)], make_router("llm-epp", 4), seed=1)
    print(result.stages[0].req_per_s, result.stages[0].prefix_hit_rate)

Engine steps, metric scrapes and arrivals are events in time order; each request is a task that awaits the
router (for ``llm-epp``, the real director, which may take virtual time: a deadline, a queue) and then
submits to its pod.  Event order at one instant: engine steps that end then (first tokens, completions,
which release the router's in-flight load), then the metrics scrape, then arrivals, each routed in turn.

Routers (:func:`make_router`, :mod:`llm_epp.sim.routers`): ``round-robin``, ``random``, ``least-queue``,
``locality-bound`` and ``llm-epp`` (:class:`EppRouter`: the program ``llm-epp serve`` runs, with the pods'
metrics written into its endpoint store every ``scrape_interval``, 50 ms of virtual time by default).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import heapq
import itertools
import math
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from llm_epp.sim.disagg import DecodeLeg, KvTransfer, SidecarRefusal, VirtualSidecar, role_labels
from llm_epp.sim.engine import Engine, EngineMetrics, EventKind, RequestEvent, SimRequest
from llm_epp.sim.kv_events import VirtualKVEvents
from llm_epp.sim.profiles import Profile
from llm_epp.sim.routers import (
    DEFAULT_SCRAPE_INTERVAL,
    ROUTERS,
    SIM_MODEL,
    EppRouter,
    LeastQueueRouter,
    LocalityBoundRouter,
    RandomRouter,
    RoundRobinRouter,
    RoutedRequest,
    Router,
    RoutingError,
    make_router,
    pod_address,
)
from llm_epp.sim.virtual_loop import VirtualClock, VirtualEventLoop
from llm_epp.sim.workload import Prompt, SharedPrefixWorkload, Stage, stage_offsets

__all__ = [
    "DEFAULT_SCRAPE_INTERVAL",
    "ROUTERS",
    "SIM_MODEL",
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
    "RoutingError",
    "RunResult",
    "StageStats",
    "TraceRequest",
    "make_router",
    "percentile",
    "summarize_stage",
]

T = TypeVar("T")


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
    status: int = 200
    """The HTTP status the client got: 200, the router's refusal (429 shed, 503 no candidate, ...) or 400
    when the pod rejected the request."""
    prefill_pod: int = -1
    """The pod that ran the prefill leg of a disaggregated request (-1: prefilled where it decoded)."""
    kv_bytes: int = 0
    """KV-cache bytes the decode pod pulled for it."""

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


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace (:meth:`Cluster.run_trace`): when it arrives (seconds after the run starts),
    its prompt, and optionally request headers and the gateway's endpoint subset (``ip:port`` entries)."""

    offset: float
    prompt: Prompt
    headers: Mapping[str, str] = field(default_factory=dict)
    subset: Sequence[str] | None = None


_ENGINE, _SCRAPE, _ARRIVAL = 0, 1, 2
"""Event kinds, in the order they run at one instant."""


@dataclass(slots=True)
class _InFlight:
    routed: RoutedRequest
    stage: int
    pod: int
    arrival: float
    first_token: float = math.nan
    leg: DecodeLeg | None = None


@dataclass(slots=True)
class _Stage:
    """The requests of one stage (or trace) still to finish, and what becomes of them."""

    index: int
    remaining: int
    done: asyncio.Future[None]
    results: list[RequestResult] = field(default_factory=list)

    def add(self, result: RequestResult) -> None:
        self.results.append(result)
        self.remaining -= 1
        if self.remaining == 0 and not self.done.done():
            self.done.set_result(None)


class Cluster:
    """``num_pods`` engines of one profile; :meth:`run` plays a staged workload through a router.

    Each :meth:`run` / :meth:`run_trace` runs on a fresh :class:`VirtualEventLoop` over the cluster's one
    clock (:attr:`clock` carries on from run to run, as the engines' state does).

    ``roles`` (one of ``prefill``, ``decode``, ``both`` per pod) makes a prefill/decode cluster: the pods carry
    the role labels (:meth:`pod_labels`, for the router's endpoints) and every pod has the decode-side routing
    sidecar in front (:class:`~llm_epp.sim.disagg.VirtualSidecar`): a request the router sends with
    ``x-prefiller-host-port`` runs its prefill leg on that pod, the KV moves at ``kv_transfer``'s speed, and
    the decode pod decodes it."""

    def __init__(
        self,
        profile: Profile,
        num_pods: int,
        *,
        roles: Sequence[str] | None = None,
        kv_transfer: KvTransfer | None = None,
        seed: int = 0,
    ) -> None:
        if num_pods < 1:
            raise ValueError("num_pods must be >= 1")
        if roles is not None and len(roles) != num_pods:
            raise ValueError(f"roles names {len(roles)} pods, the cluster has {num_pods}")
        self.profile = profile
        self.num_pods = num_pods
        self.roles = tuple(roles) if roles is not None else None
        self._labels = [role_labels(r) for r in self.roles] if self.roles is not None else [{} for _ in range(num_pods)]
        self.sidecar: VirtualSidecar | None = None
        if roles is not None:
            self.sidecar = VirtualSidecar(
                {f"{pod_address(i)}:8000": i for i in range(num_pods)},
                block_size=profile.block_size,
                kv_bytes_per_token=profile.kv_bytes_per_token,
                transfer=kv_transfer or KvTransfer(),
                seed=seed,
            )
        self._legs: dict[str, asyncio.Future[RequestEvent]] = {}
        self.engines = [Engine(profile, token_events=False) for _ in range(num_pods)]
        self._clock = VirtualClock()
        self._next_id = 0
        # the events to come: (time, kind, pod / arrival number, tie-breaker); an engine's entry is current
        # only while it matches _engine_due[pod] (rescheduling leaves the old entry to be skipped)
        self._events: list[tuple[float, int, int, int]] = []
        self._engine_due: list[float | None] = [None] * num_pods
        self._seq = itertools.count()
        self._arrivals: dict[int, tuple[RoutedRequest, _Stage]] = {}
        self._inflight: dict[str, tuple[_InFlight, _Stage]] = {}
        self._loop: VirtualEventLoop | None = None
        self._wakeup: asyncio.TimerHandle | None = None
        self._wakeup_at = math.inf
        self._router: Router | None = None
        self._handling = False
        self._active: list[_Stage] = []
        self.kv_events: VirtualKVEvents | None = None
        """With :meth:`publish_kv_events`: the pods' KV-cache events, on their way to the router's indexes."""

    def publish_kv_events(self, events: VirtualKVEvents) -> None:
        """Makes every pod publish its KV-cache events through ``events`` (pod ``i`` is ``pod_address(i):8000``,
        as the ``llm-epp`` router names it); ``events`` must be the KV index service the router was built
        with. Clocked by this cluster."""
        events.clock = self._clock
        events.attach(self.engines, [f"{pod_address(i)}:8000" for i in range(self.num_pods)])
        self.kv_events = events

    @property
    def clock(self) -> float:
        """The virtual time (seconds)."""
        return self._clock.now

    def metrics(self) -> list[EngineMetrics]:
        return [e.metrics() for e in self.engines]

    def pod_labels(self) -> list[dict[str, str]]:
        """Each pod's endpoint labels (the role label in a prefill/decode cluster)."""
        return [dict(labels) for labels in self._labels]

    # --- the sidecar's legs (:class:`~llm_epp.sim.disagg.LegRunner`) ----------------------------------
    async def run_leg(self, pod: int, request: SimRequest) -> RequestEvent:
        loop = self._loop
        assert loop is not None
        now = self.clock
        self._advance(pod, now)
        self.engines[pod].submit(request, now)  # ValueError: the pod rejects it
        future: asyncio.Future[RequestEvent] = loop.create_future()
        self._legs[request.id] = future
        self._reschedule(pod)
        try:
            return await future
        finally:
            self._legs.pop(request.id, None)

    def cached_prefix_tokens(self, pod: int, token_ids: Sequence[int]) -> int:
        return self.engines[pod].cached_prefix_tokens(token_ids)

    # --- public runs ----------------------------------------------------------------------------------
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
        finished) with arrival offsets drawn from ``seed``; prompts come from ``workload.next_prompt()``.
        A refused request counts as a failure with its status.  On an interrupt (Ctrl-C) the stages
        finished so far have been passed to ``progress``."""
        result = RunResult(router.name, self.num_pods)
        offsets = stage_offsets(stages, seed)

        async def play() -> None:
            for k, stage in enumerate(stages):
                before = self.metrics()
                start = self.clock
                arrivals = [(start + off, self._request(workload.next_prompt())) for off in offsets[k]]
                stage_results = await self._play(k, arrivals)
                stats = _stage_stats(stage, stage_results, self.num_pods, before, self.metrics())
                result.stages.append(stats)
                result.requests.extend(stage_results)
                if progress is not None:
                    progress(k, stats)

        self._run(play(), router)
        return result

    def run_trace(self, arrivals: Sequence[tuple[float, Prompt] | TraceRequest], router: Router) -> list[RequestResult]:
        """Plays requests arriving at the given offsets (seconds after the cluster's clock) until every one of
        them has finished; results in completion order.  The lower-level sibling of :meth:`run`, for traces
        that are not Poisson stages; a :class:`TraceRequest` may carry headers and an endpoint subset."""
        trace = [a if isinstance(a, TraceRequest) else TraceRequest(a[0], a[1]) for a in arrivals]
        if any(b.offset < a.offset for a, b in itertools.pairwise(trace)):
            raise ValueError("arrivals must be sorted by time")
        start = self.clock
        timed = [(start + t.offset, self._request(t.prompt, t.headers, t.subset)) for t in trace]
        return self._run(self._play(0, timed), router)

    # --- the loop -------------------------------------------------------------------------------------
    def _request(
        self, prompt: Prompt, headers: Mapping[str, str] | None = None, subset: Sequence[str] | None = None
    ) -> RoutedRequest:
        self._next_id += 1
        return RoutedRequest(f"req-{self._next_id}", prompt, headers or {}, subset)

    def _run(self, main: Coroutine[Any, Any, T], router: Router) -> T:
        """Runs ``main`` on a fresh virtual-time loop (in a worker thread when the caller is itself inside a
        running event loop, which cannot run a second one in its thread)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._run_here(main, router)
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="virtual-cluster") as pool:
            return pool.submit(self._run_here, main, router).result()

    def _run_here(self, main: Coroutine[Any, Any, T], router: Router) -> T:
        loop = VirtualEventLoop(self._clock)
        self._loop, self._router = loop, router
        self._wakeup, self._wakeup_at, self._handling = None, math.inf, False
        router.bind_clock(self._clock)
        interval = router.scrape_interval
        if interval is not None:
            self._push(self.clock, _SCRAPE, 0)
        try:
            return loop.run_until_complete(main)
        finally:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()
            self._loop = None
            self._router = None
            self._events = [e for e in self._events if e[1] == _ENGINE]  # the scrape and arrivals end with the run
            heapq.heapify(self._events)
            self._arrivals.clear()

    async def _play(self, index: int, arrivals: list[tuple[float, RoutedRequest]]) -> list[RequestResult]:
        """Schedules ``arrivals`` and returns once every one of them has finished or failed."""
        loop = self._loop
        assert loop is not None
        stage = _Stage(index, len(arrivals), loop.create_future())
        if not arrivals:
            return []
        for at, routed in arrivals:
            n = next(self._seq)
            self._arrivals[n] = (routed, stage)
            self._push(at, _ARRIVAL, n)
        self._active.append(stage)
        try:
            await stage.done
        finally:
            self._active.remove(stage)
        return stage.results

    def _crash(self, error: BaseException) -> None:
        """A bug in an event or a router: the run stops with it (instead of the loop logging it and the stage
        never finishing)."""
        for stage in self._active:
            if not stage.done.done():
                stage.done.set_exception(error)

    def _push(self, at: float, kind: int, index: int) -> None:
        heapq.heappush(self._events, (at, kind, index, next(self._seq)))
        if at < self._wakeup_at and not self._handling:
            self._arm()

    def _arm(self) -> None:
        """(Re)schedules the wakeup of :meth:`_next_event` at the time of the earliest event."""
        if self._wakeup is not None:
            self._wakeup.cancel()
            self._wakeup, self._wakeup_at = None, math.inf
        if self._events and self._loop is not None:
            self._wakeup_at = self._events[0][0]
            self._wakeup = self._loop.call_at(self._wakeup_at, self._next_event)

    def _next_event(self) -> None:
        """Runs the earliest event, and the ones after it while the loop has nothing else to do before them;
        then waits for the next one (tasks an event woke run in between)."""
        self._wakeup, self._wakeup_at = None, math.inf
        loop, events = self._loop, self._events
        assert loop is not None
        self._handling = True  # events pushed meanwhile are seen by the loop below, or armed at its end
        try:
            self._handle_events(loop, events)
        except Exception as e:
            self._crash(e)
        self._handling = False
        self._arm()

    def _handle_events(self, loop: VirtualEventLoop, events: list[tuple[float, int, int, int]]) -> None:
        while True:
            at, kind, index, _ = heapq.heappop(events)
            self._clock.advance_to(at)
            if kind == _ENGINE:
                if self._engine_due[index] == at:
                    self._engine_due[index] = None
                    self._advance(index, at)
            elif kind == _SCRAPE:
                router = self._router
                assert router is not None and router.scrape_interval is not None
                router.on_scrape(self.metrics(), at)
                self._push(at + router.scrape_interval, _SCRAPE, 0)
            else:
                routed, stage = self._arrivals.pop(index)
                loop.create_task(self._route(routed, stage, at))
            if not events or not loop.idle_until(events[0][0]):
                return

    def _advance(self, pod: int, now: float) -> None:
        """Advances ``pod``'s engine to ``now``, handles its events and schedules its next step."""
        engine = self.engines[pod]
        router = self._router
        assert router is not None
        for ev in engine.advance(now):
            leg = self._legs.get(ev.request_id)
            if leg is not None:
                if ev.kind is EventKind.FINISHED and not leg.done():
                    leg.set_result(ev)
                continue
            if ev.kind is EventKind.FIRST_TOKEN:
                f = self._inflight[ev.request_id][0]
                f.first_token = ev.time
                router.on_first_token(f.routed, pod, ev.time)
            elif ev.kind is EventKind.FINISHED:
                f, stage = self._inflight.pop(ev.request_id)
                if f.leg is not None:  # the sidecar reports the prefill pod's cached tokens
                    ev = dataclasses.replace(ev, cached_tokens=f.leg.cached_tokens)
                router.on_finish(f.routed, pod, ev, ev.time)
                stage.add(
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
                        prefill_pod=f.leg.prefill_pod if f.leg is not None else -1,
                        kv_bytes=f.leg.kv_bytes if f.leg is not None else 0,
                    )
                )
        if self.kv_events is not None:
            self.kv_events.flush(pod, now)
        self._reschedule(pod)

    def _reschedule(self, pod: int) -> None:
        """Schedules the end of ``pod``'s current step (asking for it fixes the step's batch)."""
        t = self.engines[pod].next_event_time()
        if t is not None and t != self._engine_due[pod]:
            self._engine_due[pod] = t
            self._push(t, _ENGINE, pod)

    async def _route(self, routed: RoutedRequest, stage: _Stage, arrival: float) -> None:
        """One request: the router decides (possibly after virtual time), then the pod gets it."""
        try:
            await self._deliver(routed, stage, arrival)
        except Exception as e:
            self._crash(e)

    async def _deliver(self, routed: RoutedRequest, stage: _Stage, arrival: float) -> None:
        router = self._router
        assert router is not None
        try:
            pod = await router.route(routed, arrival)
        except RoutingError as e:
            stage.add(self._failed(routed, stage.index, -1, arrival, self.clock, e.status))
            return
        prompt = routed.prompt
        leg: DecodeLeg | None = None
        headers = router.upstream_headers(routed)
        if self.sidecar is not None and headers:
            body = {"model": SIM_MODEL, "prompt": prompt.text, "max_tokens": prompt.max_tokens}
            try:
                leg = await self.sidecar.handle(
                    self, routed.id, pod, "/v1/completions", headers, body, prompt.token_ids
                )
            except SidecarRefusal as e:
                router.on_rejected(routed, pod, self.clock)
                stage.add(self._failed(routed, stage.index, pod, arrival, self.clock, e.status))
                return
        now = self.clock
        engine = self.engines[pod]
        self._advance(pod, now)
        external = leg.external_tokens if leg is not None else 0
        try:
            engine.submit(SimRequest(routed.id, prompt.token_ids, prompt.max_tokens, external_tokens=external), now)
        except ValueError:
            router.on_rejected(routed, pod, now)
            stage.add(self._failed(routed, stage.index, pod, arrival, now, 400))
            return
        self._inflight[routed.id] = (_InFlight(routed, stage.index, pod, arrival, leg=leg), stage)
        self._reschedule(pod)
        signal = router.eviction_signal(routed)
        if signal is not None:
            signal.add_done_callback(lambda _: self._evict(routed, pod, stage, arrival))

    def _evict(self, routed: RoutedRequest, pod: int, stage: _Stage, arrival: float) -> None:
        """The router evicted a running request: the client gets 429 and the pod aborts it (as Envoy resets
        the upstream request)."""
        now = self.clock
        self._advance(pod, now)  # it may have finished at this very instant
        if self._inflight.pop(routed.id, None) is None:
            return
        self.engines[pod].abort(routed.id)
        self._reschedule(pod)
        assert self._router is not None
        self._router.on_evicted(routed, pod, now)
        stage.add(self._failed(routed, stage.index, pod, arrival, now, 429))

    @staticmethod
    def _failed(routed: RoutedRequest, stage: int, pod: int, arrival: float, now: float, status: int) -> RequestResult:
        prompt = routed.prompt
        return RequestResult(
            routed.id, stage, prompt.group, pod, arrival, now, now, len(prompt.token_ids), 0, 0, 0, True, status
        )
