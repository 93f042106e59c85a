"""program-aware-fairness

Scheduling intent:
    Fairness between programs (agentic workflows, tenants) by the service they have received rather
    than by turns: the flow whose program has consumed the fewest tokens recently goes next (Least
    Attained Service), with the age of its oldest waiting request as a tiebreaker. A program issuing a
    few large requests and one issuing many small ones share the pool by cost; a program that was idle
    comes back on near-equal footing because attained service decays.

Inputs consumed:
    The program id: the request's fairness id (`x-llm-d-inference-fairness-id`, default `default-flow`).
    Token usage of finished requests (ResponseComplete: prompt tokens count 1, completion tokens 2).
    The enqueue time of each flow's head request.

Configuration:
    strategy ("las", default): the scoring strategy; only least attained service exists.
    lasWeightService (float >= 0, default 0.8): weight of the inverted, range-normalised attained service.
    lasWeightHeadWait (float >= 0, default 0.2): weight of the range-normalised head-of-queue age.
    lasHalfLifeSeconds (float >= 0, default 60): half-life of attained service; 0 never decays.
    evictionTtlSeconds (float >= 0, default 3600): a program without a completion for this long is
        forgotten (0: never); at most 10000 programs are kept, the least recently completed go first.
    evictionSweepSeconds (float > 0, default 300): how often forgetting is checked.
    The reference's per-program Prometheus series (program_aware_*) are not exported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, PluginParams, TypedName
from llm_epp.framework.flowpolicy import BandView, FlowQueueView
from llm_epp.framework.requestcontrol import ResponseInfo

TYPE = "program-aware-fairness"
INPUT_TOKEN_WEIGHT = 1
OUTPUT_TOKEN_WEIGHT = 2
MAX_PROGRAMS = 10_000


class Params(PluginParams):
    strategy: Literal["las"] = "las"
    eviction_ttl_seconds: float = Field(default=3600.0, ge=0.0, alias="evictionTtlSeconds", allow_inf_nan=False)
    eviction_sweep_seconds: float = Field(default=300.0, gt=0.0, alias="evictionSweepSeconds", allow_inf_nan=False)
    las_weight_service: float = Field(default=0.8, ge=0.0, alias="lasWeightService", allow_inf_nan=False)
    las_weight_head_wait: float = Field(default=0.2, ge=0.0, alias="lasWeightHeadWait", allow_inf_nan=False)
    las_half_life_seconds: float = Field(default=60.0, ge=0.0, alias="lasHalfLifeSeconds", allow_inf_nan=False)


@dataclass
class _Program:
    service: float = 0.0
    anchor: float = 0.0
    last_completion: float = 0.0


def _normalize(v: float, lo: float, hi: float) -> float:
    return 0.5 if hi == lo else (v - lo) / (hi - lo)


class ProgramAwareFairness:
    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.params = params
        self._now = handle.now
        self.programs: dict[str, _Program] = {}
        self._next_sweep = 0.0

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def new_state(self) -> object:
        return None

    def service(self, program_id: str, now: float | None = None) -> float:
        """The program's attained service, decayed to now (0 for a program not seen)."""
        program = self.programs.get(program_id)
        if program is None:
            return 0.0
        self._decay(program, self._now() if now is None else now)
        return program.service

    def _decay(self, program: _Program, now: float) -> None:
        elapsed = now - program.anchor
        if elapsed > 0 and self.params.las_half_life_seconds > 0:
            program.service *= math.exp2(-elapsed / self.params.las_half_life_seconds)
        if elapsed > 0:
            program.anchor = now

    def pick_flow(self, band: BandView) -> FlowQueueView | None:
        now = self._now()
        entries: list[tuple[FlowQueueView, float, float]] = []
        for queue in band.queues():
            head = queue.peek()
            if head is None:
                continue
            entries.append((queue, self.service(queue.key.id, now), head.enqueued_at))
        if not entries:
            return None
        services = [e[1] for e in entries]
        enqueued = [e[2] for e in entries]
        s_lo, s_hi = min(services), max(services)
        e_lo, e_hi = min(enqueued), max(enqueued)
        best, best_score = None, -math.inf
        p = self.params
        for queue, service, at in entries:
            # the head that waited longest (earliest enqueue) gets the highest wait signal
            wait = 1.0 - _normalize(at, e_lo, e_hi) if e_hi != e_lo else 0.5
            score = p.las_weight_service * (1.0 - _normalize(service, s_lo, s_hi)) + p.las_weight_head_wait * wait
            if score > best_score:
                best, best_score = queue, score
        return best

    def response_complete(
        self, cycle: CycleState, request: InferenceRequest, response: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        if not response.complete:
            return
        now = self._now()
        usage = response.usage
        cost = 0.0
        if usage is not None:
            cost = float(INPUT_TOKEN_WEIGHT * usage.prompt_tokens + OUTPUT_TOKEN_WEIGHT * usage.completion_tokens)
        program = self.programs.get(request.fairness_id)
        if program is None:
            program = self.programs[request.fairness_id] = _Program(anchor=now)
        self._decay(program, now)
        program.service += cost
        program.last_completion = now
        self._sweep(now)

    def _sweep(self, now: float) -> None:
        ttl = self.params.eviction_ttl_seconds
        if ttl > 0 and now >= self._next_sweep:
            self._next_sweep = now + self.params.eviction_sweep_seconds
            for pid in [pid for pid, prog in self.programs.items() if now - prog.last_completion > ttl]:
                del self.programs[pid]
        if len(self.programs) > MAX_PROGRAMS:
            by_age = sorted(self.programs, key=lambda pid: self.programs[pid].last_completion)
            for pid in by_age[: len(self.programs) - MAX_PROGRAMS]:
                del self.programs[pid]


def factory(name: str, params: Params, handle: Handle) -> ProgramAwareFairness:
    return ProgramAwareFairness(name, params, handle)
