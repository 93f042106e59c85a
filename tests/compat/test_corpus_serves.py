"""Every configuration of the upstream corpus that loads also serves real traffic: `llm-epp serve` with it,
behind a real Envoy, in front of three loopback pods with the `llm-d.ai/role` labels of a P/D pool
(decode, prefill, both). Each request is answered by exactly one pod; configurations that decode on a
filtered pod set pick a pod that can decode; the always-disaggregate configurations also name a pod that
can prefill in `x-prefiller-host-port`."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from llm_epp.gateway.envoy_config import EnvoyConfigOptions, build_bootstrap
from llm_epp.gateway.envoy_process import EnvoyProcess
from llm_epp.gateway.epp_process import EppProcess
from llm_epp.sim.stub import BackendPool
from tests.compat.test_corpus import CONFIGS, FILES, NOT_YET
from tests.support.ports import free_port

pytestmark = pytest.mark.envoy

ROLES = ("decode", "prefill", "both")
CAN_DECODE = {"decode", "both"}
CAN_PREFILL = {"prefill", "both"}
GRPC_ONLY = {"gie-chart-grpc-parser.yaml"}
"""Configurations whose only parser speaks gRPC: `tests/envoy/test_grpc_parsers.py` serves them."""
SERVABLE = [name for name in FILES if name not in NOT_YET and name not in GRPC_ONLY]
_ZMQ_BIND = re.compile(r"tcp://\*:\d+")
_PRIMARY_PORT = re.compile(r"primaryPort: \d+")


@pytest.fixture(scope="module")
def pods() -> Iterator[BackendPool]:
    with BackendPool(len(ROLES), names=ROLES) as pool:
        yield pool


def _endpoints_file(pods: BackendPool, directory: Path) -> Path:
    entries = [
        {
            "name": role,
            "address": b.address.rsplit(":", 1)[0],
            "port": int(b.address.rsplit(":", 1)[1]),
            "labels": {"llm-d.ai/role": role},
        }
        for role, b in zip(ROLES, pods.backends, strict=True)
    ]
    path = directory / "endpoints.yaml"
    path.write_text(yaml.safe_dump({"endpoints": entries}))
    return path


def _config_for_loopback(text: str, primary_port: int) -> str:
    """Upstream KV-event configs bind every interface on a fixed port; here: a free loopback port. The
    data-parallel handler sends every request to one primary port; here: the port of the `both` pod."""
    text = _ZMQ_BIND.sub(lambda _: f"tcp://127.0.0.1:{free_port()}", text)
    return _PRIMARY_PORT.sub(f"primaryPort: {primary_port}", text)


@pytest.mark.parametrize("name", SERVABLE)
def test_a_loadable_upstream_config_serves_traffic_through_envoy(name: str, pods: BackendPool, tmp_path: Path) -> None:
    pods.reset()
    text = (CONFIGS / name).read_text()
    config = tmp_path / name
    by_address = {b.address: role for role, b in zip(ROLES, pods.backends, strict=True)}
    both = pods.backends[ROLES.index("both")].address
    config.write_text(_config_for_loopback(text, int(both.rsplit(":", 1)[1])))
    epp = EppProcess(
        "--endpoints-file",
        str(_endpoints_file(pods, tmp_path)),
        "--config-file",
        str(config),
        "--secure-serving=false",
        "--allow-experimental-plugins",  # upstream's agentic guide starts its EPP with it too
    )
    epp.start()
    try:
        envoy = EnvoyProcess(
            build_bootstrap(EnvoyConfigOptions(listen_port=0, admin_port=0, epp_port=epp.grpc_port, epp_tls=False))
        )
        envoy.start()
        try:
            for i in range(3):
                r = httpx.post(
                    envoy.url("/v1/completions"),
                    json={"model": "m", "prompt": f"request {i} of {name}", "max_tokens": 4},
                    timeout=30,
                )
                assert r.status_code == 200, f"{name}: {r.status_code} {r.text}\n{epp.log()[-3000:]}"
        finally:
            envoy.stop()
    finally:
        epp.stop()

    # Only this test's requests count: the other test worker may send to a loopback port one of these pods
    # took over from a pod it stopped (a dead-pod test's first requests, say).
    mine = [f"request {i} of {name}" for i in range(3)]
    served = {
        pod.name: [r for r in pod.served_requests() if any(m.encode() in r.body for m in mine)] for pod in pods.backends
    }
    prompts = sorted(r.json()["prompt"] for reqs in served.values() for r in reqs)
    assert prompts == sorted(mine), {
        pod.name: [(r.path, r.body[:120]) for r in pod.served_requests()] for pod in pods.backends
    }
    decoders = {role for role, reqs in served.items() if reqs}
    if "data-parallel-profile-handler" in text:
        # Envoy connects to the primary port; the rank the EPP chose travels in a header
        assert decoders == {"both"}
        decoders = {by_address.get(req.headers.get("x-data-parallel-host-port", "")) for req in served["both"]}
    if "decode-filter" in text or "decode-role" in text:
        assert decoders <= CAN_DECODE, f"{name} decoded on {decoders}"
    if "always-disagg-pd-decider" in text:
        for reqs in served.values():
            for req in reqs:
                prefiller = req.headers.get("x-prefiller-host-port", "")
                assert by_address.get(prefiller) in CAN_PREFILL, f"{name}: x-prefiller-host-port {prefiller!r}"
