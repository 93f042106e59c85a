"""`grpc.health.v1.Health` with the reference EPP's semantics (`cmd/epp/runner/health.go`).

"Live" means the pool has synced. Without leader election any service name is SERVING iff synced and not
draining. With leader election `liveness` is always SERVING (followers must not be restarted, nor a replica
that drains), the readiness names are SERVING iff synced, leader and not draining, and other names get
SERVICE_UNKNOWN. Draining starts on SIGTERM (`--drain-timeout`). `Watch` is UNIMPLEMENTED.

The two messages are tiny, so they are (de)serialised by hand instead of depending on
grpcio-health-checking: HealthCheckRequest{1: string service}, HealthCheckResponse{1: enum status},
HealthListRequest{}, HealthListResponse{1: map<string, HealthCheckResponse> statuses}."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

import grpc

from llm_epp.observability.logging import TRACE

log = logging.getLogger(__name__)

# HealthCheckResponse.ServingStatus
UNKNOWN = 0
SERVING = 1
NOT_SERVING = 2
SERVICE_UNKNOWN = 3

SERVICE = "grpc.health.v1.Health"
LIVENESS = "liveness"
READINESS = "readiness"
EXT_PROC = "envoy.service.ext_proc.v3.ExternalProcessor"
CHART_PROBE = "inference-extension"  # the reference chart's probe service name (single replica)
_READY_NAMES = frozenset({"", READINESS, EXT_PROC, CHART_PROBE})


@dataclass(slots=True)
class HealthState:
    """Mutated by the app on the event loop (pool synced, leadership gained or lost)."""

    synced: bool = False
    leader_election: bool = False
    is_leader: bool = False
    draining: bool = False  # set on SIGTERM: not ready while the servers keep serving

    def status(self, service: str) -> int:
        if not self.leader_election:
            return SERVING if self.synced and not self.draining else NOT_SERVING
        if service == LIVENESS:
            return SERVING  # also while draining, so the pod is not restarted mid-drain
        if service in _READY_NAMES:
            return SERVING if self.synced and self.is_leader and not self.draining else NOT_SERVING
        return SERVICE_UNKNOWN

    def listed_services(self) -> tuple[str, ...]:
        """The names `List` reports, as the reference."""
        return (EXT_PROC, LIVENESS, READINESS) if self.leader_election else (EXT_PROC,)


# --- protobuf wire format (just what these messages need) ----------------------------------------------
def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated or oversized varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> Iterable[tuple[int, int, int | bytes]]:
    """Yields (field number, wire type, value) for every field; varints as int, the rest as bytes."""
    pos = 0
    while pos < len(buf):
        tag, pos = _read_varint(buf, pos)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
            yield field, wire, value
            continue
        if wire == 2:
            size, pos = _read_varint(buf, pos)
        elif wire == 1:
            size = 8
        elif wire == 5:
            size = 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos + size > len(buf):
            raise ValueError("truncated field")
        yield field, wire, buf[pos : pos + size]
        pos += size


def encode_check_request(service: str) -> bytes:
    data = service.encode()
    return b"\x0a" + _varint(len(data)) + data if data else b""


def decode_check_request(buf: bytes) -> str:
    service = ""
    for field, wire, value in _fields(buf):
        if field == 1 and wire == 2 and isinstance(value, bytes):
            service = value.decode()
    return service


def encode_check_response(status: int) -> bytes:
    return b"\x08" + _varint(status) if status else b""


def decode_check_response(buf: bytes) -> int:
    status = UNKNOWN
    for field, wire, value in _fields(buf):
        if field == 1 and wire == 0 and isinstance(value, int):
            status = value
    return status


def encode_list_response(statuses: dict[str, int]) -> bytes:
    out = bytearray()
    for name, status in statuses.items():
        key = name.encode()
        value = encode_check_response(status)
        entry = b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(len(value)) + value
        out += b"\x0a" + _varint(len(entry)) + entry
    return bytes(out)


def decode_list_response(buf: bytes) -> dict[str, int]:
    statuses: dict[str, int] = {}
    for field, _, entry in _fields(buf):
        if field != 1 or not isinstance(entry, bytes):
            continue
        name, status = "", UNKNOWN
        for f, _, v in _fields(entry):
            if f == 1 and isinstance(v, bytes):
                name = v.decode()
            elif f == 2 and isinstance(v, bytes):
                status = decode_check_response(v)
        statuses[name] = status
    return statuses


# --- service ---------------------------------------------------------------------------------------------
_STATUS_NAMES = {UNKNOWN: "UNKNOWN", SERVING: "SERVING", NOT_SERVING: "NOT_SERVING"}


def log_check(state: HealthState, service: str, status: int) -> None:
    """What a Check answered: at TRACE when serving, else at INFO with why."""
    if status == SERVING:
        if log.isEnabledFor(TRACE):
            log.log(TRACE, "health_check_serving service=%r", service)
    else:
        log.info(
            "health_check_not_serving service=%r status=%s synced=%s leader_election=%s is_leader=%s draining=%s",
            service,
            _STATUS_NAMES.get(status, "SERVICE_UNKNOWN"),
            state.synced,
            state.leader_election,
            state.is_leader,
            state.draining,
        )


def add_health_service(server: grpc.aio.Server, state: HealthState) -> None:
    """Registers `grpc.health.v1.Health` on `server` (the health port, or the ext_proc port)."""

    async def check(service: str, context: grpc.aio.ServicerContext) -> int:
        status = state.status(service)
        log_check(state, service, status)
        return status

    async def list_(_: bytes, context: grpc.aio.ServicerContext) -> dict[str, int]:
        return {name: state.status(name) for name in state.listed_services()}

    async def watch(service: str, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Watch is not implemented")
        yield b""  # pragma: no cover - abort raises

    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Check": grpc.unary_unary_rpc_method_handler(
                check,
                request_deserializer=decode_check_request,
                response_serializer=encode_check_response,
            ),
            "List": grpc.unary_unary_rpc_method_handler(
                list_,
                request_deserializer=bytes,
                response_serializer=encode_list_response,
            ),
            "Watch": grpc.unary_stream_rpc_method_handler(
                watch,
                request_deserializer=decode_check_request,
                response_serializer=bytes,
            ),
        },
    )
    server.add_generic_rpc_handlers((handler,))


async def start_health_server(host: str, port: int, state: HealthState) -> tuple[grpc.aio.Server, int]:
    """Starts a plaintext grpc.aio server with only the health service; returns it and the bound port."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    add_health_service(server, state)
    address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
    bound = server.add_insecure_port(address)
    if not bound:
        raise OSError(f"cannot bind the gRPC health server to {address}")
    await server.start()
    return server, int(bound)
