"""vLLM-compatible Prometheus metrics for a live simulated pod (``/metrics`` of :mod:`llm_epp.sim.server`).

Names, types and histogram buckets follow vLLM V1 (``vllm/v1/metrics/loggers.py``): counters are exposed
with ``_total``; every series carries ``model_name`` and ``engine="0"`` except ``vllm:lora_requests_info``
(labels ``max_lora``, ``running_lora_adapters``, ``waiting_lora_adapters``; value = the current Unix time).
Latency histograms are observed in *modelled* seconds (wall time divided by the pod's time scale).

The engine-neutral pieces (:class:`Histogram`, :class:`PodMetrics`, :class:`Exposition`, :func:`escape_label`)
are shared with :mod:`llm_epp.sim.sglang_metrics`.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Sequence

from llm_epp.sim.engine import EngineMetrics

__all__ = [
    "E2E_BUCKETS",
    "ITL_BUCKETS",
    "TTFT_BUCKETS",
    "Exposition",
    "Histogram",
    "PodMetrics",
    "escape_label",
    "render",
]

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
NIXL_XFER_TIME_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_BYTES_BUCKETS = tuple(float(2 ** (10 + i)) for i in range(1, 25, 2))
"""2 KiB to 8 GiB, every factor of 4."""


class Histogram:
    """A cumulative Prometheus histogram with fixed upper bounds (``+Inf`` implied)."""

    __slots__ = ("buckets", "count", "counts", "sum")

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        """Count one observation."""
        self.counts[bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        """The ``_bucket`` (cumulative, ``le`` last), ``_count`` and ``_sum`` samples of family ``name``."""
        out: list[str] = []
        acc = 0
        bounds = [repr(float(b)) for b in self.buckets] + ["+Inf"]
        for le, n in zip(bounds, self.counts, strict=True):
            acc += n
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {float(acc)!r}')
        out.append(f"{name}_count{{{labels}}} {float(self.count)!r}")
        out.append(f"{name}_sum{{{labels}}} {self.sum!r}")
        return out


class KvTransferMetrics:
    """KV pulls of a decode pod, as vLLM's NIXL connector exports them."""

    __slots__ = ("bytes", "time")

    def __init__(self) -> None:
        self.time = Histogram(NIXL_XFER_TIME_BUCKETS)
        self.bytes = Histogram(NIXL_BYTES_BUCKETS)

    def observe(self, seconds: float, nbytes: int) -> None:
        self.time.observe(seconds)
        self.bytes.observe(float(nbytes))


class PodMetrics:
    """What the live pod observes on top of the engine snapshot (latency histograms, finished requests).

    The bucket bounds default to vLLM's; another engine's exporter passes its own.
    """

    def __init__(
        self,
        ttft_buckets: Sequence[float] = TTFT_BUCKETS,
        itl_buckets: Sequence[float] = ITL_BUCKETS,
        e2e_buckets: Sequence[float] = E2E_BUCKETS,
    ) -> None:
        self.ttft = Histogram(ttft_buckets)
        self.itl = Histogram(itl_buckets)
        self.e2e = Histogram(e2e_buckets)
        self.success: dict[str, int] = dict.fromkeys(FINISHED_REASONS, 0)
        self.prompt_tokens = 0
        """Prompt tokens of finished requests."""
        self.completion_tokens = 0
        """Output tokens of finished requests."""
        self.cached_tokens = 0
        """Prompt tokens of finished requests that were served from the prefix cache."""
        self.kv_transfer = KvTransferMetrics()

    def observe_finished(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> None:
        """Count one request that finished normally (``finished_reason="length"``: output = ``max_tokens``)."""
        self.success["length"] += 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        self.cached_tokens += cached_tokens

    @property
    def finished(self) -> int:
        """Requests finished so far, whatever the reason."""
        return sum(self.success.values())


def escape_label(value: str) -> str:
    """``value`` escaped for a label value of the text exposition format."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Exposition:
    """Builds one text exposition (format 0.0.4): ``# HELP`` / ``# TYPE`` headers and samples, in call order."""

    def __init__(self, labels: str) -> None:
        self.labels = labels
        """Rendered label pairs (``a="x",b="y"``) of :meth:`single` samples."""
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str, samples: list[str]) -> None:
        """One metric family with ready-made sample lines."""
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        self.lines.extend(samples)

    def single(self, name: str, kind: str, help_text: str, value: float) -> None:
        """A family of one sample labelled :attr:`labels`; a counter's family and sample get ``_total``."""
        sample = name + ("_total" if kind == "counter" else "")
        self.family(sample if kind == "counter" else name, kind, help_text,
                    [f"{sample}{{{self.labels}}} {float(value)!r}"])  # fmt: skip

    def text(self) -> str:
        """The exposition, newline-terminated."""
        return "\n".join(self.lines) + "\n"


def render(
    model: str,
    snap: EngineMetrics,
    pod: PodMetrics,
    *,
    lora_enabled: bool,
    now: float | None = None,
    kv_transfer: bool = False,
) -> str:
    """The text exposition (format 0.0.4) of one pod; ``kv_transfer`` adds the NIXL connector's families
    (``vllm:nixl_xfer_time_seconds``, ``vllm:nixl_bytes_transferred``, ``vllm:nixl_num_failed_transfers``)."""
    base = f'engine="0",model_name="{escape_label(model)}"'
    out = Exposition(base)
    family, single = out.family, out.single
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
        running = escape_label(",".join(snap.running_lora_adapters))
        waiting = escape_label(",".join(snap.waiting_lora_adapters))
        lora_labels = f'max_lora="{snap.max_lora}",running_lora_adapters="{running}",waiting_lora_adapters="{waiting}"'
        stamp = time.time() if now is None else now
        family("vllm:lora_requests_info", "gauge", "Running stats on lora requests.",
               [f"vllm:lora_requests_info{{{lora_labels}}} {stamp!r}"])  # fmt: skip
    family("vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.",
           pod.ttft.lines("vllm:time_to_first_token_seconds", base))  # fmt: skip
    family("vllm:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.",
           pod.itl.lines("vllm:inter_token_latency_seconds", base))  # fmt: skip
    family("vllm:e2e_request_latency_seconds", "histogram", "Histogram of e2e request latency in seconds.",
           pod.e2e.lines("vllm:e2e_request_latency_seconds", base))  # fmt: skip
    if kv_transfer:
        xfer = pod.kv_transfer
        family("vllm:nixl_xfer_time_seconds", "histogram",
               "Histogram of transfer duration for NIXL KV Cache transfers.",
               xfer.time.lines("vllm:nixl_xfer_time_seconds", base))  # fmt: skip
        family("vllm:nixl_bytes_transferred", "histogram",
               "Histogram of bytes transferred per NIXL KV Cache transfers.",
               xfer.bytes.lines("vllm:nixl_bytes_transferred", base))  # fmt: skip
        single("vllm:nixl_num_failed_transfers", "counter", "Number of failed NIXL KV Cache transfers.", 0)
    return out.text()
