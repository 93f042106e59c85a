"""The request path, assembled in one place: endpoint store, configuration (plugins, profiles, scheduler)
and the director that runs them. Protocol-free: no gRPC, no Kubernetes, no Prometheus. `llm-epp serve`
(`app.build`) puts its servers, discovery and metrics collection around it; the simulator puts virtual
pods and a virtual clock around it. Both therefore route with the same program."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from llm_epp.config import LoadedConfig, load_config, load_config_text
from llm_epp.datalayer.datastore import Datastore
from llm_epp.datalayer.objectives import ObjectivesStore
from llm_epp.flowcontrol import FlowController
from llm_epp.flowcontrol.controller import METRICS_LAG_S, FlowControlObserver
from llm_epp.framework import RandomSource, Recorder, Registry, os_random
from llm_epp.framework.parsing import Parser
from llm_epp.framework.tracing import NULL_TRACER, Tracer
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.parsers import default_parsers
from llm_epp.requestcontrol.director import Director, DirectorOptions, RequestPlugins

__all__ = ["RequestPath", "build_request_path", "configured_parsers"]


@dataclass(frozen=True)
class RequestPath:
    """What routes requests: fill `datastore` with endpoints (and their metrics), then call `director`."""

    datastore: Datastore
    config: LoadedConfig
    director: Director
    objectives: ObjectivesStore


def configured_parsers(config: LoadedConfig) -> list[Parser]:
    """The parsers named by `requestHandler.parsers` (or GIE's `parser`), in their order; llm-d-router's default
    list (openai-parser, anthropic-parser, vllmhttp-parser, then passthrough-parser as the fallback) when the
    configuration names none."""
    return list(config.parsers) or default_parsers()


def build_request_path(
    *,
    recorder: Recorder,
    config_text: str | None = None,
    config_file: str = "",
    pool_name: str = "",
    datastore: Datastore | None = None,
    objectives: ObjectivesStore | None = None,
    disable_subset_filter: bool = False,
    clock: Callable[[], float] = time.monotonic,
    random_source: RandomSource = os_random,
    registry: Registry | None = None,
    tracer: Tracer = NULL_TRACER,
    flow_observer: FlowControlObserver | None = None,
    metrics_lag: float = METRICS_LAG_S,
) -> RequestPath:
    """Builds an empty endpoint store called `pool_name` (or takes `datastore`), loads the
    EndpointPickerConfig (`config_file`, else `config_text`; neither: the default configuration) and wires
    the director to both.

    `clock` is the time plugins and the director read (`handle.now()`, request durations); `random_source`
    gives every plugin, profile and the
    director its random generator (`seeded_random(seed)` for a reproducible run). `metrics_lag` (metrics
    refresh interval + staleness threshold) paces flow-control eviction. Raises `ConfigError`."""
    datastore = datastore if datastore is not None else Datastore(pool_name=pool_name)
    registry = registry or builtin_registry()
    if config_file:
        config = load_config(
            config_file, registry, recorder, datastore.snapshot, clock=clock, random_source=random_source
        )
    else:
        config = load_config_text(
            config_text or None, registry, recorder, datastore.snapshot, clock=clock, random_source=random_source
        )
    objectives = objectives or ObjectivesStore(rng=random_source("objectives"))
    flow_control = None  # the flowControl gate: requests wait in the EPP's queues (flow_observer: its metrics)
    if config.flow_control is not None and config.saturation is not None:
        flow_control = FlowController(
            config.flow_control, config.saturation, datastore.snapshot, flow_observer, metrics_lag=metrics_lag
        )
    director = Director(
        datastore.snapshot,
        config.scheduler,
        RequestPlugins(
            screeners=config.screeners,
            prepare_data=config.prepare_data,
            admission=config.admission,
            pre_request=config.pre_request,
            response_received=config.response_received,
            response_first_body=config.response_first_body,
            response_complete=config.response_complete,
        ),
        recorder,
        DirectorOptions(disable_subset_filter=disable_subset_filter, objectives=objectives),
        rng=random_source("director"),
        saturation=config.saturation,
        parsers=configured_parsers(config),
        clock=clock,
        tracer=tracer,
        flow_control=flow_control,
    )
    return RequestPath(datastore, config, director, objectives)
