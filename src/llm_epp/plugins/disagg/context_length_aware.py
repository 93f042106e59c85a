"""context-length-aware

Scheduling intent:
    Send requests to the endpoints built for their context length (e.g. separate pools for short and
    long prompts). An endpoint declares its range with a label `min-max` in tokens (e.g. `0-8192`).
    The request's length is its token ids when the body carries them, else prompt characters / 4.

    Scorer: an endpoint without the label scores 0.5; a malformed label scores 0. In range:
    0.3 + 0.7 x (0.7 x 1 / (1 + width / 10000) + 0.3 x (max - length) / width) (1.0 for a zero-width
    range), so narrower ranges and more headroom score higher. Out of range: 0.3 / (1 + distance / 1000),
    distance being how far the length is outside the range.
    Filter (when `enableFiltering`): keep endpoints without the label and those whose range contains the
    length; drop malformed labels. Without `enableFiltering` the filter keeps everything.

Inputs consumed:
    EndpointMetadata.labels; InferenceRequest.body (token_ids, payload).

Configuration:
    label (string, default "llm-d.ai/context-length-range"): the label holding the range; must not be
        empty.
    enableFiltering (bool, default false): also act as a filter (use it in a profile's filter position).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from pydantic import Field

from llm_epp.framework import (
    CycleState,
    Endpoint,
    EndpointKey,
    Handle,
    InferenceRequest,
    PluginParams,
    ScorerCategory,
    TypedName,
)
from llm_epp.plugins.disagg.common import prompt_tokens

TYPE = "context-length-aware"
DEFAULT_LABEL = "llm-d.ai/context-length-range"
MAX_FALLBACK_SCORE = 0.3

log = logging.getLogger(__name__)


class Params(PluginParams):
    label: str = Field(default=DEFAULT_LABEL, min_length=1)
    enable_filtering: bool = Field(default=False, alias="enableFiltering")


def parse_range(value: str) -> tuple[int, int] | None:
    """`min-max` -> (min, max); None when malformed (not two integers, or min > max)."""
    bounds = value.split("-")
    if len(bounds) != 2:
        return None
    try:
        low, high = int(bounds[0].strip()), int(bounds[1].strip())
    except ValueError:
        return None
    if low > high:
        return None
    return low, high


def range_score(length: int, low: int, high: int) -> float:
    if low <= length <= high:
        width = high - low
        if width == 0:
            return 1.0
        width_score = 1.0 / (1.0 + width / 10000.0)
        position_score = (high - length) / width
        return MAX_FALLBACK_SCORE + (0.7 * width_score + 0.3 * position_score) * (1.0 - MAX_FALLBACK_SCORE)
    distance = length - high if length > high else low - length
    return MAX_FALLBACK_SCORE / (1.0 + distance / 1000.0)


class ContextLengthAware:
    def __init__(self, name: str = TYPE, label: str = DEFAULT_LABEL, enable_filtering: bool = False) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.label = label
        self.enable_filtering = enable_filtering

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    @property
    def category(self) -> ScorerCategory:
        return ScorerCategory.AFFINITY

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        if not self.enable_filtering:
            return endpoints
        length = prompt_tokens(request)
        out = []
        for e in endpoints:
            value = e.metadata.labels.get(self.label)
            if value is None:
                out.append(e)
                continue
            bounds = parse_range(value)
            if bounds is None:
                log.debug("context_length_range_malformed endpoint=%s value=%r", e.key, value)
                continue
            if bounds[0] <= length <= bounds[1]:
                out.append(e)
        return out

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        length = prompt_tokens(request)
        scores: dict[EndpointKey, float] = {}
        for e in endpoints:
            value = e.metadata.labels.get(self.label)
            if value is None:
                scores[e.key] = 0.5
                continue
            bounds = parse_range(value)
            scores[e.key] = 0.0 if bounds is None else range_score(length, *bounds)
        return scores


def factory(name: str, params: Params, handle: Handle) -> ContextLengthAware:
    return ContextLengthAware(name, params.label, params.enable_filtering)
