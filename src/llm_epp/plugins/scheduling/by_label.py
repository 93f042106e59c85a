"""by-label

Scheduling intent:
    Deprecated llm-d filter (use `label-selector-filter`): keep the endpoints whose value for one label
    is among the valid values, optionally also those without the label.

Inputs consumed:
    EndpointMetadata.labels.

Configuration:
    label (string, default ""): the label key to check.
    validValues (list of strings, default []): the accepted values.
    allowsNoLabel (bool, default false): also keep endpoints that do not have the label.
    As in llm-d, a missing label reads as the empty string, so listing "" in validValues also keeps
    endpoints without the label. Nothing passing gives an empty result (no fail-open).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from pydantic import Field

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, PluginParams, TypedName

TYPE = "by-label"

log = logging.getLogger(__name__)


class Params(PluginParams):
    label: str = ""
    valid_values: tuple[str, ...] = Field(default=(), alias="validValues")
    allows_no_label: bool = Field(default=False, alias="allowsNoLabel")


class ByLabel:
    def __init__(
        self, name: str = TYPE, label: str = "", valid_values: Iterable[str] = (), allows_no_label: bool = False
    ) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.label = label
        self.valid_values = frozenset(valid_values)
        self.allows_no_label = allows_no_label

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        key, valid, allow_missing = self.label, self.valid_values, self.allows_no_label
        out = []
        for e in endpoints:
            labels = e.metadata.labels
            present = key in labels
            if labels.get(key, "") in valid or (allow_missing and not present):
                out.append(e)
        return out


def factory(name: str, params: Params, handle: Handle) -> ByLabel:
    if not params.label:
        log.warning("by_label_without_label plugin=%s: set `label`; as configured it checks the empty label key", name)
    return ByLabel(name, params.label, params.valid_values, params.allows_no_label)
