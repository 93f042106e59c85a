"""Authentication and lease caps of the direct-routing API over real gRPC servers: mTLS with a test CA,
service-account tokens checked by the real `kubernetes` client against the in-test API server."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest

from llm_epp.api.v1 import picker_pb2 as pb
from llm_epp.api.v1 import picker_pb2_grpc
from llm_epp.app import pick_api_methods
from llm_epp.config import load_config_text
from llm_epp.datalayer import Datastore
from llm_epp.datalayer.static import parse_endpoint_list
from llm_epp.extproc.http2_server import ExtProcServer
from llm_epp.framework import NullRecorder
from llm_epp.k8s.tokenreview import KubernetesTokenReviewer
from llm_epp.observability.logging import VERBOSE, InfoOncePerInterval
from llm_epp.pickapi import LeaseTable, PickServicer
from llm_epp.pickapi.auth import (
    Authenticator,
    AuthSettings,
    PickApiGuard,
    parse_service_account,
    service_account_allowed,
)
from llm_epp.pickapi.servicer import LeaseFinisher
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.parsers import default_parsers
from llm_epp.requestcontrol.director import Director, RequestPlugins
from llm_epp.security.server_ssl import server_context
from tests.support.certs import TestCA
from tests.support.fake_apiserver import FakeApiServer

ENDPOINTS = "10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8001"
BODY = json.dumps({"model": "m", "prompt": "hello there"}).encode()
SCHEDULER = "system:serviceaccount:batch:scheduler"


class Api:
    """The servicer behind the guard on a real grpc.aio server (insecure, or mTLS with `ca`)."""

    def __init__(
        self,
        settings: AuthSettings,
        *,
        ca: TestCA | None = None,
        max_total: int = 8,
        per_caller: int = 3,
        transport: str = "grpcio",
    ):
        self.datastore = Datastore()
        self.datastore.replace_all(parse_endpoint_list(ENDPOINTS))
        config = load_config_text(None, builtin_registry(), NullRecorder())
        self.director = Director(
            self.datastore.snapshot, config.scheduler, RequestPlugins(), NullRecorder(), parsers=default_parsers()
        )
        self.leases = LeaseTable(LeaseFinisher(self.director), max_leases=max_total, max_leases_per_caller=per_caller)
        self.servicer = PickServicer(self.director, self.datastore.snapshot, leases=self.leases)
        self.authenticator = Authenticator(settings)
        self.guard = PickApiGuard(self.authenticator, self.leases)
        self.ca = ca
        self.server: Any
        if transport == "asyncio":  # llm-epp's own server, as `serve` runs it by default
            context = None
            if ca is not None:
                server_cert = ca.issue("localhost", server=True)
                context = server_context(server_cert.cert, server_cert.key, client_ca=ca.pem)
            methods = pick_api_methods(self.servicer, self.guard)
            self.server = ExtProcServer(
                None, bytes, max_recv=1 << 22, max_send=1 << 22, ssl_context=context, unary=methods
            )
            self.port = self.server.bind("127.0.0.1", 0)
            return
        self.server = grpc.aio.server(interceptors=(self.guard,))
        self.servicer.add_to_server(self.server)
        if ca is not None:
            server_cert = ca.issue("localhost", server=True)
            creds = grpc.ssl_server_credentials(
                [(server_cert.key, server_cert.cert)], root_certificates=ca.pem, require_client_auth=True
            )
            self.port = self.server.add_secure_port("127.0.0.1:0", creds)
        else:
            self.port = self.server.add_insecure_port("127.0.0.1:0")

    def channel(self, client_ca: TestCA | None = None, cn: str = "batch-client") -> grpc.aio.Channel:
        if self.ca is None:
            return grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")
        if client_ca is None:
            creds = grpc.ssl_channel_credentials(root_certificates=self.ca.pem)
        else:
            issued = client_ca.issue(cn)
            creds = grpc.ssl_channel_credentials(
                root_certificates=self.ca.pem, private_key=issued.key, certificate_chain=issued.cert
            )
        return grpc.aio.secure_channel(f"localhost:{self.port}", creds)

    def in_flight(self) -> int:
        return sum(e.load.requests for e in self.datastore.snapshot())


def stub(channel: grpc.aio.Channel) -> Any:
    return picker_pb2_grpc.EndpointPickerStub(channel)  # type: ignore[no-untyped-call]


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


async def code_of(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code()


# --- mTLS ------------------------------------------------------------------------------------------------
@pytest.fixture(params=["grpcio", "asyncio"])
async def mtls(request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    api = Api(AuthSettings(require_client_cert=True), ca=TestCA(), transport=request.param)
    await api.server.start()
    yield api
    await api.server.stop(None)


async def test_a_client_certificate_from_the_ca_is_let_in(mtls: Api) -> None:
    async with mtls.channel(client_ca=mtls.ca) as ch:
        reply = await stub(ch).ListEndpoints(pb.ListEndpointsRequest(), timeout=10)
    assert {e.hostport for e in reply.endpoints} == set(ENDPOINTS.split(","))


@pytest.mark.parametrize("with_cert", [False, True], ids=["no-certificate", "certificate-of-another-ca"])
async def test_without_a_certificate_of_the_ca_nothing_is_readable(mtls: Api, with_cert: bool) -> None:
    async with mtls.channel(client_ca=TestCA("intruder") if with_cert else None) as ch:
        code = await code_of(stub(ch).ListEndpoints(pb.ListEndpointsRequest(), timeout=10))
        assert code == grpc.StatusCode.UNAVAILABLE  # the TLS handshake fails: no RPC runs at all
        code = await code_of(stub(ch).Pick(pb.PickRequest(body=BODY), timeout=10))
        assert code == grpc.StatusCode.UNAVAILABLE
    assert mtls.in_flight() == 0 and len(mtls.leases) == 0


# --- tokens ------------------------------------------------------------------------------------------------
@pytest.fixture
def apiserver() -> Iterator[FakeApiServer]:
    with FakeApiServer() as fake:
        for token, user in {"good": SCHEDULER, "other": "system:serviceaccount:default:web", "user": "alice"}.items():
            fake.add_token(token, user)
        yield fake


@pytest.fixture(params=["grpcio", "asyncio"])
async def tokens(apiserver: FakeApiServer, request: pytest.FixtureRequest) -> AsyncIterator[Api]:
    client = apiserver.api_client()
    reviewer = KubernetesTokenReviewer(client)
    settings = AuthSettings(token_reviewer=reviewer, allowed_service_accounts=("batch/scheduler",))
    api = Api(settings, transport=request.param)
    await api.server.start()
    yield api
    await api.server.stop(None)
    client.close()


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        ((), grpc.StatusCode.UNAUTHENTICATED),
        ((("authorization", "Basic Z29vZA=="),), grpc.StatusCode.UNAUTHENTICATED),
        (bearer("forged"), grpc.StatusCode.UNAUTHENTICATED),
        (bearer("other"), grpc.StatusCode.PERMISSION_DENIED),  # valid, but not an allowed service account
        (bearer("user"), grpc.StatusCode.PERMISSION_DENIED),  # a user, not a service account
    ],
    ids=["no-token", "basic-auth", "forged-token", "other-service-account", "human-user"],
)
async def test_callers_without_an_allowed_token_are_refused(tokens: Api, metadata: Any, expected: Any) -> None:
    async with tokens.channel() as ch:
        for call in (
            stub(ch).ListEndpoints(pb.ListEndpointsRequest(), metadata=metadata, timeout=10),
            stub(ch).Pick(pb.PickRequest(body=BODY), metadata=metadata, timeout=10),
            stub(ch).Release(pb.ReleaseRequest(lease_id="x"), metadata=metadata, timeout=10),
        ):
            assert await code_of(call) == expected
    assert tokens.in_flight() == 0 and len(tokens.leases) == 0


async def test_an_allowed_service_account_is_let_in_and_its_answer_is_cached(
    tokens: Api, apiserver: FakeApiServer
) -> None:
    async with tokens.channel() as ch:
        for _ in range(5):
            reply = await stub(ch).ListEndpoints(pb.ListEndpointsRequest(), metadata=bearer("good"), timeout=10)
            assert len(reply.endpoints) == 3
        pick = await stub(ch).Pick(pb.PickRequest(body=BODY), metadata=bearer("good"), timeout=10)
        assert pick.lease_id
    assert apiserver.count("tokenreviews", "create") == 1


async def test_an_unreachable_api_server_fails_closed(tokens: Api, apiserver: FakeApiServer) -> None:
    apiserver.review_failures = 1
    async with tokens.channel() as ch:
        code = await code_of(stub(ch).ListEndpoints(pb.ListEndpointsRequest(), metadata=bearer("good"), timeout=10))
        assert code == grpc.StatusCode.UNAVAILABLE
        reply = await stub(ch).ListEndpoints(pb.ListEndpointsRequest(), metadata=bearer("good"), timeout=10)
    assert len(reply.endpoints) == 3  # the failure was not cached


async def test_a_lease_can_be_released_only_by_its_owner(apiserver: FakeApiServer) -> None:
    apiserver.add_token("second", "system:serviceaccount:batch:other")
    client = apiserver.api_client()
    api = Api(AuthSettings(token_reviewer=KubernetesTokenReviewer(client), allowed_service_accounts=("batch/*",)))
    await api.server.start()
    try:
        async with api.channel() as ch:
            pick = await stub(ch).Pick(pb.PickRequest(body=BODY), metadata=bearer("good"), timeout=10)
            stolen = await stub(ch).Release(
                pb.ReleaseRequest(lease_id=pick.lease_id), metadata=bearer("second"), timeout=10
            )
            assert stolen.released is False and api.in_flight() == 1
            own = await stub(ch).Release(pb.ReleaseRequest(lease_id=pick.lease_id), metadata=bearer("good"), timeout=10)
            assert own.released is True and api.in_flight() == 0
    finally:
        await api.server.stop(None)
        client.close()


# --- lease caps ----------------------------------------------------------------------------------------------
async def test_leases_are_capped_per_caller_and_in_total_without_overshoot(apiserver: FakeApiServer) -> None:
    for i in range(4):
        apiserver.add_token(f"t{i}", f"system:serviceaccount:batch:c{i}")
    client = apiserver.api_client()
    settings = AuthSettings(token_reviewer=KubernetesTokenReviewer(client), allowed_service_accounts=("batch/*",))
    api = Api(settings, max_total=8, per_caller=3)
    await api.server.start()
    try:
        async with api.channel() as ch:
            s = stub(ch)

            async def pick(token: str, dry_run: bool = False) -> Any:
                return await s.Pick(pb.PickRequest(body=BODY, dry_run=dry_run), metadata=bearer(token), timeout=10)

            results = await asyncio.gather(*(pick("t0") for _ in range(10)), return_exceptions=True)
            granted = [r for r in results if isinstance(r, pb.PickResponse)]
            refused = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
            assert len(granted) == 3 and len(refused) == 7  # concurrent Picks cannot overshoot the cap
            assert {r.code() for r in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
            assert "--pick-api-max-leases-per-caller" in refused[0].details()
            assert api.in_flight() == 3
            assert (await pick("t0", dry_run=True)).endpoint  # a dry run holds nothing and is not capped
            for token in ("t1", "t1", "t1", "t2", "t2"):
                await pick(token)
            assert len(api.leases) == 8
            code = await code_of(pick("t3"))  # a fresh caller meets the total cap
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
            await s.Release(pb.ReleaseRequest(lease_id=granted[0].lease_id), metadata=bearer("t0"), timeout=10)
            assert (await pick("t3")).lease_id  # a released slot is free again
            assert api.in_flight() == 8 == len(api.leases)
    finally:
        await api.server.stop(None)
        client.close()


async def test_a_failed_pick_gives_its_slot_back(tokens: Api) -> None:
    async with tokens.channel() as ch:
        for _ in range(5):  # more failures than the cap of 3
            code = await code_of(stub(ch).Pick(pb.PickRequest(body=b"{not json"), metadata=bearer("good"), timeout=10))
            assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert tokens.leases.held_by(SCHEDULER) == 0
        assert (await stub(ch).Pick(pb.PickRequest(body=BODY), metadata=bearer("good"), timeout=10)).lease_id


async def test_a_lease_keeps_no_request_body(tokens: Api) -> None:
    prompt = "x" * 500_000
    body = json.dumps({"model": "m", "prompt": prompt}).encode()
    async with tokens.channel() as ch:
        reply = await stub(ch).Pick(
            pb.PickRequest(body=body, headers={"x-big": "y" * 100_000}), metadata=bearer("good"), timeout=10
        )
    record = tokens.leases._leases[reply.lease_id].record
    assert record.request is not None
    assert record.request.body.payload == {}
    assert record.parsed is None or record.parsed.body.payload == {}
    assert "x-big" not in record.request.headers
    assert record.endpoint is not None and record.endpoint.hostport == reply.endpoint


# --- settings ------------------------------------------------------------------------------------------------
def test_settings_need_a_mechanism() -> None:
    with pytest.raises(ValueError, match="needs client authentication"):
        AuthSettings()


@pytest.mark.parametrize("entry", ["batch", "/x", "batch/", "a/b/c"], ids=str)
def test_malformed_service_accounts_are_refused(entry: str) -> None:
    with pytest.raises(ValueError, match="namespace/name"):
        parse_service_account(entry)


@pytest.mark.parametrize(
    ("user", "allowed", "expected"),
    [
        (SCHEDULER, ["batch/scheduler"], True),
        (SCHEDULER, ["batch/*"], True),
        (SCHEDULER, ["batch/other", "default/scheduler"], False),
        ("alice", ["batch/*"], False),
        ("system:serviceaccount:batch", ["batch/*"], False),
    ],
    ids=["exact", "namespace-wildcard", "other-names", "not-a-service-account", "truncated-name"],
)
def test_service_account_matching(user: str, allowed: list[str], expected: bool) -> None:
    assert service_account_allowed(user, allowed) is expected


async def test_refused_calls_log_one_info_line_per_interval(
    tokens: Api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from llm_epp.pickapi import auth

    monkeypatch.setattr(auth, "_log_rejection", InfoOncePerInterval(auth.log).log)  # a fresh interval
    caplog.set_level(VERBOSE, logger=auth.log.name)
    async with tokens.channel() as ch:
        for _ in range(4):
            call = stub(ch).ListEndpoints(pb.ListEndpointsRequest(), metadata=bearer("forged"), timeout=10)
            assert await code_of(call) == grpc.StatusCode.UNAUTHENTICATED
    refusals = [r for r in caplog.records if r.getMessage().startswith("pick_api_unauthorized")]
    assert [r.levelno for r in refusals] == [logging.INFO, VERBOSE, VERBOSE, VERBOSE]
