"""Tiny builders for unit tests: endpoints, requests, scored candidates, a recording fake Recorder and a
fake plugin Handle. Everything here is plain data; no event loop, no I/O."""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llm_epp.framework import (
    ApiKind,
    CycleState,
    Endpoint,
    EndpointKey,
    EndpointMetadata,
    InferenceRequest,
    Metrics,
    Plugin,
    ProfileResult,
    RequestBody,
    ScoredEndpoint,
    ScorerCategory,
    TypedName,
)

NAMESPACE = "default"


def key(name: str, namespace: str = NAMESPACE) -> EndpointKey:
    return EndpointKey(namespace, name)


def endpoint(
    name: str = "a",
    queue: int = 0,
    kv: float = 0.0,
    running: int = 0,
    address: str = "10.0.0.1",
    port: int = 8000,
    updated: float = 1.0,
    namespace: str = NAMESPACE,
    labels: Mapping[str, str] | None = None,
    attributes: Mapping[str, Any] | None = None,
) -> Endpoint:
    """An endpoint with the given metrics: `endpoint("b", queue=5, kv=0.3)`."""
    metadata = EndpointMetadata(key(name, namespace), address, port, labels=dict(labels or {}))
    metrics = Metrics(waiting_queue_size=queue, running_requests=running, kv_cache_usage=kv, update_time=updated)
    return Endpoint(metadata, metrics, attributes=dict(attributes or {}))


def endpoints(*names: str) -> list[Endpoint]:
    """Endpoints with distinct names and addresses (10.0.0.1, 10.0.0.2, ...)."""
    return [endpoint(n, address=f"10.0.0.{i}") for i, n in enumerate(names, start=1)]


def request(
    model: str = "m",
    headers: Mapping[str, str] | None = None,
    target_model: str | None = None,
    request_id: str = "req-1",
    api: ApiKind = ApiKind.CHAT_COMPLETIONS,
    payload: Mapping[str, Any] | None = None,
    stream: bool = False,
    priority: int = 0,
) -> InferenceRequest:
    body = RequestBody(api, dict(payload or {"model": model}), stream=stream)
    return InferenceRequest(
        request_id=request_id,
        incoming_model=model,
        target_model=target_model if target_model is not None else model,
        body=body,
        headers=dict(headers or {}),
        priority=priority,
    )


def scored(*pairs: tuple[str, float]) -> list[ScoredEndpoint]:
    """`scored(("a", 0.5), ("b", 1.0))`: candidates with distinct addresses and the given scores."""
    return [ScoredEndpoint(endpoint(n, address=f"10.0.0.{i}"), s) for i, (n, s) in enumerate(pairs, start=1)]


def names(eps: Sequence[Endpoint]) -> list[str]:
    return [e.key.name for e in eps]


