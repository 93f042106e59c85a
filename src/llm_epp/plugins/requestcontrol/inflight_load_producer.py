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
    The reference's parameters are accepted where they describe what the core does, and refused with
    "not supported yet" otherwise:
    addEstimatedOutputTokens (bool): the core always adds the estimated output, so `true` (or leaving it
        out) is accepted and `false` (count input tokens only; the default of llm-d-router HEAD) is not.
    outputRatio (float >= 0): only 1.5, the core's ratio, is accepted.
    maxEstimatedOutputTokens (int >= 0): a cap is not supported yet.
    prefixMatchInfoProducerName (string): discounting cached prefix tokens is not supported yet; only ""
        is accepted.
    syncCrossReplicaState (bool): in-flight load stays local to each replica (there is no cross-replica
        sync), so `false` (or leaving it out) is accepted and `true` is not.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from llm_epp.framework import Handle, PluginParams, TypedName

TYPE = "inflight-load-producer"
COMPATIBILITY_ONLY = True  # accepted in configurations; the core director does the accounting


CORE_OUTPUT_RATIO = 1.5


class Params(PluginParams):
    add_estimated_output_tokens: bool | None = Field(default=None, alias="addEstimatedOutputTokens")
    output_ratio: float | None = Field(default=None, ge=0.0, alias="outputRatio")
    max_estimated_output_tokens: int | None = Field(default=None, ge=0, alias="maxEstimatedOutputTokens")
    prefix_match_info_producer_name: str = Field(default="", alias="prefixMatchInfoProducerName")
    sync_cross_replica_state: bool | None = Field(default=None, alias="syncCrossReplicaState")

    @model_validator(mode="after")
    def _core_accounting(self) -> Params:
        problems = []
        if self.add_estimated_output_tokens is False:
            problems.append(
                "addEstimatedOutputTokens: false is not supported yet: llm-epp's in-flight token count always "
                f"adds the estimated output ({CORE_OUTPUT_RATIO} x input tokens)"
            )
        if self.output_ratio is not None and self.output_ratio != CORE_OUTPUT_RATIO:
            problems.append(
                f"outputRatio {self.output_ratio} is not supported yet: the in-flight output estimate is "
                f"{CORE_OUTPUT_RATIO} x input tokens"
            )
        if self.max_estimated_output_tokens is not None:
            problems.append("maxEstimatedOutputTokens is not supported yet: the output estimate is not capped")
        if self.prefix_match_info_producer_name:
            problems.append(
                "prefixMatchInfoProducerName is not supported yet: in-flight tokens are not discounted by "
                "cached prefixes"
            )
        if self.sync_cross_replica_state:
            problems.append(
                "syncCrossReplicaState: true is not supported yet: llm-epp keeps in-flight load per replica "
                "(set it to false or leave it out)"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


class InflightLoadProducer:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name


def factory(name: str, params: Params, handle: Handle) -> InflightLoadProducer:
    return InflightLoadProducer(name)
