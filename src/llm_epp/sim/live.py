"""A live simulated pod: one :class:`~llm_epp.sim.engine.Engine` driven in real time by an asyncio task.

Virtual time is ``(loop.time() - start) / time_scale``: a modelled duration ``d`` takes ``d * time_scale``
seconds of wall time (``time_scale=0.01`` runs 100x faster).  The driver sleeps until the end of the
current engine step, advances the engine to the present and hands the events to the requests'
queues.  A late driver (busy loop) catches up by advancing over several steps at once.

Requests whose client went away keep running in the engine (no abort is modelled); their events are
dropped.

``engine`` picks the server imitated on ``/metrics``: ``"vllm"`` (:mod:`llm_epp.sim.vllm_metrics`) or
``"sglang"`` (:mod:`llm_epp.sim.sglang_metrics`); the engine model underneath is the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from llm_epp.sim.disagg import ROLES, KvTransfer, pulled_tokens
from llm_epp.sim.engine import Engine, EventKind, RequestEvent, SimRequest
from llm_epp.sim.profiles import Profile
from llm_epp.sim.sglang_metrics import SGLangExporter, new_pod_metrics
from llm_epp.sim.vllm_metrics import PodMetrics, render

__all__ = ["ENGINES", "LivePod", "LiveRequest"]

ENGINES = ("vllm", "sglang")
"""Model servers a live pod can imitate."""


@dataclass(slots=True)
class LiveRequest:
    id: str
    arrival: float
    """Virtual time of submission."""
    stream: bool
    queue: asyncio.Queue[RequestEvent] = field(default_factory=asyncio.Queue)
    last_token: float = 0.0
    abandoned: bool = False


class LivePod:
    """One simulated model server's engine in real time (no HTTP; see :mod:`llm_epp.sim.server`)."""

    def __init__(
        self,
        name: str,
        profile: Profile,
        *,
        model: str = "sim-model",
        loras: tuple[str, ...] = (),
        time_scale: float = 1.0,
        engine: str = "vllm",
        role: str | None = None,
        kv_transfer: KvTransfer | None = None,
    ) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}")
        if role is not None and role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}")
        self.name = name
        self.engine_kind = engine
        """The model server imitated (one of :data:`ENGINES`)."""
        self.profile = profile
        self.model = model
        self.loras = tuple(loras)
        self.time_scale = time_scale
        self.role = role
        """``prefill``, ``decode`` or ``both`` in a prefill/decode pool (None: an aggregated pool); every pod
        honours ``kv_transfer_params`` either way, as vLLM with the NIXL connector in ``kv_both`` does."""
        self.kv_transfer = kv_transfer or KvTransfer()
        self.engine_id = f"{name}-engine"
        self.engine = Engine(profile, 0.0, token_events=True)
        self.stats = new_pod_metrics() if engine == "sglang" else PodMetrics()
        self._sglang = SGLangExporter(model) if engine == "sglang" else None
        self._requests: dict[str, LiveRequest] = {}
        self._ids = itertools.count(1)
        self._t0 = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.after_advance: Callable[[], None] | None = None
        """Called after every advance of the engine (a KV-event publisher flushes there)."""

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> LivePod:
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._drive(), name=f"sim-pod-{self.name}")
        return self

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def served_models(self) -> tuple[str, ...]:
        return (self.model, *self.loras)

    @property
    def in_flight(self) -> int:
        return len(self._requests)

    def now(self) -> float:
        """The current virtual time (never behind the engine's clock)."""
        assert self._loop is not None, "pod not started"
        return max((self._loop.time() - self._t0) / self.time_scale, self.engine.clock)

    # ------------------------------------------------------------------ requests

    def submit(
        self,
        prompt_token_ids: tuple[int, ...],
        max_tokens: int,
        lora: str | None,
        *,
        stream: bool,
        external_tokens: int = 0,
    ) -> LiveRequest:
        """Queue a request now; ``ValueError`` if the engine rejects it.  ``external_tokens``: leading prompt
        tokens whose KV was pulled from a prefill pod (not prefilled here)."""
        now = self.now()
        self._deliver(self.engine.advance(now))
        rid = f"{self.name}-{next(self._ids)}"
        request = SimRequest(rid, prompt_token_ids, max_tokens, lora, external_tokens=external_tokens)
        self.engine.submit(request, now)
        req = LiveRequest(rid, now, stream)
        self._requests[rid] = req
        self._wake.set()
        return req

    async def pull_kv(self, prompt_token_ids: tuple[int, ...], lora: str | None) -> int:
        """Pulls the prompt's KV this pod does not hold from a prefill pod: waits the modelled transfer time
        and counts it in the transfer metrics; the bytes moved."""
        local = self.engine.cached_prefix_tokens(prompt_token_ids, lora)
        nbytes = pulled_tokens(len(prompt_token_ids), local) * self.profile.kv_bytes_per_token
        seconds = self.kv_transfer.duration(nbytes)
        await asyncio.sleep(seconds * self.time_scale)
        self.stats.kv_transfer.observe(seconds, nbytes)
        return nbytes

    def abandon(self, req: LiveRequest) -> None:
        """The client is gone: keep the engine work, drop the events."""
        req.abandoned = True

    def metrics_text(self) -> str:
        """The ``/metrics`` page of the imitated server, after advancing the engine to now."""
        now = 0.0
        if self._loop is not None:
            now = self.now()
            self._deliver(self.engine.advance(now))
        if self._sglang is not None:
            return self._sglang.render(self.engine.metrics(), self.stats, now=now)
        snap = self.engine.metrics()
        return render(self.model, snap, self.stats, lora_enabled=bool(self.loras), kv_transfer=self.role is not None)

    # ------------------------------------------------------------------ driver

    async def _drive(self) -> None:
        assert self._loop is not None
        engine = self.engine
        while True:
            t = engine.next_event_time()
            if t is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            delay = (t - self.now()) * self.time_scale
            if delay > 0:
                await asyncio.sleep(delay)
            self._deliver(engine.advance(max(t, self.now())))

    def reset_prefix_cache(self) -> bool:
        """vLLM's ``/reset_prefix_cache``: False while requests run."""
        self._deliver(self.engine.advance(self.now()))
        done = self.engine.reset_prefix_cache()
        if self.after_advance is not None:
            self.after_advance()
        return done

    def _deliver(self, events: list[RequestEvent]) -> None:
        if self.after_advance is not None:
            self.after_advance()
        stats = self.stats
        for ev in events:
            req = self._requests.get(ev.request_id)
            if req is None:
                continue
            if ev.kind is EventKind.FIRST_TOKEN:
                stats.ttft.observe(ev.time - req.arrival)
                req.last_token = ev.time
            elif ev.kind is EventKind.TOKEN:
                stats.itl.observe(ev.time - req.last_token)
                req.last_token = ev.time
            else:
                stats.e2e.observe(ev.time - req.arrival)
                stats.observe_finished(ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens)
                del self._requests[ev.request_id]
            if not req.abandoned and (req.stream or ev.kind is EventKind.FINISHED):
                req.queue.put_nowait(ev)
