"""header-label-affinity-scorer

Scheduling intent:
    A soft preference for endpoints whose label equals a request header, e.g. the zone or the
    DisaggregatedSet slice an earlier stage picked: a matching endpoint scores 1, every other 0 (and
    stays eligible). Use one instance per header-to-label mapping so each gets its own weight.

Inputs consumed:
    The request header `headerName`; EndpointMetadata.labels[`labelKey`]. A missing or empty header, or a
    missing label, scores 0 everywhere.

Configuration:
    headerName (string, required): the request header holding the preferred label value (matched
        case-insensitively).
    labelKey (string, required): the endpoint label compared with the header value.
"""

from __future__ import annotations

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

TYPE = "header-label-affinity-scorer"


class Params(PluginParams):
    header_name: str = Field(alias="headerName", min_length=1)
    label_key: str = Field(alias="labelKey", min_length=1)


class HeaderLabelAffinityScorer:
    category = ScorerCategory.AFFINITY

    def __init__(self, name: str, params: Params) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.header = params.header_name.lower()
        self.label = params.label_key

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        wanted = request.headers.get(self.header, "")
        if not wanted:
            return dict.fromkeys((e.key for e in endpoints), 0.0)
        label = self.label
        return {e.key: 1.0 if e.metadata.labels.get(label) == wanted else 0.0 for e in endpoints}


def factory(name: str, params: Params, handle: Handle) -> HeaderLabelAffinityScorer:
    return HeaderLabelAffinityScorer(name, params)
