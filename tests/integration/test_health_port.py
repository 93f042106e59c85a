"""`llm-epp serve`'s gRPC health port is served like the ext_proc port (`--grpc-transport`): on asyncio by
llm-epp's own server, so a process without the direct-routing API runs no grpcio server and none of its
threads; on grpcio by grpcio. Either way a gRPC client reads the same statuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_epp.api.v1 import picker_pb2 as pb
from llm_epp.gateway.epp_process import EppProcess
from llm_epp.observability.health import SERVING
from tests.support.health import health
from tests.support.pickapi import PickApiAccess

EXT_PROC = "envoy.service.ext_proc.v3.ExternalProcessor"


def thread_names(pid: int) -> set[str]:
    return {(task / "comm").read_text().strip() for task in Path(f"/proc/{pid}/task").iterdir()}


@pytest.mark.parametrize("transport", ["asyncio", "grpcio"])
def test_the_health_port_is_served_by_the_chosen_transport(transport: str) -> None:
    with EppProcess("--endpoints", "127.0.0.1:1", "--secure-serving=false", "--grpc-transport", transport) as epp:
        port = epp.ports["health"]
        assert health(port, "") == SERVING
        assert health(port, EXT_PROC) == SERVING
        grpc_threads = {name for name in thread_names(epp.pid) if name.startswith(("grpc", "event_engine"))}
        if transport == "asyncio":
            assert not grpc_threads, grpc_threads
        else:
            assert grpc_threads


def test_the_direct_routing_api_is_served_without_grpcio_by_default(tmp_path: Path) -> None:
    """With the API on its own mTLS port, the default transport serves it too: a certified client's call is
    answered, and the process still runs none of grpcio's threads."""
    access = PickApiAccess(tmp_path)
    with EppProcess("--endpoints", "127.0.0.1:1,127.0.0.1:2", *access.args) as epp:
        with access.channel() as channel:
            reply = access.stub(channel).ListEndpoints(pb.ListEndpointsRequest(), timeout=10)
        # nothing listens at either address: whether they are listed yet depends on the first scrapes
        assert {e.hostport for e in reply.endpoints} <= {"127.0.0.1:1", "127.0.0.1:2"}
        assert not {name for name in thread_names(epp.pid) if name.startswith(("grpc", "event_engine"))}
