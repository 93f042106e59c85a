"""vLLM-compatible Prometheus metrics for a live simulated pod (``/metrics`` of :mod:`llm_epp.sim.server`).

Names, types and histogram buckets follow vLLM V1 (``vllm/v1/metrics/loggers.py``): counters are exposed
with ``_total``; every series carries ``model_name`` and ``engine="0"`` except ``vllm:lora_requests_info``
(labels ``max_lora``, ``running_lora_adapters``, ``waiting_lora_adapters``; value = the current Unix time).
Latency histograms are observed in *modelled* seconds (wall time divided by the pod's time scale).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Sequence

from llm_epp.sim.engine import EngineMetrics

__all__ = ["E2E_BUCKETS", "ITL_BUCKETS", "TTFT_BUCKETS", "Histogram", "PodMetrics", "render"]

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
)  # fmt: skip
FINISHED_REASONS = ("stop", "length", "abort")


class Histogram:
    """A cumulative Prometheus histogram with fixed upper bounds (``+Inf`` implied)."""

    __slots__ = ("buckets", "count", "counts", "sum")

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out: list[str] = []
        acc = 0
        bounds = [repr(float(b)) for b in self.buckets] + ["+Inf"]
        for le, n in zip(bounds, self.counts, strict=True):
            acc += n
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {float(acc)!r}')
        out.append(f"{name}_count{{{labels}}} {float(self.count)!r}")
        out.append(f"{name}_sum{{{labels}}} {self.sum!r}")
        return out


class PodMetrics:
    """What the live pod observes on top of the engine snapshot."""

    def __init__(self) -> None:
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.success: dict[str, int] = dict.fromkeys(FINISHED_REASONS, 0)


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(model: str, snap: EngineMetrics, pod: PodMetrics, *, lora_enabled: bool, now: float | None = None) -> str:
    """The text exposition (format 0.0.4) of one pod."""
    base = f'engine="0",model_name="{_esc(model)}"'
    out: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[str]) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        out.extend(samples)

    def single(name: str, kind: str, help_text: str, value: float) -> None:
        sample = name + ("_total" if kind == "counter" else "")
        family(name if kind != "counter" else sample, kind, help_text, [f"{sample}{{{base}}} {float(value)!r}"])

    single("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
           snap.num_requests_running)  # fmt: skip
    single("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
           snap.num_requests_waiting)  # fmt: skip
    single("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
           snap.kv_cache_usage_perc)  # fmt: skip
    single("vllm:prefix_cache_queries", "counter",
           "Prefix cache queries, in terms of number of queried tokens.", snap.prefix_cache_queries)  # fmt: skip
    single("vllm:prefix_cache_hits", "counter", "Prefix cache hits, in terms of number of cached tokens.",
           snap.prefix_cache_hits)  # fmt: skip
    single("vllm:num_preemptions", "counter", "Cumulative number of preemption from the engine.",
           snap.num_preemptions)  # fmt: skip
    single("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.", snap.prompt_tokens)
    single("vllm:generation_tokens", "counter", "Number of generation tokens processed.", snap.generation_tokens)
    family(
        "vllm:request_success_total",
        "counter",
        "Count of successfully processed requests.",
        [f'vllm:request_success_total{{{base},finished_reason="{r}"}} {float(n)!r}' for r, n in pod.success.items()],
    )
    cache_labels = (
        f'block_size="{snap.block_size}",cache_dtype="auto",enable_prefix_caching="True",'
        f'num_cpu_blocks="None",num_gpu_blocks="{snap.num_gpu_blocks}",engine="0"'
    )
    family("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig",
           [f"vllm:cache_config_info{{{cache_labels}}} 1.0"])  # fmt: skip
    if lora_enabled:
        lora_labels = (
            f'max_lora="{snap.max_lora}",running_lora_adapters="{_esc(",".join(snap.running_lora_adapters))}",'
            f'waiting_lora_adapters="{_esc(",".join(snap.waiting_lora_adapters))}"'
        )
        stamp = time.time() if now is None else now
        family("vllm:lora_requests_info", "gauge", "Running stats on lora requests.",
               [f"vllm:lora_requests_info{{{lora_labels}}} {stamp!r}"])  # fmt: skip
    family("vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.",
           pod.ttft.lines("vllm:time_to_first_token_seconds", base))  # fmt: skip
    family("vllm:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.",
           pod.itl.lines("vllm:inter_token_latency_seconds", base))  # fmt: skip
    family("vllm:e2e_request_latency_seconds", "histogram", "Histogram of e2e request latency in seconds.",
           pod.e2e.lines("vllm:e2e_request_latency_seconds", base))  # fmt: skip
    return "\n".join(out) + "\n"
