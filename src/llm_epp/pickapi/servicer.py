"""The direct-routing gRPC API (`llm_epp.v1.EndpointPicker`): a second adapter over the same Director
as ext_proc, for callers that are not Envoy. Protobuf stops here: requests become RequestInputs,
RoutingDecisions and EppErrors become answers and gRPC status codes. A lease holds only the director's
handle (no request bytes)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc

from llm_epp.api.v1 import picker_pb2 as pb
from llm_epp.framework import Endpoint, EndpointKey, EppError, ErrorCode, TypedName
from llm_epp.framework.requestcontrol import Usage
from llm_epp.pickapi.leases import LeaseTable
from llm_epp.requestcontrol.decision import Outcome, RequestInput, ResponseSeen, RoutingDecision
from llm_epp.requestcontrol.director import Director
from llm_epp.requestcontrol.lifecycle import RequestHandle
from llm_epp.requestcontrol.parsers import DEFAULT_PATH
from llm_epp.scheduling.profile import TOTAL

log = logging.getLogger(__name__)

VERBOSE = 15  # the reference's -v 3: one line per request
SERVICE = pb.DESCRIPTOR.services_by_name["EndpointPicker"].full_name
REQUEST_ID = "x-request-id"
PATH = ":path"
DEFAULT_MAX_BODY = 16 << 20

# EppError's HTTP status -> gRPC code. 413 is INVALID_ARGUMENT, not RESOURCE_EXHAUSTED: the body is
# too large for good, and callers commonly retry RESOURCE_EXHAUSTED (our 429) after a back-off.
_GRPC_CODE = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
}


def grpc_code(error: EppError) -> Any:
    """The gRPC status code for an EppError (INTERNAL for statuses without a better match)."""
    return _GRPC_CODE.get(error.code.http_status, grpc.StatusCode.INTERNAL)


class LeaseFinisher:
    """Ends a leased request in the director (the lease table's `finish(record, complete)`)."""

    def __init__(self, director: Director) -> None:
        self._director = director

    def finish(self, record: RequestHandle, complete: bool) -> None:
        self._director.finish(record, Outcome(complete=complete))


_BAD_MESSAGE = object()


def _lenient(message_type: Any) -> Callable[[bytes], Any]:
    """A deserializer that turns undecodable bytes into a marker, answered INVALID_ARGUMENT by the method
    (gRPC would otherwise answer with the parser's exception text)."""

    def parse(data: bytes) -> Any:
        try:
            return message_type.FromString(data)
        except Exception:  # protobuf's DecodeError and friends: the caller sent garbage
            return _BAD_MESSAGE

    return parse


async def _reject_malformed(context: grpc.aio.ServicerContext, message_type: Any) -> None:
    await context.abort(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"the request is not a valid {message_type.DESCRIPTOR.full_name} message",
    )


StatsFn = Callable[[EndpointKey], Mapping[str, float]]
Behavior = Callable[[Any, Any], Awaitable[Any]]


def _stats_sources(plugins: Iterable[object]) -> list[tuple[str, StatsFn]]:
    """Plugins with an `endpoint_stats(key) -> Mapping[str, float]` method, by instance name."""
    out: list[tuple[str, StatsFn]] = []
    for plugin in plugins:
        fn = getattr(plugin, "endpoint_stats", None)
        if not callable(fn):
            continue
        typed_name = getattr(plugin, "typed_name", None)
        name = typed_name.name if isinstance(typed_name, TypedName) else type(plugin).__name__
        out.append((name, fn))
    return out


class PickServicer:
    """Serves Pick, Release and ListEndpoints. `leases.run()` must run alongside the server (the app's
    TaskGroup) to expire forgotten leases; cancelling it releases whatever is still outstanding."""

    def __init__(
        self,
        director: Director,
        snapshot: Callable[[], Sequence[Endpoint]],
        *,
        plugins: Iterable[object] = (),
        leases: LeaseTable | None = None,
        max_request_body_bytes: int = DEFAULT_MAX_BODY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.director = director
        self.leases = leases if leases is not None else LeaseTable(LeaseFinisher(director))
        self.max_body = max_request_body_bytes
        self._snapshot = snapshot
        self._stats = _stats_sources(plugins)
        self._clock = clock

    def methods(self) -> dict[str, tuple[Callable[[bytes], Any], Behavior, Callable[[Any], bytes]]]:
        """Per method name: its request deserializer, the method, its response serializer (for any server)."""

        def unary(fn: Behavior, request: Any, response: Any) -> tuple[Any, Behavior, Any]:
            return _lenient(request), fn, response.SerializeToString

        return {
            "Pick": unary(self.pick, pb.PickRequest, pb.PickResponse),
            "Release": unary(self.release, pb.ReleaseRequest, pb.ReleaseResponse),
            "ListEndpoints": unary(self.list_endpoints, pb.ListEndpointsRequest, pb.ListEndpointsResponse),
        }

    def handler(self) -> grpc.GenericRpcHandler:
        """The methods for a grpcio server."""
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                name: grpc.unary_unary_rpc_method_handler(
                    fn, request_deserializer=deserialize, response_serializer=serialize
                )
                for name, (deserialize, fn, serialize) in self.methods().items()
            },
        )

    def add_to_server(self, server: grpc.aio.Server) -> None:
        server.add_generic_rpc_handlers((self.handler(),))

    # --- Pick -----------------------------------------------------------------------------------------
    async def pick(self, request: pb.PickRequest, context: grpc.aio.ServicerContext) -> pb.PickResponse:
        if request is _BAD_MESSAGE:
            await _reject_malformed(context, pb.PickRequest)
        inp = self._input(request)
        dry_run = request.dry_run
        try:
            if len(request.body) > self.max_body:
                self.director.recorder.request_error("", "", ErrorCode.PAYLOAD_TOO_LARGE.value)
                raise EppError(
                    ErrorCode.PAYLOAD_TOO_LARGE,
                    f"request body is {len(request.body)} bytes, over the limit of {self.max_body} bytes "
                    "(--max-request-body-bytes)",
                )
            subset = list(request.subset.endpoints) if request.HasField("subset") else None
            decision = await self.director.route(
                RequestInput(inp.request_id, inp.headers, request.body, subset, inp.request_id_generated),
                dry_run=dry_run,
            )
        except EppError as e:
            if log.isEnabledFor(VERBOSE):
                log.log(VERBOSE, "pick_rejected request_id=%s code=%s: %s", inp.request_id, e.code.value, e.message)
            await context.abort(grpc_code(e), e.message)
            raise AssertionError("unreachable: context.abort raises") from None
        response = self._decision(decision)
        if not dry_run:
            try:
                lease = self.leases.grant(decision.handle, request.lease_ttl_seconds)
            except BaseException:
                self.director.finish(decision.handle, Outcome(complete=False))  # nothing leaks
                raise
            response.lease_id = lease.lease_id
            response.lease_expires_in_seconds = self.leases.expires_in(lease)
        if log.isEnabledFor(VERBOSE):
            log.log(
                VERBOSE,
                "endpoint_picked request_id=%s model=%s target_model=%s endpoint=%s api=pick dry_run=%s",
                inp.request_id,
                decision.request.incoming_model,
                decision.request.target_model,
                decision.destination,
                dry_run,
            )
        return response

    def _input(self, request: pb.PickRequest) -> RequestInput:
        headers = {name.lower(): value for name, value in request.headers.items()}
        headers[PATH] = request.path or DEFAULT_PATH
        request_id = headers.get(REQUEST_ID)
        generated = not request_id
        if not request_id:
            request_id = headers[REQUEST_ID] = str(uuid.uuid4())
        return RequestInput(request_id, headers, None, None, generated)

    def _decision(self, decision: RoutingDecision) -> pb.PickResponse:
        result = decision.result
        primary = result.primary if result is not None else None
        targets: Sequence[Endpoint] = primary.target_endpoints if primary is not None else (decision.endpoint,)
        response = pb.PickResponse(
            request_id=decision.request.request_id,
            endpoint=targets[0].hostport if targets else "",
            fallbacks=[e.hostport for e in targets[1:]],
            target_model=decision.request.target_model,
            rewritten_body=decision.body or b"",
        )
        if primary is not None and primary.scores:
            hostports = {e.key: e.hostport for e in self._snapshot()}
            ranked = sorted(primary.scores.items(), key=lambda kv: kv[1].get(TOTAL, 0.0), reverse=True)
            response.scores.extend(
                pb.EndpointScore(
                    endpoint=hostports.get(key, ""),
                    name=str(key),
                    total=breakdown.get(TOTAL, 0.0),
                    plugins={name: score for name, score in breakdown.items() if name != TOTAL},
                )
                for key, breakdown in ranked
            )
        return response

    # --- Release --------------------------------------------------------------------------------------
    async def release(self, request: pb.ReleaseRequest, context: grpc.aio.ServicerContext) -> pb.ReleaseResponse:
        if request is _BAD_MESSAGE:
            await _reject_malformed(context, pb.ReleaseRequest)
        handle = self.leases.take(request.lease_id)
        if handle is None:
            return pb.ReleaseResponse(released=False)
        usage = None
        if request.HasField("usage"):
            u = request.usage
            usage = Usage(
                prompt_tokens=u.prompt_tokens,
                completion_tokens=u.completion_tokens,
                total_tokens=u.prompt_tokens + u.completion_tokens,
                cached_tokens=u.cached_tokens,
            )
        status = 200 if request.success else ErrorCode.MODEL_SERVER_ERROR.http_status
        self.director.response_received(handle, ResponseSeen(status=status))
        self.director.finish(handle, Outcome(complete=True, status=status, usage=usage))
        return pb.ReleaseResponse(released=True)

    # --- ListEndpoints --------------------------------------------------------------------------------
    async def list_endpoints(
        self, request: pb.ListEndpointsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListEndpointsResponse:
        if request is _BAD_MESSAGE:
            await _reject_malformed(context, pb.ListEndpointsRequest)
        now = self._clock()
        return pb.ListEndpointsResponse(endpoints=[self._endpoint_info(ep, now) for ep in self._snapshot()])

    def _endpoint_info(self, ep: Endpoint, now: float) -> pb.EndpointInfo:
        md, m = ep.metadata, ep.metrics
        has_metrics = m.update_time > 0
        return pb.EndpointInfo(
            name=md.key.name,
            namespace=md.key.namespace,
            address=md.address,
            port=md.port,
            hostport=md.hostport,
            labels=dict(md.labels),
            engine=md.engine,
            has_metrics=has_metrics,
            metrics=pb.EndpointMetrics(
                waiting_queue_size=m.waiting_queue_size,
                running_requests=m.running_requests,
                kv_cache_usage=m.kv_cache_usage,
                active_lora_adapters=sorted(m.active_models),
                waiting_lora_adapters=sorted(m.waiting_models),
                max_loras=m.max_active_models,
                cache_block_size=m.cache_block_size,
                cache_num_blocks=m.cache_num_blocks,
            ),
            metrics_age_seconds=max(now - m.update_time, 0.0) if has_metrics else -1.0,
            in_flight_requests=ep.load.requests,
            in_flight_tokens=ep.load.tokens,
            stats=self._plugin_stats(ep.key),
        )

    def _plugin_stats(self, key: EndpointKey) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, fn in self._stats:
            try:
                for stat, value in fn(key).items():
                    out[f"{name}/{stat}"] = float(value)
            except Exception:  # plugin failures are isolated: that plugin's figures are left out
                log.exception("plugin_failed extension_point=EndpointStats plugin=%s endpoint=%s", name, key)
        return out
