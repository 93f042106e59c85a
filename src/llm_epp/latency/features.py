"""What the predictor sees of one (request, endpoint) pair, and the model inputs derived from it.

The raw features are the ones the reference latency predictor uses: KV-cache utilization, waiting and
running requests, input length, the prefix-cache match, the tokens in flight and the prefill tokens in
flight (uncached prompt tokens sent and not yet answered with a first token). TTFT and TPOT models
each get a feature vector with a few products of these, so a linear model can express that prefill cost
grows with the uncached part of the prompt and with the work queued ahead of it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Features:
    kv_cache: float  # KV-cache utilization, 0..1
    input_tokens: int  # estimated prompt length in tokens
    waiting: int  # requests queued on the model server
    running: int  # requests running on the model server
    prefix_score: float = 0.0  # fraction of the prompt's blocks already cached there, 0..1
    tokens_in_flight: int = 0  # tokens this EPP has sent to the endpoint and not yet seen finish
    dispatched: int = 0  # requests this EPP has sent to the endpoint and not yet seen finish
    # uncached prompt tokens this EPP has sent to the endpoint whose first token has not come back yet: the
    # prefill work queued ahead of a new request (the reference's prefill tokens in flight)
    prefill_tokens: int = 0

    @property
    def uncached_tokens(self) -> float:
        return (1.0 - min(max(self.prefix_score, 0.0), 1.0)) * self.input_tokens


TTFT_FEATURES = (
    "kv_cache",
    "input_tokens",
    "waiting",
    "running",
    "prefix_score",
    "tokens_in_flight_k",
    "uncached_tokens",
    "waiting_x_uncached",
    "dispatched_x_uncached",
    "running_x_kv",
    "kv_x_uncached",
    "prefill_tokens_k",
)
TPOT_FEATURES = (
    "kv_cache",
    "input_tokens",
    "waiting",
    "running",
    "tokens_in_flight_k",
    "running_x_kv",
    "running_sq",
)
LINEAR_TTFT_FEATURES = TTFT_FEATURES[:6]
LINEAR_TPOT_FEATURES = TPOT_FEATURES[:5]


def ttft_vector(f: Features, linear: bool = False) -> list[float]:
    """Inputs of the TTFT model (the first six only with `linear`)."""
    uncached = f.uncached_tokens
    base = [
        f.kv_cache,
        float(f.input_tokens),
        float(f.waiting),
        float(f.running),
        f.prefix_score,
        f.tokens_in_flight / 1000.0,
    ]
    if linear:
        return base
    return [
        *base,
        uncached,
        f.waiting * uncached,
        f.dispatched * uncached,
        f.running * f.kv_cache,
        f.kv_cache * uncached,
        f.prefill_tokens / 1000.0,
    ]


def tpot_vector(f: Features, linear: bool = False) -> list[float]:
    """Inputs of the TPOT model (the first five only with `linear`)."""
    base = [f.kv_cache, float(f.input_tokens), float(f.waiting), float(f.running), f.tokens_in_flight / 1000.0]
    if linear:
        return base
    return [*base, f.running * f.kv_cache, float(f.running * f.running)]
