"""Pydantic models of the reference `EndpointPickerConfig` (strict: unknown keys are errors)."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from llm_epp.config.quantity import parse_quantity

GIE_API_VERSION: Final = "inference.networking.x-k8s.io/v1alpha1"
LLM_D_API_VERSIONS = ("llm-d.ai/v1alpha1", "llm-d.ai/v1")
API_VERSIONS = (GIE_API_VERSION, *LLM_D_API_VERSIONS)

Quantity = Annotated[int, BeforeValidator(parse_quantity)]
"""A Kubernetes resource.Quantity (`1k`, `1Gi`, `5e3`, or a plain number), as its integer value."""


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
    # llm-d-router: unset means inject the default metrics source unless one is configured
    inject_defaults: bool | None = Field(default=None, alias="injectDefaults")
    sources: list[DataSourceSpec] = Field(default_factory=list)
    discovery: PluginRef | None = None
    cross_replica_syncer_plugin_ref: str | None = Field(default=None, alias="crossReplicaSyncerPluginRef")
    cross_replica_sync_interval: str | None = Field(default=None, alias="crossReplicaSyncInterval")


class PriorityBandSpec(_Model):
    priority: int = 0  # Go's zero value when omitted
    max_bytes: Quantity | None = Field(default=None, alias="maxBytes")
    max_requests: Quantity | None = Field(default=None, alias="maxRequests")
    fairness_policy_ref: str | None = Field(default=None, alias="fairnessPolicyRef")
    ordering_policy_ref: str | None = Field(default=None, alias="orderingPolicyRef")


class SaturationDetectorRef(_Model):
    plugin_ref: str = Field(default="", alias="pluginRef")  # empty: utilization-detector, as upstream


class FlowControlSpec(_Model):
    max_bytes: Quantity | None = Field(default=None, alias="maxBytes")
    max_requests: Quantity | None = Field(default=None, alias="maxRequests")
    default_request_ttl: str | None = Field(default=None, alias="defaultRequestTTL")
    no_endpoint_request_ttl: str | None = Field(default=None, alias="noEndpointRequestTTL")
    default_priority_band: PriorityBandSpec | None = Field(default=None, alias="defaultPriorityBand")
    default_negative_priority_band: PriorityBandSpec | None = Field(default=None, alias="defaultNegativePriorityBand")
    priority_bands: list[PriorityBandSpec] = Field(default_factory=list, alias="priorityBands")
    usage_limit_policy_plugin_ref: str | None = Field(default=None, alias="usageLimitPolicyPluginRef")
    saturation_detector: SaturationDetectorRef | None = Field(default=None, alias="saturationDetector")
    enable_eviction: bool = Field(default=False, alias="enableEviction")

    def settings(self) -> list[str]:
        """The flow-control settings given (every field but saturationDetector), by their YAML keys."""
        out = []
        for name, f in type(self).model_fields.items():
            if name == "saturation_detector":
                continue
            value = getattr(self, name)
            if value not in (None, [], False):
                out.append(f.alias or name)
        return out


class RequestHandlerSpec(_Model):
    parsers: list[PluginRef] = Field(default_factory=list)


class EndpointPickerConfigSpec(_Model):
    api_version: Literal["inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1", "llm-d.ai/v1"] = Field(
        default=GIE_API_VERSION, alias="apiVersion"
    )
    kind: Literal["EndpointPickerConfig"] = "EndpointPickerConfig"
    feature_gates: list[str] = Field(default_factory=list, alias="featureGates")
    plugins: list[PluginSpec] = Field(default_factory=list)
    scheduling_profiles: list[SchedulingProfileSpec] = Field(default_factory=list, alias="schedulingProfiles")
    saturation_detector: SaturationDetectorRef | None = Field(default=None, alias="saturationDetector")
    data_layer: DataLayerSpec | None = Field(default=None, alias="dataLayer")
    flow_control: FlowControlSpec | None = Field(default=None, alias="flowControl")
    request_handler: RequestHandlerSpec | None = Field(default=None, alias="requestHandler")
    parser: PluginRef | None = None
