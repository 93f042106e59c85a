"""by-label-selector

Scheduling intent:
    Deprecated llm-d name of `label-selector-filter` (kept so existing configurations load): keep only
    the endpoints whose labels match a Kubernetes label selector.

Inputs consumed:
    EndpointMetadata.labels.

Configuration:
    The same as `label-selector-filter`: matchLabels (map, AND) and matchExpressions (In, NotIn, Exists,
    DoesNotExist). Prefer `label-selector-filter` in new configurations.
"""

from __future__ import annotations

from llm_epp.framework import Handle
from llm_epp.plugins.scheduling import label_selector_filter

TYPE = "by-label-selector"

Params = label_selector_filter.Params


class ByLabelSelector(label_selector_filter.LabelSelectorFilter):
    @classmethod
    def plugin_type(cls) -> str:
        return TYPE


def factory(name: str, params: Params, handle: Handle) -> ByLabelSelector:
    return ByLabelSelector(name, params.match_labels, params.match_expressions)
