"""The director: parse -> objective -> candidates -> prepare-data -> admission -> schedule -> pre-request,
and on the way back response hooks, run exactly once per request. Protocol-free: the ext_proc adapter
turns protobuf into calls here and EppError into immediate responses."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from llm_epp.framework import (
    CycleState,
    Endpoint,
    EppError,
    ErrorCode,
    InferenceRequest,
    Recorder,
    TypedName,
)
from llm_epp.framework.flowcontrol import SaturationDetector
from llm_epp.framework.requestcontrol import (
    Admission,
    PrepareData,
    PreRequest,
    ResponseComplete,
    ResponseInfo,
    ResponseReceived,
)
from llm_epp.framework.types import ApiKind, RequestBody, split_host_port
from llm_epp.requestcontrol.lifecycle import RequestRecord
from llm_epp.requestcontrol.parsing import parse_request, request_path, rewrite_model
from llm_epp.scheduling import Scheduler, SchedulingFailedError

log = logging.getLogger(__name__)

OBJECTIVE_HEADER = "x-gateway-inference-objective"
FAIRNESS_HEADER = "x-gateway-inference-fairness-id"
MODEL_REWRITE_HEADER = "x-gateway-model-name-rewrite"
TEST_SELECTION_HEADER = "test-epp-endpoint-selection"
DEFAULT_FAIRNESS_ID = "default-flow"
PREPARE_DATA_TIMEOUT_S = 0.4


@dataclass
class RequestPlugins:
    prepare_data: Sequence[PrepareData] = ()
    admission: Sequence[Admission] = ()
    pre_request: Sequence[PreRequest] = ()
    response_received: Sequence[ResponseReceived] = ()
    response_complete: Sequence[ResponseComplete] = ()


class Objectives(Protocol):
    """InferenceObjectives (priority by objective name) and InferenceModelRewrite rules, from Kubernetes
    or a static file."""

    def priority(self, objective: str) -> int | None: ...

    def rewrite(self, model: str) -> tuple[str, str] | None:
        """(target model, rule name) when a rewrite rule matches `model`, else None."""
        ...


class NoObjectives:
    def priority(self, objective: str) -> int | None:
        return None

    def rewrite(self, model: str) -> tuple[str, str] | None:
        return None


@dataclass
class DirectorOptions:
    disable_subset_filter: bool = False
    objectives: Objectives = field(default_factory=NoObjectives)


def estimate_tokens(body_bytes: int) -> int:
    """The reference's in-flight token estimate: input = max(bytes / 4, 1) plus 1.5x that for output."""
    prompt = max(body_bytes // 4, 1)
    return prompt + int(prompt * 1.5 + 0.5)  # Go's math.Round: halves away from zero


def _matches(entry: str, endpoint: Endpoint) -> bool:
    try:
        host, port = split_host_port(entry)
    except ValueError:
        return False
    return host == endpoint.metadata.address and (port is None or port == endpoint.metadata.port)


def filter_by_list(endpoints: Sequence[Endpoint], entries: Sequence[str]) -> list[Endpoint]:
    """Endpoints named in `entries` (`ip` or `ip:port`; port-aware when a port is given)."""
    wanted = {e.strip() for item in entries for e in item.split(",") if e.strip()}
    loose = [w for w in wanted if not _has_port(w)]  # bare IPs match every port of that address
    return [ep for ep in endpoints if ep.hostport in wanted or any(_matches(w, ep) for w in loose)]


def _has_port(entry: str) -> bool:
    try:
        return split_host_port(entry)[1] is not None
    except ValueError:
        return True


class Director:
    def __init__(
        self,
        snapshot: Callable[[], Sequence[Endpoint]],
        scheduler: Scheduler,
        plugins: RequestPlugins,
        recorder: Recorder,
        options: DirectorOptions | None = None,
        rng: random.Random | None = None,
        saturation: SaturationDetector | None = None,
    ) -> None:
        self._snapshot = snapshot
        self.scheduler = scheduler
        self.plugins = plugins
        self.recorder = recorder
        self.options = options or DirectorOptions()
        self.saturation = saturation
        self._rng = rng or random.Random()

    # --- request path ---------------------------------------------------------------------------------
    def candidates(self, headers: Mapping[str, str], subset: Sequence[str] | None) -> list[Endpoint]:
        endpoints: Sequence[Endpoint] = self._snapshot()
        if not endpoints:
            raise EppError(
                ErrorCode.SERVICE_UNAVAILABLE,
                "no endpoints in the inference pool: check that model-server pods are ready and match the pool",
            )
        selection = headers.get(TEST_SELECTION_HEADER)
        if selection is not None:
            endpoints = filter_by_list(endpoints, [selection])
        elif subset is not None and not self.options.disable_subset_filter:
            endpoints = filter_by_list(endpoints, subset)
        if not endpoints:
            raise EppError(
                ErrorCode.SERVICE_UNAVAILABLE,
                "failed to find endpoint candidates for serving the request: "
                "the gateway's endpoint subset matches no endpoint of the pool",
            )
        return list(endpoints)

    async def handle_request(
        self, record: RequestRecord, body: bytes | None, subset: Sequence[str] | None, dry_run: bool = False
    ) -> None:
        """Fills `record` with the routing decision. Raises EppError for answers to send to the client.

        `dry_run` decides without reserving anything: no PreRequest hooks (which update e.g. the prefix
        index), no in-flight accounting, no running-request metrics."""
        headers = record.headers
        record.path = request_path(headers)
        if body is None:
            self._route_bodyless(record, subset)
            return
        record.request_bytes = len(body)
        try:
            parsed, incoming = parse_request(record.path, body)
        except EppError as e:
            self.recorder.request_error("", "", e.code.value)
            raise
        objectives = self.options.objectives
        target = headers.get(MODEL_REWRITE_HEADER) or incoming
        rule = objectives.rewrite(incoming)
        if rule is not None:
            target = rule[0]
            self.recorder.model_rewrite(rule[1], incoming, target)
        record.incoming_model, record.target_model = incoming, target
        objective = headers.get(OBJECTIVE_HEADER, "")
        priority = objectives.priority(objective) if objective else None
        request = InferenceRequest(
            request_id=record.request_id,
            incoming_model=incoming,
            target_model=target,
            body=parsed,
            headers=headers,
            priority=priority or 0,
            objective=objective,
            fairness_id=headers.get(FAIRNESS_HEADER) or DEFAULT_FAIRNESS_ID,
            size_bytes=len(body),
        )
        record.request = request
        cycle = record.cycle
        try:
            candidates = self.candidates(headers, subset)
            record.candidates = candidates
            self._shed_if_saturated(request, candidates)
            await self._prepare_and_admit(cycle, request, candidates)
            try:
                result = self.scheduler.schedule(request, candidates, cycle)
            except SchedulingFailedError as e:
                self.recorder.scheduler_attempt(False, target, "", "", "")
                raise EppError(ErrorCode.RESOURCE_EXHAUSTED, str(e)) from None
        except EppError as e:
            self.recorder.request_error(incoming, target, e.code.value)
            raise
        primary = result.primary
        assert primary is not None
        record.result = result
        record.endpoint = primary.target_endpoints[0]
        record.destination = ",".join(e.hostport for e in primary.target_endpoints)
        if target != incoming:
            record.body_out = rewrite_model(parsed.payload, target)
        key = record.endpoint.key
        self.recorder.scheduler_attempt(True, target, key.name, key.namespace, str(record.endpoint.metadata.port))
        if dry_run:
            return
        self.recorder.request_scheduled(incoming, target, request.priority)
        self.recorder.running_requests(incoming, 1)
        load = record.endpoint.load
        record.reserved_tokens = estimate_tokens(len(body))
        load.requests += 1
        load.tokens += record.reserved_tokens
        record.scheduled = True
        for plugin in self.plugins.pre_request:
            try:
                plugin.pre_request(cycle, request, result)
            except Exception:
                self._plugin_failed("PreRequest", plugin.typed_name)

    def _route_bodyless(self, record: RequestRecord, subset: Sequence[str] | None) -> None:
        candidates = self.candidates(record.headers, subset)
        chosen = candidates[0] if len(candidates) == 1 else self._rng.choice(candidates)
        record.endpoint = chosen
        record.destination = chosen.hostport
        record.request = InferenceRequest(record.request_id, "", "", RequestBody(ApiKind.NONE), headers=record.headers)

    def _shed_if_saturated(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> None:
        """Legacy admission: a sheddable request (priority < 0) is refused while the candidates are saturated."""
        if request.priority >= 0 or self.saturation is None:
            return
        if self.saturation.saturation(candidates) >= 1.0:
            raise EppError(
                ErrorCode.RESOURCE_EXHAUSTED,
                "system saturated, sheddable request dropped: retry later or send it with a higher priority",
            )

    async def _prepare_and_admit(
        self, cycle: CycleState, request: InferenceRequest, candidates: Sequence[Endpoint]
    ) -> None:
        for plugin in self.plugins.prepare_data:
            try:
                async with asyncio.timeout(PREPARE_DATA_TIMEOUT_S):
                    await plugin.prepare_data(cycle, request, candidates)
            except TimeoutError:
                log.warning("prepare_data_timeout plugin=%s", plugin.typed_name)
            except Exception:
                log.exception("prepare_data_failed plugin=%s", plugin.typed_name)
                self.recorder.plugin_error("PrepareData", plugin.typed_name)
        for admission in self.plugins.admission:
            reason = await admission.admit(cycle, request, candidates)
            if reason is not None:
                raise EppError(ErrorCode.INTERNAL, f"request cannot be admitted: {reason}")

    # --- response path --------------------------------------------------------------------------------
    def response_received(self, record: RequestRecord, info: ResponseInfo) -> None:
        request = record.request
        if request is None or not record.scheduled:
            return
        for plugin in self.plugins.response_received:
            try:
                plugin.response_received(record.cycle, request, info, record.endpoint)
            except Exception:
                self._plugin_failed("ResponseReceived", plugin.typed_name)

    def finish(self, record: RequestRecord, complete: bool) -> None:
        """Ends the request exactly once: completion hooks, running-requests gauge and metrics.
        Safe to call again (later calls do nothing)."""
        if record.finished:
            return
        record.finished = True
        if not record.scheduled or record.request is None:
            return
        endpoint = record.endpoint
        if endpoint is not None:  # release the reservation (a removed endpoint's counter is simply dropped)
            load = endpoint.load
            load.requests = max(load.requests - 1, 0)
            load.tokens = max(load.tokens - record.reserved_tokens, 0)
        request = record.request
        info = ResponseInfo(
            status=record.response_status,
            served_endpoint=record.served_endpoint,
            usage=record.usage,
            streaming=record.response_streaming,
            complete=complete,
        )
        for plugin in self.plugins.response_complete:
            try:
                plugin.response_complete(record.cycle, request, info, record.endpoint)
            except Exception:
                self._plugin_failed("ResponseComplete", plugin.typed_name)
        rec = self.recorder
        rec.running_requests(record.incoming_model, -1)
        if complete and record.response_status and record.response_status >= 400:
            rec.request_error(record.incoming_model, record.target_model, ErrorCode.MODEL_SERVER_ERROR.value)
        if complete:
            usage = record.usage
            rec.request_completed(
                record.incoming_model,
                record.target_model,
                time.monotonic() - record.received_at,
                len(record.body_out) if record.body_out is not None else record.request_bytes,
                record.response_bytes,
                usage.prompt_tokens if usage else None,
                usage.completion_tokens if usage else None,
                usage.cached_tokens if usage else None,
            )

    def _plugin_failed(self, point: str, name: TypedName) -> None:
        log.exception("plugin_failed extension_point=%s plugin=%s", point, name)
        self.recorder.plugin_error(point, name)
