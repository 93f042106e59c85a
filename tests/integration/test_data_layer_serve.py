"""`llm-epp serve` with the data layer of llm-d-router's GPU-aware configuration and endpoints from a
`file-discovery` file, no Kubernetes: real model-server stand-ins and a DCGM exporter page on 127.0.0.1,
requests over the ext_proc gRPC protocol. The busy GPU's pod is filtered out; an endpoint added to the
watched file is routed to once its GPU is the least busy."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from llm_epp.gateway.epp_process import EppProcess
from tests.envoy.test_kubernetes_pool import NS, kubeconfig, pod
from tests.support.fake_apiserver import FakeApiServer
from tests.support.wait import wait_until
from tests.unit.datalayer.page_server import PageServer, Route
from tests.unit.datalayer.test_sources import dcgm_page
from tests.unit.extproc.fake_envoy import body_msg, headers_msg

TESTDATA = Path(__file__).parents[1] / "unit" / "datalayer" / "testdata"
DEST = "x-gateway-destination-endpoint"

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: file-discovery
  parameters: {{path: {path}, watchFile: true}}
- type: dcgm-data-source
  name: dcgm-source
  parameters: {{port: {dcgm_port}, interval: 100ms}}
- type: dcgm-extractor
- type: endpoint-attribute-filter
  name: gpu-filter
  parameters:
    attribute: GPUUtilization/dcgm-extractor
    fallbackOnEmpty: true
    algorithm: {{type: threshold, threshold: {{operator: LessThanOrEqual, value: 0.9}}}}
- type: endpoint-attribute-scorer
  name: gpu-scorer
  parameters:
    attributeKey: GPUUtilization/dcgm-extractor
    algorithm: {{type: linear_lower_is_better, normalization: {{fixedRange: {{min: 0, max: 1}}}}}}
- type: max-score-picker
dataLayer:
  discovery: {{pluginRef: file-discovery}}
  sources:
  - pluginRef: dcgm-source
    extractors: [{{pluginRef: dcgm-extractor}}]
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: gpu-filter
  - pluginRef: gpu-scorer
  - pluginRef: max-score-picker
"""


def endpoints_file(path: Path, ports: list[int], bump: int) -> None:
    lines = ["endpoints:"] + [f'- {{name: vllm-{i}, address: 127.0.0.1, port: "{p}"}}' for i, p in enumerate(ports)]
    path.write_text("\n".join(lines) + "\n")
    st = path.stat()
    os.utime(path, (st.st_atime + bump, st.st_mtime + bump))


async def route(channel: grpc.aio.Channel) -> str:
    """One chat request through ext_proc; the endpoint the EPP picked."""
    call = channel.stream_stream(
        "/envoy.service.ext_proc.v3.ExternalProcessor/Process",
        request_serializer=pb.ProcessingRequest.SerializeToString,
        response_deserializer=pb.ProcessingResponse.FromString,
    )()
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    await call.write(
        headers_msg({":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"})
    )
    await call.write(body_msg(body, eos=True))
    try:
        async for resp in call:
            for which in ("request_headers", "request_body"):
                if resp.HasField(which):
                    for h in getattr(resp, which).response.header_mutation.set_headers:
                        if h.header.key == DEST:
                            return (h.header.raw_value or h.header.value.encode()).decode()
        raise AssertionError("no destination in the EPP's answers")
    finally:
        call.cancel()


async def picks(channel: grpc.aio.Channel, n: int = 6) -> set[str]:
    return {await route(channel) for _ in range(n)}


async def test_gpu_aware_routing_over_file_discovery(tmp_path: Path) -> None:
    pods = [PageServer(routes={"/metrics": Route((TESTDATA / "vllm.txt").read_bytes())}) for _ in range(3)]
    gpu = {"vllm-0": [97.0], "vllm-1": [40.0], "vllm-2": [5.0]}
    dcgm = PageServer(routes={"/metrics": Route(dcgm_page(gpu))})
    async with dcgm, pods[0], pods[1], pods[2]:
        ports = [p.port for p in pods]
        eps = tmp_path / "endpoints.yaml"
        endpoints_file(eps, ports[:2], 0)
        config = tmp_path / "epp.yaml"
        config.write_text(CONFIG.format(path=eps, dcgm_port=dcgm.port))
        epp = EppProcess("--config-file", str(config), "--secure-serving=false", "--allow-experimental-plugins")
        await asyncio.to_thread(epp.start)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{epp.grpc_port}") as channel:
                async with asyncio.timeout(30):
                    while dcgm.hits["/metrics"] < 6:  # noqa: ASYNC110 (both endpoints' GPUs have been read)
                        await asyncio.sleep(0.05)
                    # vllm-0's GPU is 97 % busy: filtered out; vllm-1 is the least busy of the rest
                    assert await picks(channel) == {f"127.0.0.1:{ports[1]}"}
                    endpoints_file(eps, ports, 5)  # vllm-2 joins through the watched file
                    while await picks(channel, 2) != {f"127.0.0.1:{ports[2]}"}:  # noqa: ASYNC110
                        await asyncio.sleep(0.2)
            log = epp.log()
            assert "discovery mode" in log
        finally:
            await asyncio.to_thread(epp.stop)


def test_kubernetes_notification_sources_watch_the_pool_namespace(tmp_path: Path) -> None:
    """topology-extractor adds its Pod notification source; with --pool-name it watches the pool's namespace."""
    config = tmp_path / "epp.yaml"
    config.write_text(
        "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
        "- type: topology-extractor\n- type: topology-affinity-scorer\n- type: queue-scorer\n"
        "schedulingProfiles:\n- name: default\n  plugins:\n"
        "  - pluginRef: topology-affinity-scorer\n  - pluginRef: queue-scorer\n"
    )
    with FakeApiServer() as api:
        api.create(
            "inferencepools",
            {
                "metadata": {"name": "demo", "namespace": NS},
                "spec": {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": [{"number": 8000}]},
            },
        )
        api.create("pods", pod("vllm-0"))
        env = {"KUBECONFIG": str(kubeconfig(tmp_path / "kubeconfig", api.url))}
        args = ("--pool-name", "demo", "--pool-namespace", NS, "--config-file", str(config))
        with EppProcess(*args, "--secure-serving=false", "--allow-experimental-plugins", env=env) as epp:
            wait_until(lambda: "k8s_notification_source_synced" in epp.log(), "the Pod notification source to list")
            assert f"path=/api/v1/namespaces/{NS}/pods objects=1" in epp.log()
