"""Scheduling extension points. Every method is a plain synchronous `def` over an immutable snapshot:
no I/O, no awaits, no locks. A profile costs one Python call per plugin, not one per endpoint."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from llm_epp.framework.plugin import TypedName
from llm_epp.framework.state import CycleState
from llm_epp.framework.types import (
    Endpoint,
    EndpointKey,
    InferenceRequest,
    ProfileResult,
    SchedulingResult,
    ScoredEndpoint,
)


class ScorerCategory(enum.Enum):
    AFFINITY = "Affinity"
    DISTRIBUTION = "Distribution"
    BALANCE = "Balance"


@runtime_checkable
class Filter(Protocol):
    """Returns the endpoints that may serve the request (a subset of `endpoints`, order kept)."""

    @property
    def typed_name(self) -> TypedName: ...

    def filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]: ...


@runtime_checkable
class Scorer(Protocol):
    """Scores endpoints in [0, 1], higher is better. Missing keys count as 0; the core clamps values
    outside [0, 1] (and NaN to 0) and counts them."""

    @property
    def typed_name(self) -> TypedName: ...

    @property
    def category(self) -> ScorerCategory: ...

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]: ...


@runtime_checkable
class Picker(Protocol):
    """Chooses the target endpoints, in order of preference, from the scored candidates."""

    @property
    def typed_name(self) -> TypedName: ...

    def pick(self, cycle: CycleState, scored: Sequence[ScoredEndpoint]) -> ProfileResult: ...


class ProfileView(Protocol):
    """What a profile handler sees of a scheduling profile."""

    @property
    def name(self) -> str: ...


@runtime_checkable
class ProfileHandler(Protocol):
    """Decides which profiles run (called until it returns none) and turns their results into one."""

    @property
    def typed_name(self) -> TypedName: ...

    def pick_profiles(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, ProfileView],
        results: Mapping[str, ProfileResult | None],
    ) -> Mapping[str, ProfileView]: ...

    def process_results(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        results: Mapping[str, ProfileResult | None],
    ) -> SchedulingResult: ...
