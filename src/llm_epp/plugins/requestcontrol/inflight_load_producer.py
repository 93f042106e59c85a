"""inflight-load-producer

Scheduling intent:
    Accepted for configuration compatibility only. In the reference EPP this plugin counts, per endpoint,
    the requests and estimated tokens in flight (PrepareData publishes the counts, PreRequest reserves,
    the end of the response releases) for `token-load-scorer`, `active-request-scorer` and the
    concurrency detector. In llm-epp the core director does that accounting for every request, whether
    or not this plugin is configured, and exposes it as `Endpoint.load`. So this plugin implements no
    extension point and costs nothing per request; configurations that list it (e.g. llm-d's
    optimized-baseline) load unchanged.

Inputs consumed:
    None. (The core's accounting, for reference: +1 request and +estimated tokens on the primary
    endpoint when a request is scheduled, released exactly once when it completes, fails or is
    cancelled; tokens = input + round(1.5 x input), input = max(request body bytes / 4, 1).)

Configuration:
    No parameters (the reference takes none either).
"""

from __future__ import annotations

from llm_epp.framework import Handle, PluginParams, TypedName

TYPE = "inflight-load-producer"
COMPATIBILITY_ONLY = True  # accepted in configurations; the core director does the accounting


class Params(PluginParams):
    pass


class InflightLoadProducer:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name


def factory(name: str, params: Params, handle: Handle) -> InflightLoadProducer:
    return InflightLoadProducer(name)
