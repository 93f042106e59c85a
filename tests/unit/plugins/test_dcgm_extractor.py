"""Tests for dcgm-extractor (pure part): GPU utilization of an endpoint from a real DCGM Exporter page,
sidecar and DaemonSet shapes."""

from __future__ import annotations

from llm_epp.datalayer.exposition import parse
from llm_epp.framework import EndpointKey, EndpointMetadata
from llm_epp.plugins.datalayer.dcgm_extractor import GPU_UTIL, KEY, DcgmExtractor, pod_name

# dcgm-exporter 3.x output (DaemonSet, DCGM_EXPORTER_KUBERNETES=true): one series per GPU
_COMMON = 'modelName="NVIDIA H100 80GB HBM3",Hostname="node-a",DCGM_FI_DRIVER_VERSION="550.54.15",container="vllm"'
DAEMONSET = "\n".join(
    [
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-1",device="nvidia0",{_COMMON},namespace="llm",pod="vllm-0"}} 37',
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="GPU-2",device="nvidia1",{_COMMON},namespace="llm",pod="vllm-0"}} 81',
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="2",UUID="GPU-3",device="nvidia2",{_COMMON},namespace="llm",pod="vllm-1"}} 12',
        "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).",
        "# TYPE DCGM_FI_DEV_FB_USED gauge",
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-1",pod="vllm-0"} 71234',
        "",
    ]
).encode()
SIDECAR = b"""\
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-9",device="nvidia0",Hostname="vllm-7"} 55
"""


def _md(name: str) -> EndpointMetadata:
    return EndpointMetadata(EndpointKey("llm", name), "10.0.0.1", 8000)


def _extract(page: bytes, name: str) -> tuple[object, tuple[str, ...]]:
    ex = DcgmExtractor()
    md = _md(name)
    result = ex.extract_attributes(parse(page, ex.families(md)), md)
    return result.values.get(KEY), result.problems


def test_daemonset_page_uses_the_busiest_gpu_of_the_endpoints_pod() -> None:
    assert _extract(DAEMONSET, "vllm-0") == (0.81, ())
    assert _extract(DAEMONSET, "vllm-1") == (0.12, ())
    assert _extract(DAEMONSET, "vllm-1-rank-0") == (0.12, ())


def test_sidecar_page_without_pod_labels_counts_for_the_endpoint() -> None:
    assert _extract(SIDECAR, "anything") == (0.55, ())


def test_missing_metric_or_pod_is_a_problem_not_a_value() -> None:
    value, problems = _extract(DAEMONSET, "vllm-9")
    assert value is None and "no series for pod 'vllm-9'" in problems[0]
    value, problems = _extract(b"# nothing\n", "vllm-0")
    assert value is None and GPU_UTIL in problems[0]


def test_only_the_gpu_util_family_is_parsed() -> None:
    assert DcgmExtractor().families(_md("a")) == frozenset({"DCGM_FI_DEV_GPU_UTIL"})
    assert KEY == "GPUUtilization/dcgm-extractor"
    assert pod_name(_md("p-rank-12")) == "p"
