from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from llm_epp.observability.health import (
    NOT_SERVING,
    SERVICE_UNKNOWN,
    SERVING,
    UNKNOWN,
    HealthState,
    add_health_service,
    decode_check_request,
    decode_check_response,
    decode_list_response,
    encode_check_request,
    encode_check_response,
    start_health_server,
)

EXT_PROC = "envoy.service.ext_proc.v3.ExternalProcessor"
NAMES = ["", "liveness", "readiness", EXT_PROC, "inference-extension"]


@dataclass
class Client:
    state: HealthState
    channel: grpc.aio.Channel
    check: Any
    port: int


@pytest.fixture
async def client() -> AsyncIterator[Client]:
    state = HealthState()
    server, port = await start_health_server("127.0.0.1", 0, state)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    check = channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=encode_check_request,
        response_deserializer=decode_check_response,
    )
    try:
        yield Client(state, channel, check, port)
    finally:
        await channel.close()
        await server.stop(None)


# (leader_election, synced, is_leader) -> expected status per name in NAMES
ONLY_LIVENESS = [NOT_SERVING, SERVING, NOT_SERVING, NOT_SERVING, NOT_SERVING]
TABLE = [
    pytest.param(False, False, False, [NOT_SERVING] * 5, id="no-le-unsynced"),
    pytest.param(False, True, False, [SERVING] * 5, id="no-le-synced"),
    pytest.param(True, False, False, ONLY_LIVENESS, id="le-follower-unsynced"),
    pytest.param(True, True, False, ONLY_LIVENESS, id="le-follower-synced"),
    pytest.param(True, False, True, ONLY_LIVENESS, id="le-leader-unsynced"),
    pytest.param(True, True, True, [SERVING] * 5, id="le-leader-synced"),
]


@pytest.mark.parametrize(("leader_election", "synced", "is_leader", "expected"), TABLE)
async def test_check_over_grpc(
    client: Client, leader_election: bool, synced: bool, is_leader: bool, expected: list[int]
) -> None:
    client.state.leader_election = leader_election
    client.state.synced = synced
    client.state.is_leader = is_leader
    got = [await client.check(name, timeout=5) for name in NAMES]
    assert got == expected


async def test_unknown_service_with_leader_election(client: Client) -> None:
    client.state.leader_election = True
    client.state.synced = client.state.is_leader = True
    assert await client.check("no.such.Service", timeout=5) == SERVICE_UNKNOWN


async def test_unknown_service_without_leader_election_follows_sync(client: Client) -> None:
    # The reference answers every name from the sync state when leader election is off.
    assert await client.check("no.such.Service", timeout=5) == NOT_SERVING
    client.state.synced = True
    assert await client.check("no.such.Service", timeout=5) == SERVING


async def test_state_changes_are_seen_immediately(client: Client) -> None:
    assert await client.check("readiness", timeout=5) == NOT_SERVING
    client.state.synced = True
    assert await client.check("readiness", timeout=5) == SERVING
    client.state.synced = False
    assert await client.check("readiness", timeout=5) == NOT_SERVING


async def test_watch_is_unimplemented(client: Client) -> None:
    watch = client.channel.unary_stream(
        "/grpc.health.v1.Health/Watch",
        request_serializer=encode_check_request,
        response_deserializer=decode_check_response,
    )
    call = watch("", timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in call:
            pass
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_list(client: Client) -> None:
    list_ = client.channel.unary_unary(
        "/grpc.health.v1.Health/List",
        request_serializer=bytes,
        response_deserializer=decode_list_response,
    )
    assert await list_(b"", timeout=5) == {EXT_PROC: NOT_SERVING}
    client.state.leader_election = True
    client.state.synced = client.state.is_leader = True
    assert await list_(b"", timeout=5) == {EXT_PROC: SERVING, "liveness": SERVING, "readiness": SERVING}


async def test_add_health_service_to_an_existing_server() -> None:
    server = grpc.aio.server()
    state = HealthState(synced=True)
    add_health_service(server, state)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            check = channel.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=encode_check_request,
                response_deserializer=decode_check_response,
            )
            assert await check(EXT_PROC, timeout=5) == SERVING
    finally:
        await server.stop(None)


# --- wire format ---------------------------------------------------------------------------------------
def test_known_encodings() -> None:
    # Bytes a protoc-generated HealthCheckRequest / HealthCheckResponse produce.
    assert encode_check_request("liveness") == b"\x0a\x08liveness"
    assert encode_check_request("") == b""
    assert encode_check_response(SERVING) == b"\x08\x01"
    assert encode_check_response(NOT_SERVING) == b"\x08\x02"
    assert encode_check_response(SERVICE_UNKNOWN) == b"\x08\x03"
    assert encode_check_response(UNKNOWN) == b""


@pytest.mark.parametrize("name", ["", "readiness", EXT_PROC, "x" * 300, "ünïcödé"])
def test_request_round_trip(name: str) -> None:
    assert decode_check_request(encode_check_request(name)) == name


def test_long_name_uses_multibyte_length() -> None:
    assert encode_check_request("x" * 300)[:3] == b"\x0a\xac\x02"


def test_decoders_skip_unknown_fields() -> None:
    # field 2 varint, field 3 fixed64, field 4 fixed32, field 5 bytes, then field 1.
    extra = b"\x10\x05" + b"\x19" + b"\0" * 8 + b"\x25" + b"\0" * 4 + b"\x2a\x02ab"
    assert decode_check_request(extra + b"\x0a\x03abc") == "abc"
    assert decode_check_response(extra + b"\x08\x02") == NOT_SERVING
    assert decode_check_response(b"") == UNKNOWN


@pytest.mark.parametrize(
    "data", [b"\x0a\x05ab", b"\x0a", b"\x0b", b"\x08\xff"], ids=["short", "nolen", "wt3", "varint"]
)
def test_malformed_request_raises(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_check_request(data)


async def test_malformed_request_fails_the_call(client: Client) -> None:
    raw = client.channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=bytes,
        response_deserializer=decode_check_response,
    )
    with pytest.raises(grpc.aio.AioRpcError):
        await raw(b"\x0a\x05ab", timeout=5)


@pytest.mark.parametrize(
    ("leader_election", "service", "expected"),
    [
        (False, "", NOT_SERVING),
        (False, "liveness", NOT_SERVING),  # without leader election every name follows readiness
        (True, "liveness", SERVING),  # not restarted mid-drain
        (True, "readiness", NOT_SERVING),
        (True, "", NOT_SERVING),
        (True, "envoy.service.ext_proc.v3.ExternalProcessor", NOT_SERVING),
    ],
    ids=["plain", "plain-liveness", "le-liveness", "le-readiness", "le-empty", "le-ext-proc"],
)
def test_draining_is_not_ready_but_live(leader_election: bool, service: str, expected: int) -> None:
    state = HealthState(synced=True, leader_election=leader_election, is_leader=True)
    assert state.status(service) == SERVING
    state.draining = True
    assert state.status(service) == expected
