"""One scheduling profile: filters narrow the candidates, weighted scorers rank them, a picker chooses.

Plugin failures are isolated: a failing filter passes its input through, a failing scorer adds nothing,
a failing picker falls back to a random candidate. Each is logged and counted via the Recorder."""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import add, mul

from llm_epp.framework import (
    CycleState,
    Endpoint,
    EndpointKey,
    Filter,
    InferenceRequest,
    Picker,
    ProfileResult,
    Recorder,
    ScoredEndpoint,
    Scorer,
)

log = logging.getLogger(__name__)

_perf = time.perf_counter

TOTAL = "total"  # the key of the summed score in a ProfileResult's breakdown; no plugin may use the name


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float = 1.0


class SchedulerProfile:
    def __init__(
        self,
        name: str,
        filters: Sequence[Filter],
        scorers: Sequence[WeightedScorer],
        picker: Picker,
        recorder: Recorder,
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self.filters = tuple(filters)
        self.scorers = tuple(scorers)
        if any(ws.scorer.typed_name.name == TOTAL for ws in self.scorers):
            raise ValueError(f"a scorer may not be named {TOTAL!r}: the name is reserved for the summed score")
        self.picker = picker
        self._recorder = recorder
        self._rng = rng or random.Random()

    def run(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> ProfileResult | None:
        """Returns None when the filters leave no endpoint."""
        candidates = self._filter(cycle, request, endpoints)
        if not candidates:
            return None
        scored, breakdown = self._score(cycle, request, candidates)
        return self._pick(cycle, scored, breakdown)

    def _filter(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Sequence[Endpoint]:
        rec = self._recorder
        for f in self.filters:
            start = _perf()
            try:
                endpoints = f.filter(cycle, request, endpoints)
            except Exception:
                log.exception("filter_failed plugin=%s", f.typed_name)
                rec.plugin_error("Filter", f.typed_name)
            rec.plugin_duration("Filter", f.typed_name, _perf() - start)
            if not endpoints:
                return endpoints
        return endpoints

    def _score(
        self, cycle: CycleState, request: InferenceRequest, candidates: Sequence[Endpoint]
    ) -> tuple[list[ScoredEndpoint], ScoreBreakdown]:
        rec = self._recorder
        keys = [e.key for e in candidates]
        # Running totals in candidate order; each scorer adds score x weight in C (map over dict.get), not
        # through a comprehension per scorer. Candidates sharing a key get the same (identical) total.
        sums = [0.0] * len(keys)
        no_score = repeat(0.0)
        parts: list[tuple[str, float, Mapping[EndpointKey, float]]] = []
        for ws in self.scorers:
            scorer = ws.scorer
            start = _perf()
            try:
                scores = scorer.score(cycle, request, candidates)
                if type(scores) is not dict and not isinstance(scores, Mapping):  # a dict skips the ABC check
                    raise TypeError(f"score() returned {type(scores).__name__}, not a mapping")
            except Exception:
                log.exception("scorer_failed plugin=%s", scorer.typed_name)
                rec.plugin_error("Scorer", scorer.typed_name)
                scores = {}
            rec.plugin_duration("Scorer", scorer.typed_name, _perf() - start)
            if not _all_in_range(scores):
                scores = self._clamped(scorer, scores)
            weight = ws.weight
            sums = list(map(add, sums, map(mul, map(scores.get, keys, no_score), repeat(weight))))
            parts.append((scorer.typed_name.name, weight, scores))
        totals = dict(zip(keys, sums, strict=True))
        return list(map(ScoredEndpoint, candidates, sums)), ScoreBreakdown(totals, parts)

    def _clamped(self, scorer: Scorer, scores: Mapping[EndpointKey, float]) -> dict[EndpointKey, float]:
        out = {}
        for key, value in scores.items():
            clamped = _clamp(value)
            if clamped != value or not isinstance(value, (int, float)):
                self._recorder.score_out_of_range(scorer.typed_name)
            out[key] = clamped
        return out

    def _pick(
        self,
        cycle: CycleState,
        scored: list[ScoredEndpoint],
        breakdown: ScoreBreakdown,
    ) -> ProfileResult:
        rec = self._recorder
        start = _perf()
        try:
            result = self.picker.pick(cycle, scored)
            if not isinstance(result, ProfileResult):
                raise TypeError(f"pick() returned {type(result).__name__}, not a ProfileResult")
        except Exception:
            log.exception("picker_failed plugin=%s", self.picker.typed_name)
            rec.plugin_error("Picker", self.picker.typed_name)
            result = ProfileResult((self._rng.choice(scored).endpoint,))
        rec.plugin_duration("Picker", self.picker.typed_name, _perf() - start)
        if not result.target_endpoints:
            return result
        return ProfileResult(result.target_endpoints, breakdown)


class ScoreBreakdown(Mapping[EndpointKey, Mapping[str, float]]):
    """Per endpoint: each scorer's weighted score by scorer name, and the sum under "total". Built lazily
    from the scorers' outputs, so a decision nobody explains costs nothing extra."""

    __slots__ = ("_parts", "_totals")

    def __init__(
        self, totals: dict[EndpointKey, float], parts: list[tuple[str, float, Mapping[EndpointKey, float]]]
    ) -> None:
        self._totals = totals
        self._parts = parts

    def __getitem__(self, key: EndpointKey) -> Mapping[str, float]:
        total = self._totals[key]
        out: dict[str, float] = {}
        for name, weight, scores in self._parts:
            out[name] = out.get(name, 0.0) + scores.get(key, 0.0) * weight
        out[TOTAL] = total
        return out

    def __iter__(self) -> Iterator[EndpointKey]:
        return iter(self._totals)

    def __len__(self) -> int:
        return len(self._totals)


def _all_in_range(scores: Mapping[EndpointKey, float]) -> bool:
    """True when every score is a number in [0, 1] (NaN, and anything that does not compare with floats,
    is not)."""
    try:
        for value in scores.values():
            if not 0.0 <= value <= 1.0:
                return False
    except (TypeError, ValueError, ArithmeticError):  # not numbers: take the slow path
        return False
    return True


def _clamp(value: float) -> float:
    if not isinstance(value, (int, float)) or math.isnan(value):
        return 0.0
    if value < 0.0:
        return 0.0
    if value > 1.0:
        return 1.0
    return float(value)
