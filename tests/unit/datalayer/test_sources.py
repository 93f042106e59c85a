"""Several data sources at once, from a configuration to the scheduler: a vLLM /metrics page, a DCGM
exporter page (DaemonSet shape, one series per GPU with `pod` labels) and vLLM's /v1/models answer, each
served by a real HTTP server on 127.0.0.1, polled by the data layer built from `dataLayer.sources`, and read
by endpoint-attribute-filter / -scorer in a scheduling cycle."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from llm_epp.config import load_config_text
from llm_epp.datalayer.datastore import Datastore
from llm_epp.datalayer.runtime import DataLayer, base_tick, build_data_layer, effective_interval
from llm_epp.framework import CycleState, EndpointKey, EndpointMetadata, NullRecorder
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.datalayer.dcgm_extractor import KEY as GPU_KEY
from llm_epp.plugins.datalayer.models_data_extractor import KEY as MODELS_KEY
from llm_epp.plugins.datalayer.models_data_extractor import ModelData
from tests.unit.builders import request
from tests.unit.datalayer.page_server import PageServer, Route

TESTDATA = Path(__file__).parent / "testdata"
JSON = "application/json"


def dcgm_page(utilization: dict[str, list[float]]) -> bytes:
    """A dcgm-exporter page as the DaemonSet serves it with DCGM_EXPORTER_KUBERNETES=true."""
    lines = [
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
    ]
    gpu = 0
    for pod, values in utilization.items():
        for v in values:
            lines.append(
                f'DCGM_FI_DEV_GPU_UTIL{{gpu="{gpu}",UUID="GPU-{gpu}",device="nvidia{gpu}",'
                f'modelName="NVIDIA H100 80GB HBM3",Hostname="node-a",container="vllm",namespace="ns",pod="{pod}"}} {v}'
            )
            gpu += 1
    lines += [
        "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).",
        "# TYPE DCGM_FI_DEV_FB_USED gauge",
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-0",pod="vllm-0"} 71234',
        "",
    ]
    return "\n".join(lines).encode()


def models_body(*ids: tuple[str, str | None]) -> bytes:
    """vLLM's /v1/models answer: the base model and its LoRA adapters (with `parent`)."""
    data = [
        {
            "id": i,
            "object": "model",
            "created": 1735689600,
            "owned_by": "vllm",
            "root": parent or i,
            "parent": parent,
            "max_model_len": 32768,
            "permission": [],
        }
        for i, parent in ids
    ]
    return json.dumps({"object": "list", "data": data}).encode()


CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: metrics-data-source
- type: core-metrics-extractor
- type: dcgm-data-source
  name: dcgm-source
  parameters:
    port: {dcgm_port}
    interval: 100ms
- type: dcgm-extractor
- type: models-data-source
- type: models-data-extractor
- type: endpoint-attribute-filter
  name: gpu-filter
  parameters:
    attribute: GPUUtilization/dcgm-extractor
    onMissing: Pass
    fallbackOnEmpty: true
    algorithm: {{type: threshold, threshold: {{operator: LessThanOrEqual, value: 0.9}}}}
- type: endpoint-attribute-scorer
  name: gpu-scorer
  parameters:
    attributeKey: GPUUtilization/dcgm-extractor
    algorithm: {{type: linear_lower_is_better, normalization: {{fixedRange: {{min: 0, max: 1}}}}}}
- type: max-score-picker
- type: single-profile-handler
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors: [{{pluginRef: core-metrics-extractor}}]
  - pluginRef: dcgm-source
    extractors: [{{pluginRef: dcgm-extractor}}]
  - pluginRef: models-data-source
    extractors: [{{pluginRef: models-data-extractor}}]
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: gpu-filter
  - pluginRef: gpu-scorer
  - pluginRef: max-score-picker
