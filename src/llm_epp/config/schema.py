"""Pydantic models of the reference `EndpointPickerConfig` (strict: unknown keys are errors)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

API_VERSIONS = ("inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1")
FEATURE_GATES = ("dataLayer", "enableLegacyMetrics", "flowControl")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=False, frozen=True)


class PluginSpec(_Model):
    type: str = Field(min_length=1)
    name: str | None = None
    parameters: dict[str, Any] | None = None


class ProfilePluginRef(_Model):
    plugin_ref: str = Field(alias="pluginRef", min_length=1)
    weight: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class SchedulingProfileSpec(_Model):
    name: str = Field(min_length=1)
    plugins: list[ProfilePluginRef] = Field(default_factory=list)


class PluginRef(_Model):
    plugin_ref: str = Field(alias="pluginRef", min_length=1)


class DataSourceSpec(_Model):
    plugin_ref: str = Field(alias="pluginRef", min_length=1)
    extractors: list[PluginRef] = Field(default_factory=list)


class DataLayerSpec(_Model):
    sources: list[DataSourceSpec] = Field(default_factory=list)


class PriorityBandSpec(_Model):
    priority: int
    max_bytes: int | str | None = Field(default=None, alias="maxBytes")
    max_requests: int | None = Field(default=None, alias="maxRequests")
    fairness_policy_ref: str | None = Field(default=None, alias="fairnessPolicyRef")
    ordering_policy_ref: str | None = Field(default=None, alias="orderingPolicyRef")


class FlowControlSpec(_Model):
    max_bytes: int | str | None = Field(default=None, alias="maxBytes")
    max_requests: int | None = Field(default=None, alias="maxRequests")
    default_request_ttl: str | None = Field(default=None, alias="defaultRequestTTL")
    default_priority_band: PriorityBandSpec | None = Field(default=None, alias="defaultPriorityBand")
    priority_bands: list[PriorityBandSpec] = Field(default_factory=list, alias="priorityBands")
    usage_limit_policy_plugin_ref: str | None = Field(default=None, alias="usageLimitPolicyPluginRef")


class EndpointPickerConfigSpec(_Model):
    api_version: Literal["inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1"] = Field(
        default="inference.networking.x-k8s.io/v1alpha1", alias="apiVersion"
    )
    kind: Literal["EndpointPickerConfig"] = "EndpointPickerConfig"
    feature_gates: list[str] = Field(default_factory=list, alias="featureGates")
    plugins: list[PluginSpec] = Field(default_factory=list)
    scheduling_profiles: list[SchedulingProfileSpec] = Field(default_factory=list, alias="schedulingProfiles")
    saturation_detector: PluginRef | None = Field(default=None, alias="saturationDetector")
    data_layer: DataLayerSpec | None = Field(default=None, alias="dataLayer")
    flow_control: FlowControlSpec | None = Field(default=None, alias="flowControl")
    parser: PluginRef | None = None
