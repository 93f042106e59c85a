"""SGLang-compatible Prometheus metrics for a live simulated pod (``/metrics`` of a pod with ``engine="sglang"``).

The values come from the same engine model as the vLLM exposition (:class:`~llm_epp.sim.engine.EngineMetrics`
plus the pod's :class:`~llm_epp.sim.vllm_metrics.PodMetrics`); only names, labels, buckets and a few
definitions differ.  SGLang exports two groups of series:

* scheduler series, labelled ``model_name``, ``engine_type="unified"``, ``tp_rank="0"``, ``pp_rank="0"``:
  gauges ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:num_used_tokens``,
  ``sglang:token_usage`` (0..1), ``sglang:gen_throughput`` (tokens/s), ``sglang:cache_hit_rate`` (0..1),
  ``sglang:max_total_num_tokens``, ``sglang:page_size``, ``sglang:num_pages``, the info gauge
  ``sglang:cache_config_info`` (value 1, extra labels ``page_size`` and ``num_pages``: what the EPP's SGLang
  mapping reads for the KV-cache geometry) and the counter ``sglang:num_retracted_requests_total``
  (SGLang's word for preemptions);
* request series, labelled ``model_name``, ``engine_type="unified"``: counters ``sglang:prompt_tokens_total``,
  ``sglang:generation_tokens_total``, ``sglang:cached_tokens_total``, ``sglang:num_requests_total``,
  ``sglang:num_aborted_requests_total`` (always 0: no abort is modelled), all counted when a request
  finishes, and histograms ``sglang:time_to_first_token_seconds``, ``sglang:inter_token_latency_seconds``,
  ``sglang:e2e_request_latency_seconds`` with SGLang's default buckets, in *modelled* seconds.

SGLang sets ``gen_throughput`` and ``cache_hit_rate`` at each of its log intervals; here the interval is the
time since the previous scrape: ``gen_throughput`` = output tokens produced / modelled seconds elapsed,
``cache_hit_rate`` = cached / looked-up prompt tokens of the admissions in between (unchanged when there
were none).  A page is one engine block (``page_size`` = ``block_size``, ``num_pages`` = ``num_gpu_blocks``).
"""

from __future__ import annotations

from llm_epp.sim.engine import EngineMetrics
from llm_epp.sim.vllm_metrics import Exposition, PodMetrics, escape_label

__all__ = ["E2E_BUCKETS", "ENGINE_TYPE", "ITL_BUCKETS", "TTFT_BUCKETS", "SGLangExporter", "new_pod_metrics"]

ENGINE_TYPE = "unified"
"""``engine_type`` label of a server that does both prefill and decode (no disaggregation)."""

TTFT_BUCKETS = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4, 0.6,
    0.8, 1.0, 2.0, 4.0, 6.0, 8.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0, 600.0,
    1200.0, 1800.0, 2400.0,
)  # fmt: skip


def new_pod_metrics() -> PodMetrics:
    """Per-pod observations with SGLang's default latency buckets."""
    return PodMetrics(TTFT_BUCKETS, ITL_BUCKETS, E2E_BUCKETS)


class SGLangExporter:
    """Renders one pod's ``/metrics`` as SGLang does, remembering the previous scrape for the windowed gauges."""

    def __init__(self, model: str) -> None:
        name = escape_label(model)
        self.request_labels = f'model_name="{name}",engine_type="{ENGINE_TYPE}"'
        """Labels of the request series (SGLang's tokenizer-side collector)."""
        self.scheduler_labels = f'{self.request_labels},tp_rank="0",pp_rank="0"'
        """Labels of the scheduler series."""
        self._last_time = 0.0
        self._last_generation_tokens = 0
        self._last_queries = 0
        self._last_hits = 0
        self._gen_throughput = 0.0
        self._cache_hit_rate = 0.0

    def _advance_window(self, snap: EngineMetrics, now: float) -> None:
        """Close the window that started at the previous scrape (or at virtual time 0) at ``now``."""
        if now > self._last_time:
            self._gen_throughput = (snap.generation_tokens - self._last_generation_tokens) / (now - self._last_time)
            self._last_time = now
            self._last_generation_tokens = snap.generation_tokens
        queries = snap.prefix_cache_queries - self._last_queries
        if queries > 0:
            self._cache_hit_rate = (snap.prefix_cache_hits - self._last_hits) / queries
            self._last_queries = snap.prefix_cache_queries
            self._last_hits = snap.prefix_cache_hits

    def render(self, snap: EngineMetrics, pod: PodMetrics, *, now: float) -> str:
        """The text exposition (format 0.0.4) of the pod at virtual time ``now`` (modelled seconds)."""
        self._advance_window(snap, now)
        sched = Exposition(self.scheduler_labels)
        single = sched.single
        single("sglang:num_running_reqs", "gauge", "The number of running requests.", snap.num_requests_running)
        single("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.",
               snap.num_requests_waiting)  # fmt: skip
        used_pages = round(snap.kv_cache_usage_perc * snap.num_gpu_blocks)
        single("sglang:num_used_tokens", "gauge", "The number of used tokens.", used_pages * snap.block_size)
        single("sglang:token_usage", "gauge", "The token usage.", snap.kv_cache_usage_perc)
        single("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", self._gen_throughput)
        single("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", self._cache_hit_rate)
        single("sglang:max_total_num_tokens", "gauge", "Maximum total number of tokens in the KV cache pool.",
               snap.num_gpu_blocks * snap.block_size)  # fmt: skip
        single("sglang:page_size", "gauge", "KV cache page size in tokens.", snap.block_size)
        single("sglang:num_pages", "gauge", "Number of KV cache pages.", snap.num_gpu_blocks)
        info = f'{self.scheduler_labels},page_size="{snap.block_size}",num_pages="{snap.num_gpu_blocks}"'
        sched.family("sglang:cache_config_info", "gauge", "KV cache configuration.",
                     [f"sglang:cache_config_info{{{info}}} 1.0"])  # fmt: skip
        single("sglang:num_retracted_requests", "counter", "Total number of retracted requests.",
               snap.num_preemptions)  # fmt: skip

        req = Exposition(self.request_labels)
        single = req.single
        single("sglang:prompt_tokens", "counter", "Number of prefill tokens processed.", pod.prompt_tokens)
        single("sglang:generation_tokens", "counter", "Number of generation tokens processed.",
               pod.completion_tokens)  # fmt: skip
        single("sglang:cached_tokens", "counter", "Number of cached prompt tokens.", pod.cached_tokens)
        single("sglang:num_requests", "counter", "Number of requests processed.", pod.finished)
        single("sglang:num_aborted_requests", "counter", "Number of requests aborted.", 0)
        labels = self.request_labels
        req.family("sglang:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.",
                   pod.ttft.lines("sglang:time_to_first_token_seconds", labels))  # fmt: skip
        req.family("sglang:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.",
                   pod.itl.lines("sglang:inter_token_latency_seconds", labels))  # fmt: skip
        req.family("sglang:e2e_request_latency_seconds", "histogram",
                   "Histogram of end-to-end request latency in seconds.",
                   pod.e2e.lines("sglang:e2e_request_latency_seconds", labels))  # fmt: skip
        return sched.text() + req.text()