"""


class Recorded:
    def __init__(self) -> None:
        self.poll_errors: list[str] = []
        self.extract_errors: list[tuple[str, str]] = []

    def datalayer_poll_error(self, source_type: str) -> None:
        self.poll_errors.append(source_type)

    def datalayer_extract_error(self, source_type: str, extractor_type: str) -> None:
        self.extract_errors.append((source_type, extractor_type))


async def eventually(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(5.0):
        while not check():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def running(layer: DataLayer) -> AsyncIterator[None]:
    task = asyncio.create_task(layer.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def pod_server(models: bytes) -> PageServer:
    return PageServer(
        routes={
            "/metrics": Route((TESTDATA / "vllm.txt").read_bytes()),
            "/v1/models": Route(models, content_type=JSON),
        }
    )


async def test_every_configured_source_is_polled_and_the_scheduler_reads_the_gpu_attributes() -> None:
    dcgm = PageServer(routes={"/metrics": Route(dcgm_page({"vllm-0": [37, 95], "vllm-1": [12], "vllm-2": [60]}))})
    pods = [
        pod_server(models_body(("meta-llama/Llama-3.1-8B-Instruct", None))),
        pod_server(
            models_body(("meta-llama/Llama-3.1-8B-Instruct", None), ("sql-lora", "meta-llama/Llama-3.1-8B-Instruct"))
        ),
        pod_server(models_body(("Qwen/Qwen3-8B", None))),
    ]
    async with dcgm, pods[0], pods[1], pods[2]:
        config = load_config_text(CONFIG.format(dcgm_port=dcgm.port), builtin_registry(), NullRecorder())
        ds = Datastore("pool")
        ds.replace_all(
            EndpointMetadata(EndpointKey("ns", f"vllm-{i}-rank-0"), "127.0.0.1", srv.port) for i, srv in enumerate(pods)
        )
        errors = Recorded()
        layer = build_data_layer(
            ds, [(b.source, b.extractors) for b in config.data_sources], refresh_interval=0.05, errors=errors
        )
        assert layer.metrics is not None
        assert [s.source.typed_name.type for s in layer.sources] == ["dcgm-data-source", "models-data-source"]
        async with running(layer):
            await eventually(
                lambda: all(
                    GPU_KEY in e.attributes and MODELS_KEY in e.attributes and e.metrics.update_time > 0
                    for e in ds.snapshot()
                )
            )
        by_name = {e.key.name: e for e in ds.snapshot()}
        # the busiest GPU of each pod, as a fraction
        assert {n: e.attributes[GPU_KEY] for n, e in by_name.items()} == {
            "vllm-0-rank-0": 0.95,
            "vllm-1-rank-0": 0.12,
            "vllm-2-rank-0": 0.60,
        }
        assert by_name["vllm-1-rank-0"].attributes[MODELS_KEY] == (
            ModelData("meta-llama/Llama-3.1-8B-Instruct", "", "model", "vllm", 1735689600),
            ModelData("sql-lora", "meta-llama/Llama-3.1-8B-Instruct", "model", "vllm", 1735689600),
        )
        assert errors.poll_errors == []
        # the scheduler: vllm-0 (95 % busy) is filtered out, the least busy GPU wins
        result = config.scheduler.schedule(request(), ds.snapshot())
        assert result.primary is not None
        assert result.primary.target_endpoints[0].key.name == "vllm-1-rank-0"
        profile = config.scheduler.profiles["default"]
        kept = profile.filters[0].filter(CycleState(), request(), ds.snapshot())
        assert sorted(e.key.name for e in kept) == ["vllm-1-rank-0", "vllm-2-rank-0"]


async def test_a_dead_exporter_is_counted_and_never_takes_the_endpoint_out() -> None:
    pod = pod_server(models_body(("m", None)))
    async with pod:
        closed = PageServer()
        await closed.start()
        dead_port = closed.port
        await closed.stop()
        config = load_config_text(CONFIG.format(dcgm_port=dead_port), builtin_registry(), NullRecorder())
        ds = Datastore("pool")
        ds.replace_all([EndpointMetadata(EndpointKey("ns", "vllm-0-rank-0"), "127.0.0.1", pod.port)])
        errors = Recorded()
        layer = build_data_layer(
            ds, [(b.source, b.extractors) for b in config.data_sources], refresh_interval=0.05, errors=errors
        )
        async with running(layer):
            await eventually(lambda: "dcgm-data-source" in errors.poll_errors)
            await eventually(lambda: all(MODELS_KEY in e.attributes for e in ds.snapshot()))
        assert [e.key.name for e in ds.snapshot()] == ["vllm-0-rank-0"]
        assert ds.is_reachable(EndpointKey("ns", "vllm-0-rank-0"))
        assert GPU_KEY not in ds.snapshot()[0].attributes
        state = layer.sources[0].state(EndpointKey("ns", "vllm-0-rank-0"))
        assert state is not None and state.failure == "connection refused"


async def test_a_page_without_the_gpu_metric_is_an_extract_error_and_attributes_of_removed_endpoints_go() -> None:
    dcgm = PageServer(routes={"/metrics": Route(b"# TYPE DCGM_FI_DEV_FB_USED gauge\nDCGM_FI_DEV_FB_USED 1\n")})
    pod = pod_server(b'{"object": "list", "data": "not a list"}')
    async with dcgm, pod:
        config = load_config_text(CONFIG.format(dcgm_port=dcgm.port), builtin_registry(), NullRecorder())
        ds = Datastore("pool")
        key = EndpointKey("ns", "vllm-0-rank-0")
        ds.replace_all([EndpointMetadata(key, "127.0.0.1", pod.port)])
        errors = Recorded()
        layer = build_data_layer(
            ds, [(b.source, b.extractors) for b in config.data_sources], refresh_interval=0.05, errors=errors
        )
        async with running(layer):
            await eventually(
                lambda: (
                    {("dcgm-data-source", "dcgm-extractor"), ("models-data-source", "models-data-extractor")}
                    <= set(errors.extract_errors)
                )
            )
            ds.update_attributes(key, {"x/test": 1.0})
            assert ds.snapshot()[0].attributes["x/test"] == 1.0
            ds.replace_all([])
            ds.replace_all([EndpointMetadata(key, "127.0.0.1", pod.port)])
            assert "x/test" not in ds.snapshot()[0].attributes
        assert errors.poll_errors == []


def test_source_intervals_round_to_the_base_tick_as_upstream() -> None:
    assert base_tick(0.05, [0.0, 1.0]) == 0.05
    assert base_tick(1.0, [0.2, 0.0]) == 0.2  # the smallest source interval lowers the tick
    assert base_tick(1.0, [0.01]) == 0.05  # ... not below 50 ms
    assert base_tick(0.01, [0.02]) == 0.01  # a smaller flag value stays
    assert effective_interval(0.05, 0.0) == 0.05
    assert effective_interval(0.05, 1.0) == pytest.approx(1.0)
    assert effective_interval(0.2, 0.5) == pytest.approx(0.6)  # 2.5 ticks: half rounds up, as Go's math.Round
    assert effective_interval(0.2, 0.7) == pytest.approx(0.8)
    assert effective_interval(0.2, 0.05) == pytest.approx(0.2)


async def test_the_configured_intervals_reach_the_pollers() -> None:
    config = load_config_text(CONFIG.format(dcgm_port=9400), builtin_registry(), NullRecorder())
    layer = build_data_layer(Datastore(), [(b.source, b.extractors) for b in config.data_sources], refresh_interval=1.0)
    assert layer.metrics is not None
    assert layer.metrics.interval == pytest.approx(0.1)  # base tick lowered to dcgm's 100ms
    assert [s.interval for s in layer.sources] == [pytest.approx(0.1), pytest.approx(0.1)]


async def test_custom_metrics_of_the_metrics_source_reach_the_attribute_filter() -> None:
    page = (
        b"vllm:num_requests_waiting 1\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n"
        b'my_queue{tier="silver"} 1\nmy_queue{tier="gold"} 40\n'
    )
    busy, idle = (
        PageServer(routes={"/metrics": Route(page)}),
        PageServer(routes={"/metrics": Route(page.replace(b"} 40", b"} 3"))}),
    )
    text = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: core-metrics-extractor
  parameters:
    engineConfigs:
    - name: vllm
      queuedRequestsSpec: vllm:num_requests_waiting
      runningRequestsSpec: vllm:num_requests_running
      kvUsageSpec: vllm:kv_cache_usage_perc
      customMetrics: [{attributeKey: gold_queue, metricSpec: 'my_queue{tier="gold"}'}]
- type: endpoint-attribute-filter
  parameters:
    attribute: gold_queue
    algorithm: {type: threshold, threshold: {operator: LessThan, value: 10}}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: endpoint-attribute-filter}, {pluginRef: max-score-picker}]
"""
    async with busy, idle:
        config = load_config_text(text, builtin_registry(), NullRecorder())
        ds = Datastore("pool")
        ds.replace_all(
            EndpointMetadata(EndpointKey("ns", n), "127.0.0.1", s.port) for n, s in (("busy", busy), ("idle", idle))
        )
        layer = build_data_layer(ds, [(b.source, b.extractors) for b in config.data_sources], refresh_interval=0.05)
        async with running(layer):
            await eventually(lambda: all("gold_queue/core-metrics-extractor" in e.attributes for e in ds.snapshot()))
        kept = config.scheduler.profiles["default"].filters[0].filter(CycleState(), request(), ds.snapshot())
        assert [e.key.name for e in kept] == ["idle"]
