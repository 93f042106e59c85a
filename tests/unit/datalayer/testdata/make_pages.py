"""Writes the sample /metrics pages of this directory (run it from anywhere; output is deterministic).

The pages follow what each engine's exporter writes: prometheus_client text format 0.0.4 with HELP and
TYPE lines, `.0` float values, `_created` samples, histograms with the engines' own buckets, process and
Python collector metrics and HTTP middleware histograms. Values the tests check are fixed below."""

from __future__ import annotations

import math
from pathlib import Path

HERE = Path(__file__).resolve().parent

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
VLLM_MODELS = (LLAMA, "sql-lora", "tweet-lora")
CREATED = 1.7461234567e09

TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
TTFT = (*TTFT, 80.0, 160.0, 640.0, 2560.0)
ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0)
REQUEST = (*REQUEST, 480.0, 960.0, 1920.0, 7680.0)
TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
HTTP_HIGHR = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 7.5)
HTTP_HIGHR = (*HTTP_HIGHR, 10.0, 30.0, 60.0)


def _labels(pairs: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs.items()) + "}" if pairs else ""


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if abs(v) >= 1e6:  # prometheus_client writes large numbers the Go way: 1.7461234e+09
        mantissa, exponent = f"{v:.15e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{exponent}"
    return repr(float(v))


class Page:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, doc: str) -> None:
        self.lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, labels: dict[str, str], value: float) -> None:
        self.lines.append(f"{name}{_labels(labels)} {_fmt(value)}")

    def gauge(self, name: str, doc: str, series: list[tuple[dict[str, str], float]]) -> None:
        self.family(name, "gauge", doc)
        for labels, value in series:
            self.sample(name, labels, value)

    def counter(self, name: str, doc: str, series: list[tuple[dict[str, str], float]], created: bool = True) -> None:
        self.family(name, "counter", doc)
        for labels, value in series:
            self.sample(name, labels, value)
        if created:
            base = name.removesuffix("_total")
            self.family(base + "_created", "gauge", doc)
            for labels, _ in series:
                self.sample(base + "_created", labels, CREATED)

    def histogram(self, name: str, doc: str, bounds: tuple[float, ...], label_sets: list[dict[str, str]]) -> None:
        self.family(name, "histogram", doc)
        for n, labels in enumerate(label_sets):
            total = 0.0
            for i, le in enumerate(bounds):
                total += (i * 7 + n * 3) % 11
                self.sample(name + "_bucket", {**labels, "le": str(float(le))}, total)
            self.sample(name + "_bucket", {**labels, "le": "+Inf"}, total + 1)
            self.sample(name + "_count", labels, total + 1)
            self.sample(name + "_sum", labels, total * 0.37)
        self.family(name + "_created", "gauge", doc)
        for labels in label_sets:
            self.sample(name + "_created", labels, CREATED)

    def python_runtime(self) -> None:
        self.counter(
            "python_gc_objects_collected_total",
            "Objects collected during gc",
            [({"generation": str(g)}, v) for g, v in ((0, 48231.0), (1, 9123.0), (2, 1421.0))],
            created=False,
        )
        self.counter(
            "python_gc_collections_total",
            "Number of times this generation was collected",
            [({"generation": str(g)}, v) for g, v in ((0, 1201.0), (1, 109.0), (2, 7.0))],
            created=False,
        )
        self.gauge(
            "python_info",
            "Python platform information",
            [({"implementation": "CPython", "major": "3", "minor": "12", "patchlevel": "9", "version": "3.12.9"}, 1)],
        )
        for name, doc, value in (
            ("process_virtual_memory_bytes", "Virtual memory size in bytes.", 6.1243392e10),
            ("process_resident_memory_bytes", "Resident memory size in bytes.", 4.123123712e09),
            ("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", 1.74612e09),
            ("process_open_fds", "Number of open file descriptors.", 131.0),
            ("process_max_fds", "Maximum number of open file descriptors.", 1048576.0),
        ):
            self.gauge(name, doc, [({}, value)])
        self.counter("process_cpu_seconds_total", "Total user and system CPU time.", [({}, 8123.41)], created=False)

    def http_middleware(self, handlers: tuple[str, ...]) -> None:
        self.counter(
            "http_requests_total",
            "Total number of requests by method, status and handler.",
            [
                ({"handler": h, "method": m, "status": s}, 17.0)
                for h in handlers
                for m in ("GET", "POST")
                for s in ("2xx", "4xx")
            ],
        )
        self.histogram(
            "http_request_duration_highr_seconds",
            "Latency with many buckets but no API specific labels.",
            HTTP_HIGHR,
            [{}],
        )
        self.histogram(
            "http_request_duration_seconds",
            "Latency with only few buckets by handler.",
            (0.1, 0.5, 1.0),
            [{"handler": h, "method": m} for h in handlers for m in ("GET", "POST")],
        )

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def vllm_page() -> str:
    p = Page()
    p.python_runtime()
    engine = {"engine": "0"}
    per_model = [{**engine, "model_name": m} for m in VLLM_MODELS]
    p.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        [({**engine, "model_name": LLAMA}, 7.0)],
    )
    p.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        [({**engine, "model_name": LLAMA}, 3.0)],
    )
    p.gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        [({**engine, "model_name": LLAMA}, 0.4375)],
    )
    # vLLM sets the value to the current time on every update; the newest series is the live one.
    p.gauge(
        "vllm:lora_requests_info",
        "Running stats on lora requests.",
        [
            ({"max_lora": "4", "running_lora_adapters": "sql-lora", "waiting_lora_adapters": ""}, 1.7461234e09),
            (
                {"max_lora": "4", "running_lora_adapters": "sql-lora,tweet-lora", "waiting_lora_adapters": "news-lora"},
                1.7461239e09,
            ),
        ],
    )
    cache = {
        "block_size": "16",
        "cache_dtype": "auto",
        "calculate_kv_scales": "False",
        "cpu_offload_gb": "0",
        "enable_prefix_caching": "True",
        "engine": "0",
        "gpu_memory_utilization": "0.9",
        "is_attention_free": "False",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": "27310",
        "num_gpu_blocks_override": "None",
        "prefix_caching_hash_algo": "sha256",
        "sliding_window": "None",
        "swap_space": "4",
        "swap_space_bytes": "4294967296",
    }
    p.gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", [(cache, 1.0)])
    p.counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", [(engine, 2.0)])
    p.counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of tokens.", [(engine, 912345.0)])
    p.counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of tokens.", [(engine, 512345.0)])
    p.counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", [(m, 1234567.0) for m in per_model])
    p.counter(
        "vllm:generation_tokens_total", "Number of generation tokens processed.", [(m, 234567.0) for m in per_model]
    )
    p.counter(
        "vllm:request_success_total",
        "Count of successfully processed requests.",
        [({**m, "finished_reason": r}, 91.0) for m in per_model for r in ("stop", "length", "abort")],
    )
    for name, doc, bounds in (
        ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", TOKENS),
        ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT),
        ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL),
        ("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds.", ITL),
        ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST),
        ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", REQUEST),
        ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", REQUEST),
        ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", REQUEST),
        ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", REQUEST),
        ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKENS),
        ("vllm:request_generation_tokens", "Number of generation tokens processed.", TOKENS),
        (
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            TOKENS,
        ),
        ("vllm:request_params_n", "Histogram of the n request parameter.", (1, 2, 5, 10, 20)),
        ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", TOKENS),
    ):
        p.histogram(name, doc, bounds, per_model)
    p.http_middleware(("/v1/completions", "/v1/chat/completions", "/metrics", "/health"))
    return p.text()