@dataclass
class FakeRecorder:
    """Implements every method of `llm_epp.framework.recorder.Recorder` by appending the call's arguments
    to a list named after the method (`plugin_errors`, `out_of_range`, ...)."""

    plugin_durations: list[tuple[str, TypedName, float]] = field(default_factory=list)
    rewrites: list[tuple[str, str, str]] = field(default_factory=list)
    prefix_sizes: list[int] = field(default_factory=list)
    prefix_matches: list[tuple[float, int]] = field(default_factory=list)
    plugin_errors: list[tuple[str, TypedName]] = field(default_factory=list)
    scheduler_durations: list[float] = field(default_factory=list)
    out_of_range: list[TypedName] = field(default_factory=list)
    attempts: list[tuple[bool, str, str, str, str]] = field(default_factory=list)
    scheduled: list[tuple[str, str, int]] = field(default_factory=list)
    request_errors: list[tuple[str, str, str]] = field(default_factory=list)
    running: list[tuple[str, int]] = field(default_factory=list)
    completed: list[tuple[Any, ...]] = field(default_factory=list)
    disagg_decisions: list[tuple[TypedName, str, str]] = field(default_factory=list)
    pd_decisions: list[tuple[TypedName, str, str]] = field(default_factory=list)
    strict_no_match: list[tuple[TypedName, str]] = field(default_factory=list)
    revision_shares: list[tuple[TypedName, str, dict[str, float]]] = field(default_factory=list)

    def disagg_decision(self, plugin: TypedName, model: str, decision_type: str) -> None:
        self.disagg_decisions.append((plugin, model, decision_type))

    def pd_decision(self, plugin: TypedName, model: str, decision_type: str) -> None:
        self.pd_decisions.append((plugin, model, decision_type))

    def rollout_strict_no_match(self, plugin: TypedName, selector: str) -> None:
        self.strict_no_match.append((plugin, selector))

    def rollout_revision_shares(self, plugin: TypedName, mode: str, shares: Mapping[str, float]) -> None:
        self.revision_shares.append((plugin, mode, dict(shares)))

    def plugin_duration(self, extension_point: str, plugin: TypedName, seconds: float) -> None:
        self.plugin_durations.append((extension_point, plugin, seconds))

    def plugin_error(self, extension_point: str, plugin: TypedName) -> None:
        self.plugin_errors.append((extension_point, plugin))

    def scheduler_duration(self, seconds: float) -> None:
        self.scheduler_durations.append(seconds)

    def score_out_of_range(self, plugin: TypedName) -> None:
        self.out_of_range.append(plugin)

    def scheduler_attempt(self, success: bool, target_model: str, pod_name: str, namespace: str, port: str) -> None:
        self.attempts.append((success, target_model, pod_name, namespace, port))

    def request_scheduled(self, model: str, target_model: str, priority: int) -> None:
        self.scheduled.append((model, target_model, priority))

    def request_error(self, model: str, target_model: str, error_code: str) -> None:
        self.request_errors.append((model, target_model, error_code))

    def running_requests(self, model: str, delta: int) -> None:
        self.running.append((model, delta))

    def request_completed(
        self,
        model: str,
        target_model: str,
        duration_s: float,
        request_bytes: int,
        response_bytes: int,
        prompt_tokens: int | None,
        completion_tokens: int | None,
        cached_tokens: int | None,
    ) -> None:
        self.completed.append(
            (
                model,
                target_model,
                duration_s,
                request_bytes,
                response_bytes,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
            )
        )

    def model_rewrite(self, rule: str, model: str, target_model: str) -> None:
        self.rewrites.append((rule, model, target_model))

    def prefix_index_size(self, entries: int) -> None:
        self.prefix_sizes.append(entries)

    def prefix_match(self, hit_ratio: float, hit_chars: int) -> None:
        self.prefix_matches.append((hit_ratio, hit_chars))

    def durations_for(self, extension_point: str) -> list[str]:
        """Names of the plugins timed at `extension_point`, in call order."""
        return [tn.name for ep, tn, _ in self.plugin_durations if ep == extension_point]


@dataclass
class FakeHandle:
    """A plugin Handle with fixed plugins and endpoints and a settable clock."""

    plugins: dict[str, Plugin] = field(default_factory=dict)
    pool: list[Endpoint] = field(default_factory=list)
    clock: float = 0.0

    def plugin(self, name: str) -> Plugin | None:
        return self.plugins.get(name)

    def endpoints(self) -> Sequence[Endpoint]:
        return tuple(self.pool)

    @property
    def recorder(self) -> FakeRecorder:
        return self._recorder

    def __post_init__(self) -> None:
        self._recorder = FakeRecorder()

    def now(self) -> float:
        return self.clock

    def rng(self, name: str) -> random.Random:
        return random.Random(name)


class FakeFilter:
    """Keeps the endpoints whose names are in `keep` (all when None), or raises `error`. Records the names
    it was given, one list per call."""

    def __init__(
        self, name: str = "f", keep: Collection[str] | None = None, error: BaseException | None = None
    ) -> None:
        self.typed_name = TypedName("fake-filter", name)
        self.keep = keep
        self.error = error
        self.calls: list[list[str]] = []

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        self.calls.append(names(endpoints))
        if self.error is not None:
            raise self.error
        return [e for e in endpoints if self.keep is None or e.key.name in self.keep]


class FakeScorer:
    """Returns `scores` (endpoint name -> value, whatever the candidates are), or raises `error`."""

    category = ScorerCategory.DISTRIBUTION

    def __init__(
        self, name: str = "s", scores: Mapping[str, Any] | None = None, error: BaseException | None = None
    ) -> None:
        self.typed_name = TypedName("fake-scorer", name)
        self.scores = dict(scores or {})
        self.error = error
        self.calls: list[list[str]] = []

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        self.calls.append(names(endpoints))
        if self.error is not None:
            raise self.error
        return {key(n): v for n, v in self.scores.items()}


class FakePicker:
    """Returns `result` when given, else the highest score (first on ties); or raises `error`. Records the
    (name, score) pairs it was given, one list per call."""

    def __init__(
        self, name: str = "p", result: ProfileResult | None = None, error: BaseException | None = None
    ) -> None:
        self.typed_name = TypedName("fake-picker", name)
        self.result = result
        self.error = error
        self.calls: list[list[tuple[str, float]]] = []

    def pick(self, cycle: CycleState, scored: Sequence[ScoredEndpoint]) -> ProfileResult:
        self.calls.append([(s.endpoint.key.name, s.score) for s in scored])
        if self.error is not None:
            raise self.error
        if self.result is not None:
            return self.result
        best = max(scored, key=lambda s: s.score)
        return ProfileResult((best.endpoint,))
