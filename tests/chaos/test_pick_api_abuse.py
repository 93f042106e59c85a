"""Abuse of the direct-routing API against a real `llm-epp serve` process behind a real Envoy: closed by
default, authenticated when on, and bounded in leases and memory whatever a caller sends."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
import yaml

from llm_epp.api.v1 import picker_pb2 as pb
from llm_epp.api.v1 import picker_pb2_grpc
from llm_epp.sim.stub import BackendPool
from tests.envoy.conftest import start_stack, stop_stack
from tests.support.fake_apiserver import FakeApiServer

pytestmark = pytest.mark.envoy

TOKEN = "batch-token"


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def completions(url: str, n: int) -> list[int]:
    with httpx.Client(timeout=30) as c:
        return [c.post(url, json={"model": "m", "prompt": f"hello {i}", "max_tokens": 2}).status_code for i in range(n)]


def stub(port: int) -> tuple[grpc.Channel, picker_pb2_grpc.EndpointPickerStub]:
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20)])
    return channel, picker_pb2_grpc.EndpointPickerStub(channel)  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def backends() -> Iterator[BackendPool]:
    with BackendPool(3) as pool:
        yield pool


def test_the_api_is_closed_by_default(backends: BackendPool) -> None:
    stack = start_stack(backends)
    try:
        assert completions(stack.url("/v1/completions"), 10) == [200] * 10
        channel, s = stub(stack.epp.grpc_port)
        with channel:
            for call in (
                lambda: s.ListEndpoints(pb.ListEndpointsRequest(), timeout=10),
                lambda: s.Pick(pb.PickRequest(body=b'{"model":"m","prompt":"x"}'), timeout=10),
            ):
                with pytest.raises(grpc.RpcError) as info:
                    call()
                assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        stop_stack(stack)


@pytest.fixture
def apiserver(tmp_path: Path) -> Iterator[tuple[FakeApiServer, Path]]:
    with FakeApiServer() as fake:
        fake.add_token(TOKEN, "system:serviceaccount:batch:scheduler")
        fake.add_token("web", "system:serviceaccount:web:frontend")
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "t", "cluster": {"server": fake.url}}],
            "users": [{"name": "t", "user": {"token": "epp"}}],
            "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}],
            "current-context": "t",
        }
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(config))
        yield fake, path


def test_tokens_on_the_ext_proc_port_leases_capped_and_memory_bounded(
    backends: BackendPool, apiserver: tuple[FakeApiServer, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake, kubeconfig = apiserver
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    cap = 40
    stack = start_stack(
        backends,
        epp_args=(
            "--enable-pick-api",
            "--pick-api-token-review",
            "--pick-api-allowed-service-accounts",
            "batch/scheduler",
            "--pick-api-max-leases-per-caller",
            str(cap),
            "--max-request-body-bytes",
            "4Mi",
            "--metrics-endpoint-auth=false",  # the test reads the EPP's memory from /metrics
        ),
    )
    try:
        # ext_proc streams pass the guard untouched: traffic through Envoy is served
        assert completions(stack.url("/v1/completions"), 10) == [200] * 10
        channel, s = stub(stack.epp.grpc_port)
        with channel:
            for metadata, code in (
                ((), grpc.StatusCode.UNAUTHENTICATED),
                ((("authorization", "Bearer forged"),), grpc.StatusCode.UNAUTHENTICATED),
                ((("authorization", "Bearer web"),), grpc.StatusCode.PERMISSION_DENIED),
            ):
                with pytest.raises(grpc.RpcError) as info:
                    s.ListEndpoints(pb.ListEndpointsRequest(), metadata=metadata, timeout=10)
                assert info.value.code() == code
            auth = (("authorization", f"Bearer {TOKEN}"),)
            assert len(s.ListEndpoints(pb.ListEndpointsRequest(), metadata=auth, timeout=10).endpoints) == 3
            body = json.dumps({"model": "m", "prompt": "z" * (3 << 20)}).encode()  # 3 MiB per lease
            before = rss_bytes(stack.epp.pid)
            granted = refused = 0
            for _ in range(cap + 20):
                try:
                    s.Pick(pb.PickRequest(body=body, lease_ttl_seconds=3600), metadata=auth, timeout=30)
                    granted += 1
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
                    refused += 1
            growth = rss_bytes(stack.epp.pid) - before
        assert (granted, refused) == (cap, 20)
        # 40 leases holding their 3 MiB bodies (the bytes and the decoded prompt) would add over 240 MiB; what
        # remains is the allocator keeping freed request buffers (RSS is noisy on a loaded machine)
        assert growth < 100 << 20, f"EPP memory grew by {growth >> 20} MiB for {cap} leases"
        # model names nothing configured or served are labelled "other" (client-chosen labels are bounded)
        in_flight = sum(
            stack.epp.metric_value("inference_objective_running_requests", model_name=m) for m in ("m", "other")
        )
        assert in_flight == cap  # the leases hold their load; the refused Picks hold nothing
        assert fake.count("tokenreviews", "create") <= 4  # answers are cached
    finally:
        stop_stack(stack)
