"""The plugin API of llm-epp: the stable contract that filters, scorers, pickers and request-control
plugins are written against. Plugin authors import from here only."""

from llm_epp.framework.errors import EppError, ErrorCode
from llm_epp.framework.plugin import Handle, Plugin, PluginParams, RandomSource, TypedName, os_random, seeded_random
from llm_epp.framework.recorder import NullRecorder, Recorder
from llm_epp.framework.registry import PluginFactory, Registry
from llm_epp.framework.scheduling import Filter, Picker, ProfileHandler, Scorer, ScorerCategory
from llm_epp.framework.state import CycleState, StateKey
from llm_epp.framework.types import (
    ApiKind,
    Endpoint,
    EndpointKey,
    EndpointMetadata,
    InferenceRequest,
    InFlightLoad,
    Metrics,
    ProfileResult,
    RequestBody,
    SchedulingResult,
    ScoredEndpoint,
)

__all__ = [
    "ApiKind",
    "CycleState",
    "Endpoint",
    "EndpointKey",
    "EndpointMetadata",
    "EppError",
    "ErrorCode",
    "Filter",
    "Handle",
    "InFlightLoad",
    "InferenceRequest",
    "Metrics",
    "NullRecorder",
    "Picker",
    "Plugin",
    "PluginFactory",
    "PluginParams",
    "ProfileHandler",
    "ProfileResult",
    "RandomSource",
    "Recorder",
    "Registry",
    "RequestBody",
    "SchedulingResult",
    "ScoredEndpoint",
    "Scorer",
    "ScorerCategory",
    "StateKey",
    "TypedName",
    "os_random",
    "seeded_random",
]
