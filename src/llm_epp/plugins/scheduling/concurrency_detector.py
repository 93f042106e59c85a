"""concurrency-detector

Scheduling intent:
    Saturation from the EPP's own in-flight accounting instead of scraped metrics, so it reacts to a
    burst immediately. As the saturation detector it reports total in-flight load over total capacity
    (admission sheds sheddable requests at >= 1.0); as a filter it removes endpoints at their burst
    limit.

Inputs consumed:
    Endpoint.load.requests or Endpoint.load.tokens: reserved by the core director when a request is
    scheduled (tokens: input = max(body bytes / 4, 1) plus 1.5x that for the output) and released when
    it ends. The reference detector tracked this itself via PreRequest/ResponseBody; here it only reads
    the core's counts.

Configuration:
    concurrencyMode ("requests" | "tokens", default "requests"): which count to use.
    maxConcurrency (int > 0, default 100): ideal in-flight requests per endpoint (requests mode).
    maxTokenConcurrency (int > 0, default 1000000): ideal in-flight tokens per endpoint (tokens mode).
    headroom (float >= 0, default 0.0): the filter's burst allowance above the ideal capacity.
    inFlightLoadProducerName (string, default ""): the `inflight-load-producer` whose counts to read. It must
        name a declared `inflight-load-producer` (or be `inflight-load-producer`); other names are refused
        when the configuration loads. llm-epp keeps one in-flight account per endpoint (in the core), which
        every inflight-load-producer stands for.

    saturation(endpoints) = sum of in-flight / (len(endpoints) x capacity); no endpoints gives 1.0.
    filter keeps endpoints with in-flight < int(capacity x (1 + headroom)). As in the reference (v1.5),
    it does not fail open: when every endpoint is at its limit the result is empty and the profile fails.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, PluginParams, TypedName

TYPE = "concurrency-detector"

log = logging.getLogger(__name__)

Mode = Literal["requests", "tokens"]


class Params(PluginParams):
    concurrency_mode: Mode = Field(default="requests", alias="concurrencyMode")
    max_concurrency: int = Field(default=100, gt=0, alias="maxConcurrency")
    max_token_concurrency: int = Field(default=1000000, gt=0, alias="maxTokenConcurrency")
    headroom: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    in_flight_load_producer_name: str = Field(default="", alias="inFlightLoadProducerName")


class ConcurrencyDetector:
    def __init__(
        self,
        name: str = TYPE,
        mode: Mode = "requests",
        max_concurrency: int = 100,
        max_token_concurrency: int = 1000000,
        headroom: float = 0.0,
    ) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.mode = mode
        self.tokens = mode == "tokens"
        self.capacity = max_token_concurrency if self.tokens else max_concurrency
        self.headroom = headroom
        self.limit = int(self.capacity * (1.0 + headroom))

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        if not endpoints:
            return 1.0
        if self.tokens:
            inflight = sum(e.load.tokens for e in endpoints)
        else:
            inflight = sum(e.load.requests for e in endpoints)
        return inflight / (len(endpoints) * self.capacity)

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        limit = self.limit
        if self.tokens:
            return [e for e in endpoints if e.load.tokens < limit]
        return [e for e in endpoints if e.load.requests < limit]


def factory(name: str, params: Params, handle: Handle) -> ConcurrencyDetector:
    if params.headroom > 1.0:
        log.warning(
            "concurrency_detector_high_headroom plugin=%s headroom=%s: headroom is a fraction (0.2 = 20%%)",
            name,
            params.headroom,
        )
    return ConcurrencyDetector(
        name, params.concurrency_mode, params.max_concurrency, params.max_token_concurrency, params.headroom
    )