def sglang_page() -> str:
    p = Page()
    labels = {"model_name": "Qwen/Qwen2.5-7B-Instruct"}
    p.counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", [(labels, 51234.0)])
    p.counter("sglang:generation_tokens_total", "Number of generation tokens processed.", [(labels, 9123.0)])
    p.gauge("sglang:num_running_reqs", "The number of running requests.", [(labels, 12.0)])
    p.gauge("sglang:num_used_tokens", "The number of used tokens.", [(labels, 81234.0)])
    p.gauge("sglang:token_usage", "The token usage.", [(labels, 0.62)])
    p.gauge("sglang:gen_throughput", "The generation throughput (token/s).", [(labels, 1812.5)])
    p.gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", [(labels, 4.0)])
    p.gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", [(labels, 0.31)])
    p.gauge(
        "sglang:cache_config_info", "Cache configuration.", [({**labels, "page_size": "1", "num_pages": "131072"}, 1)]
    )
    p.histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT, [labels])
    p.histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency.", REQUEST, [labels])
    p.histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL, [labels])
    return p.text()


def trtllm_serve_page() -> str:
    p = Page()
    labels = {"model_name": "llama-3.1-8b", "engine_type": "trtllm"}
    p.histogram("trtllm_time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT, [labels])
    p.histogram("trtllm_e2e_request_latency_seconds", "Histogram of end to end request latency.", REQUEST, [labels])
    p.counter("trtllm_request_success_total", "Count of successfully processed requests.", [(labels, 311.0)])
    p.gauge("trtllm_num_requests_running", "Number of requests currently running.", [(labels, 5.0)])
    p.gauge("trtllm_num_requests_waiting", "Number of requests waiting.", [(labels, 2.0)])
    p.gauge("trtllm_kv_cache_utilization", "KV cache utilization (0-1).", [(labels, 0.25)])
    p.gauge("trtllm_kv_cache_tokens_per_block", "Tokens per KV cache block.", [(labels, 32.0)])
    p.gauge("trtllm_kv_cache_max_blocks", "Maximum number of KV cache blocks.", [(labels, 8192.0)])
    p.gauge("trtllm_kv_cache_used_blocks", "Used KV cache blocks.", [(labels, 2048.0)])
    return p.text()


def triton_page() -> str:
    """Triton writes integers without `.0`, no `_created` samples and no Python collectors."""
    lines: list[str] = []

    def fam(name: str, kind: str, doc: str, series: list[tuple[str, str]]) -> None:
        lines.extend((f"# HELP {name} {doc}", f"# TYPE {name} {kind}"))
        lines.extend(f"{name}{labels} {value}" for labels, value in series)

    model = 'model="tensorrt_llm",version="1"'
    fam(
        "nv_inference_request_success",
        "counter",
        "Number of successful inference requests, all batch sizes",
        [('{model="ensemble",version="1"}', "1523"), (f"{{{model}}}", "1523")],
    )
    fam(
        "nv_inference_request_failure",
        "counter",
        "Number of failed inference requests, all batch sizes",
        [('{model="ensemble",reason="BACKEND",version="1"}', "0"), (f'{{{model},reason="OTHER"}}', "0")],
    )
    fam(
        "nv_inference_count",
        "counter",
        "Number of inferences performed (does not include cached requests)",
        [(f"{{{model}}}", "1523")],
    )
    fam(
        "nv_inference_request_duration_us",
        "counter",
        "Cumulative inference request duration in microseconds",
        [(f"{{{model}}}", "912345678")],
    )
    fam(
        "nv_trt_llm_request_metrics",
        "gauge",
        "TRT LLM request metrics",
        [
            ('{model="tensorrt_llm",request_type="context",version="1"}', "1"),
            ('{model="tensorrt_llm",request_type="scheduled",version="1"}', "6"),
            ('{model="tensorrt_llm",request_type="max",version="1"}', "512"),
            ('{model="tensorrt_llm",request_type="active",version="1"}', "6"),
            ('{model="tensorrt_llm",request_type="waiting",version="1"}', "9"),
        ],
    )
    fam(
        "nv_trt_llm_runtime_memory_metrics",
        "gauge",
        "TRT LLM runtime memory metrics",
        [
            (f'{{memory_type="pinned",{model}}}', "0"),
            (f'{{memory_type="gpu",{model}}}', "1610236160"),
            (f'{{memory_type="cpu",{model}}}', "0"),
        ],
    )
    fam(
        "nv_trt_llm_kv_cache_block_metrics",
        "gauge",
        "TRT LLM KV cache block metrics",
        [
            (f'{{kv_cache_block_type="fraction",{model}}}', "0.125"),
            (f'{{kv_cache_block_type="tokens_per",{model}}}', "64"),
            (f'{{kv_cache_block_type="used",{model}}}', "780"),
            (f'{{kv_cache_block_type="free",{model}}}', "5459"),
            (f'{{kv_cache_block_type="max",{model}}}', "6239"),
        ],
    )
    fam(
        "nv_trt_llm_inflight_batcher_metrics",
        "gauge",
        "TRT LLM inflight_batcher-specific metrics",
        [
            (f'{{inflight_batcher_specific_metric="micro_batch_id",{model}}}', "0"),
            (f'{{inflight_batcher_specific_metric="generation_requests",{model}}}', "5"),
            (f'{{inflight_batcher_specific_metric="total_context_tokens",{model}}}', "1024"),
        ],
    )
    fam(
        "nv_gpu_utilization",
        "gauge",
        "GPU utilization rate [0.0 - 1.0)",
        [('{gpu_uuid="GPU-6ad1c2a4-a1b2-4c3d-9e8f-0123456789ab"}', "0.93")],
    )
    fam(
        "nv_gpu_memory_used_bytes",
        "gauge",
        "GPU used memory, in bytes",
        [('{gpu_uuid="GPU-6ad1c2a4-a1b2-4c3d-9e8f-0123456789ab"}', "74123456512")],
    )
    return "\n".join(lines) + "\n"


PAGES = {
    "vllm.txt": vllm_page,
    "sglang.txt": sglang_page,
    "trtllm_serve.txt": trtllm_serve_page,
    "triton.txt": triton_page,
}


def main() -> None:
    for name, make in PAGES.items():
        (HERE / name).write_text(make())


if __name__ == "__main__":
    main()
