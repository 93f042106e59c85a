"""Routers for the virtual-time cluster (:mod:`llm_epp.sim.cluster`): where each request goes.

* ``round-robin``: pods in turn (the "Kubernetes Service" baseline);
* ``random``: a seeded uniform choice;
* ``least-queue``: the pod with the fewest requests sent and not finished (the router's own count, like
  Envoy's least-request), ties broken at random;
* ``locality-bound``: every request of prefix group ``g`` to pod ``g % num_pods`` (perfect affinity, no
  load awareness: the upper bound on prefix reuse);
* ``llm-epp``: :class:`EppRouter`, the program ``llm-epp serve`` runs: the same endpoint store,
  configuration loading, director and plugins (:func:`llm_epp.composition.build_request_path`), on the
  simulator's clock and seeded generators.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import orjson

from llm_epp.composition import build_request_path
from llm_epp.config import LoadedConfig
from llm_epp.datalayer.datastore import Datastore
from llm_epp.datalayer.objectives import ObjectivesConfig, ObjectivesStore
from llm_epp.flowcontrol.controller import FlowControlObserver
from llm_epp.framework import EndpointKey, EndpointMetadata, Metrics, NullRecorder, Recorder, Registry, seeded_random
from llm_epp.framework.requestcontrol import Usage
from llm_epp.requestcontrol.director import Director
from llm_epp.sim.director_client import DirectorClient, Refused, Routed
from llm_epp.sim.engine import EngineMetrics, RequestEvent
from llm_epp.sim.workload import Prompt

__all__ = [
    "DEFAULT_SCRAPE_INTERVAL",
    "ROUTERS",
    "SIM_MODEL",
    "EppRouter",
    "LeastQueueRouter",
    "LocalityBoundRouter",
    "RandomRouter",
    "RoundRobinRouter",
    "RoutedRequest",
    "Router",
    "RoutingError",
    "make_router",
]

DEFAULT_SCRAPE_INTERVAL = 0.05
SIM_MODEL = "sim-model"
SIM_POOL = "sim-pool"


@dataclass(frozen=True, slots=True)
class RoutedRequest:
    """What a router is told about a request: the prompt, and what a client could add to it (headers such as
    ``x-gateway-inference-objective``, the gateway's endpoint subset as ``ip:port`` entries)."""

    id: str
    prompt: Prompt
    headers: Mapping[str, str] = field(default_factory=dict)
    subset: Sequence[str] | None = None


class RoutingError(Exception):
    """The router refused the request (counted as a failure with `status`)."""

    def __init__(self, message: str, status: int = 503) -> None:
        super().__init__(message)
        self.status = status


class Router:
    """Base router: picks a pod index for each request; optional hooks for responses and scrapes."""

    name = "router"
    scrape_interval: float | None = None
    """Seconds of virtual time between metric scrapes (``None``: the router needs no metrics)."""

    def bind_clock(self, clock: Callable[[], float]) -> None:
        """The cluster's virtual clock, given before a run."""

    def pick(self, request: RoutedRequest, now: float) -> int:
        raise NotImplementedError

    async def route(self, request: RoutedRequest, now: float) -> int:
        """The pod for ``request``; raises :class:`RoutingError` to refuse it.  May take virtual time."""
        return self.pick(request, now)

    def on_first_token(self, request: RoutedRequest, pod: int, now: float) -> None:
        """Called when ``request`` produced its first token on ``pod`` (its response starts)."""

    def on_finish(self, request: RoutedRequest, pod: int, event: RequestEvent, now: float) -> None:
        """Called when ``request`` finished on ``pod``."""

    def on_rejected(self, request: RoutedRequest, pod: int, now: float) -> None:
        """Called when ``pod`` refused ``request`` (the engine's 400: too long, unknown adapter)."""

    def on_scrape(self, metrics: Sequence[EngineMetrics], now: float) -> None:
        """Called every ``scrape_interval`` with every pod's current metrics."""

    def watch_scrapes(self, observer: Callable[[Sequence[EngineMetrics], float], None], every: float) -> None:
        """Calls ``observer(metrics, now)`` after each of this router's scrapes (a benchmark's view of the pods).
        A router that reads no metrics is scraped every ``every`` seconds for the observer alone; its routing
        does not change."""
        if self.scrape_interval is None:
            self.scrape_interval = every
        inner = self.on_scrape

        def on_scrape(metrics: Sequence[EngineMetrics], now: float) -> None:
            inner(metrics, now)
            observer(metrics, now)

        self.on_scrape = on_scrape  # type: ignore[method-assign]

    def upstream_headers(self, request: RoutedRequest) -> Mapping[str, str]:
        """Headers the router sets on the request it sends to the pod (``x-prefiller-host-port``)."""
        return {}

    def eviction_signal(self, request: RoutedRequest) -> asyncio.Future[None] | None:
        """Resolved when the router ends ``request`` while it runs (flow control's eviction); None: never."""
        return None

    def on_evicted(self, request: RoutedRequest, pod: int, now: float) -> None:
        """Called when ``request`` was ended on ``pod`` after its ``eviction_signal`` (the client got 429)."""


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

    def on_rejected(self, request: RoutedRequest, pod: int, now: float) -> None:
        self._outstanding[pod] -= 1


class LocalityBoundRouter(Router):
    name = "locality-bound"

    def __init__(self, num_pods: int) -> None:
        self._n = num_pods

    def pick(self, request: RoutedRequest, now: float) -> int:
        return request.prompt.group % self._n


def pod_address(pod: int) -> str:
    """The simulated pod's IP address (``10.0.x.y``; port 8000)."""
    return f"10.0.{pod // 256}.{pod % 256}"


def scraped_metrics(m: EngineMetrics, now: float) -> Metrics:
    """What the core metrics extractor reads from a vLLM pod's ``/metrics`` page, taken from the engine."""
    return Metrics(
        waiting_queue_size=m.num_requests_waiting,
        running_requests=m.num_requests_running,
        kv_cache_usage=m.kv_cache_usage_perc,
        active_models=frozenset(m.running_lora_adapters),
        waiting_models=frozenset(m.waiting_lora_adapters),
        max_active_models=m.max_lora,
        cache_block_size=m.block_size,
        cache_num_blocks=m.num_gpu_blocks,
        update_time=now if now > 0 else 1e-9,  # update_time 0 means "never scraped"
    )


class EppRouter(Router):
    """llm-epp as ``llm-epp serve`` runs it, on the simulator's clock.

    The request path comes from :func:`~llm_epp.composition.build_request_path` (what ``app.build`` uses):
    an endpoint store holding one endpoint per pod, the EndpointPickerConfig ``config_text`` (``None``: the
    default configuration) and the director.  Each request is a completions body sent through the director
    (:class:`~llm_epp.sim.director_client.DirectorClient`): saturation shedding, subset filtering,
    PrepareData under its deadline (in virtual seconds), scheduling, PreRequest, in-flight accounting;
    the first token runs the ResponseReceived hooks, the end the completion.  Every ``scrape_interval`` the
    pods' metrics go into the store through ``Datastore.update_metrics``, the call the data-layer runtime
    makes after each scrape.  Plugins, profiles and the director draw from generators seeded from ``seed``
    and their names; ``handle.now()`` is the virtual clock.

    ``objectives`` (priorities and model rewrites, as in an objectives file), ``recorder``, ``registry`` and
    ``disable_subset_filter`` are what the corresponding ``llm-epp serve`` inputs are; ``pod_labels`` are the
    endpoints' labels (a prefill/decode pool's role labels); ``flow_observer`` sees what flow control does (the
    metrics' view: queue times and outcomes). ``token_prompts`` sends each prompt as its token ids (what a
    render endpoint would answer for its text), for plugins that need the engine's tokens
    (``precise-prefix-cache-producer``).

    What the EPP learns of each response, as a deployment decides it. The defaults are what ``llm-epp
    envoy-config``'s defaults give it (response bodies NONE): ``response_headers_at="arrival"``, the
    ResponseReceived hooks run when the pod takes the request (vLLM sends a streamed response's headers at
    once, before its first token), and ``response_usage=False``, the EPP never reads the token usage.
    ``"first-token"`` with ``response_usage=True`` stands for a deployment that streams response bodies to the
    EPP, whose plugins time the first token from the first body bytes and read the usage at the end: here
    the ResponseReceived hooks run at the first token, and the first body bytes (ResponseFirstBody hooks)
    arrive at the same instant (plugins that need the first token, such as the latency predictor's
    training, are benchmarked that way)."""

    name = "llm-epp"

    def __init__(
        self,
        num_pods: int,
        config_text: str | None = None,
        scrape_interval: float = DEFAULT_SCRAPE_INTERVAL,
        model: str = SIM_MODEL,
        seed: int = 0,
        *,
        objectives: ObjectivesConfig | None = None,
        recorder: Recorder | None = None,
        registry: Registry | None = None,
        disable_subset_filter: bool = False,
        pod_labels: Sequence[Mapping[str, str]] | None = None,
        flow_observer: FlowControlObserver | None = None,
        token_prompts: bool = False,
        response_headers_at: str = "arrival",
        response_usage: bool = False,
    ) -> None:
        if pod_labels is not None and len(pod_labels) != num_pods:
            raise ValueError(f"pod_labels names {len(pod_labels)} pods, the router has {num_pods}")
        if response_headers_at not in RESPONSE_HEADERS_AT:
            raise ValueError(
                f"response_headers_at {response_headers_at!r}: choose one of {', '.join(RESPONSE_HEADERS_AT)}"
            )
        self._headers_at_arrival = response_headers_at == "arrival"
        self._response_usage = response_usage
        self.scrape_interval = scrape_interval
        self._model = model
        self._token_prompts = token_prompts
        self._clock: Callable[[], float] = lambda: 0.0
        source = seeded_random(seed)
        path = build_request_path(
            recorder=recorder or NullRecorder(),
            config_text=config_text,
            pool_name=SIM_POOL,
            objectives=ObjectivesStore(objectives, rng=source("objectives")),
            disable_subset_filter=disable_subset_filter,
            clock=self.now,
            random_source=source,
            registry=registry,
            flow_observer=flow_observer,
        )
        self.datastore: Datastore = path.datastore
        self.config: LoadedConfig = path.config
        self.director: Director = path.director
        self._keys = [EndpointKey("default", f"sim-pod-{i}") for i in range(num_pods)]
        labels = pod_labels or [{} for _ in range(num_pods)]
        self.datastore.replace_all(
            EndpointMetadata(key, pod_address(i), 8000, labels=dict(labels[i])) for i, key in enumerate(self._keys)
        )
        self._pod_of = {key: i for i, key in enumerate(self._keys)}
        self._client = DirectorClient(self.director)
        self._routed: dict[str, Routed] = {}

    def bind_clock(self, clock: Callable[[], float]) -> None:
        self._clock = clock

    def now(self) -> float:
        """The virtual time plugins see (``handle.now()``)."""
        return self._clock()

    def on_scrape(self, metrics: Sequence[EngineMetrics], now: float) -> None:
        update = self.datastore.update_metrics
        for key, m in zip(self._keys, metrics, strict=True):
            update(key, scraped_metrics(m, now))

    async def route(self, request: RoutedRequest, now: float) -> int:
        prompt = request.prompt
        text: str | list[int] = list(prompt.token_ids) if self._token_prompts else prompt.text
        body = orjson.dumps({"model": self._model, "prompt": text, "max_tokens": prompt.max_tokens})
        headers = {":path": "/v1/completions", "content-type": "application/json", **request.headers}
        try:
            routed = await self._client.route(request.id, headers, body, request.subset)
        except Refused as e:
            raise RoutingError(str(e), e.status) from None
        self._routed[request.id] = routed
        if self._headers_at_arrival:
            self._client.response_started(routed)
        return self._pod_of[routed.endpoint.key]

    def upstream_headers(self, request: RoutedRequest) -> Mapping[str, str]:
        routed = self._routed.get(request.id)
        return routed.upstream_headers if routed is not None else {}

    def on_first_token(self, request: RoutedRequest, pod: int, now: float) -> None:
        if not self._headers_at_arrival:  # response bodies read by the EPP: the first token is seen
            routed = self._routed[request.id]
            self._client.response_started(routed)
            self._client.first_body(routed)

    def on_finish(self, request: RoutedRequest, pod: int, event: RequestEvent, now: float) -> None:
        usage = None
        if self._response_usage:
            usage = Usage(
                prompt_tokens=event.prompt_tokens,
                completion_tokens=event.completion_tokens,
                total_tokens=event.prompt_tokens + event.completion_tokens,
                cached_tokens=event.cached_tokens,
            )
        self._client.finish(self._routed.pop(request.id), 200, usage)

    def on_rejected(self, request: RoutedRequest, pod: int, now: float) -> None:
        self._client.finish(self._routed.pop(request.id), 400)

    def eviction_signal(self, request: RoutedRequest) -> asyncio.Future[None] | None:
        routed = self._routed.get(request.id)
        return routed.eviction if routed is not None else None

    def on_evicted(self, request: RoutedRequest, pod: int, now: float) -> None:
        self._client.finish(self._routed.pop(request.id), 429, complete=False)


ROUTERS = ("round-robin", "random", "least-queue", "locality-bound", "llm-epp")
RESPONSE_HEADERS_AT = ("first-token", "arrival")


def make_router(
    name: str,
    num_pods: int,
    *,
    seed: int = 0,
    config_text: str | None = None,
    scrape_interval: float = DEFAULT_SCRAPE_INTERVAL,
    pod_labels: Sequence[Mapping[str, str]] | None = None,
    response_headers_at: str = "arrival",
    response_usage: bool = False,
) -> Router:
    """A fresh router called ``name`` (one of :data:`ROUTERS`) for ``num_pods`` pods (``pod_labels``: the
    endpoints' labels, for ``llm-epp``; ``response_headers_at`` and ``response_usage``: what ``llm-epp``
    learns of each response, see :class:`EppRouter`)."""
    if name == "round-robin":
        return RoundRobinRouter(num_pods)
    if name == "random":
        return RandomRouter(num_pods, seed)
    if name == "least-queue":
        return LeastQueueRouter(num_pods, seed)
    if name == "locality-bound":
        return LocalityBoundRouter(num_pods)
    if name == "llm-epp":
        return EppRouter(
            num_pods,
            config_text,
            scrape_interval,
            seed=seed,
            pod_labels=pod_labels,
            response_headers_at=response_headers_at,
            response_usage=response_usage,
        )
    raise KeyError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")
