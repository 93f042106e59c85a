"""label-selector-filter

Scheduling intent:
    Keep only the endpoints whose labels match a Kubernetes label selector (llm-d's generic label filter,
    e.g. to build prefill/decode profiles from custom role labels). The request plays no part.

Inputs consumed:
    EndpointMetadata.labels (pod labels, or `labels` in a static endpoints file).

Configuration:
    Kubernetes LabelSelector semantics; every condition must hold (AND):
    matchLabels (map label -> value, default {}): the label is present with exactly that value.
    matchExpressions (list, default []): items {key, operator, values}:
        In            the label is present and its value is one of `values` (non-empty);
        NotIn         the label is absent, or its value is not one of `values` (non-empty);
        Exists        the label is present (`values` must be empty);
        DoesNotExist  the label is absent (`values` must be empty).
    An empty selector keeps every endpoint. When nothing matches the result is empty (no fail-open),
    which fails the profile, as in llm-d.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, PluginParams, TypedName

TYPE = "label-selector-filter"


class Requirement(BaseModel):
    """One `matchExpressions` item."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str = Field(min_length=1)
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _values_fit_operator(self) -> Requirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs a non-empty `values` list")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no `values`")
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.operator
        if op == "In":
            return self.key in labels and labels[self.key] in self.values
        if op == "NotIn":
            return self.key not in labels or labels[self.key] not in self.values
        if op == "Exists":
            return self.key in labels
        return self.key not in labels


class Params(PluginParams):
    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: tuple[Requirement, ...] = Field(default=(), alias="matchExpressions")


class LabelSelectorFilter:
    def __init__(
        self,
        name: str = TYPE,
        match_labels: Mapping[str, str] | None = None,
        match_expressions: Sequence[Requirement] = (),
    ) -> None:
        self._typed_name = TypedName(self.plugin_type(), name)
        self._labels = tuple((match_labels or {}).items())
        self._expressions = tuple(match_expressions)

    @classmethod
    def plugin_type(cls) -> str:
        return TYPE

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def matches(self, labels: Mapping[str, str]) -> bool:
        for k, v in self._labels:
            if labels.get(k) != v:
                return False
        return all(r.matches(labels) for r in self._expressions)

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        if not self._labels and not self._expressions:
            return endpoints
        return [e for e in endpoints if self.matches(e.metadata.labels)]


def factory(name: str, params: Params, handle: Handle) -> LabelSelectorFilter:
    return LabelSelectorFilter(name, params.match_labels, params.match_expressions)
