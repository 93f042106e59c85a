"""Model-server stand-ins built on the real prometheus_client: vLLM's metric names and types on a registry,
served by prometheus_client's own WSGI app on 127.0.0.1 (port 0), which answers the `name[]` query
parameter itself; and the same metrics in prometheus_client's multiprocess mode, written by a child
process and read back by `MultiProcessCollector`, as vLLM with several API servers and SGLang serve them."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.multiprocess import MultiProcessCollector

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
CACHE_CONFIG = {"block_size": "16", "cache_dtype": "auto", "num_gpu_blocks": "8192", "num_cpu_blocks": "None"}
LORA_LABELS = ("max_lora", "waiting_lora_adapters", "running_lora_adapters")


def _define_and_set(registry: CollectorRegistry | None, multiprocess: bool) -> None:
    """vLLM's engine metrics (names, types, label names as vLLM V1 declares them) with fixed values."""
    kw: dict[str, Any] = {} if registry is None else {"registry": registry}
    recent: dict[str, Any] = {"multiprocess_mode": "mostrecent"} if multiprocess else {}
    labels = ["model_name", "engine"]
    Gauge("vllm:num_requests_running", "Requests in execution batches.", labels, **kw, **recent).labels(MODEL, "0").set(
        7
    )
    Gauge("vllm:num_requests_waiting", "Requests waiting.", labels, **kw, **recent).labels(MODEL, "0").set(3)
    Gauge("vllm:kv_cache_usage_perc", "KV-cache usage.", labels, **kw, **recent).labels(MODEL, "0").set(0.4375)
    Counter("vllm:prompt_tokens", "Prefill tokens processed.", labels, **kw).labels(MODEL, "0").inc(12345)
    Counter("vllm:prefix_cache_queries", "Prefix cache queries.", labels, **kw).labels(MODEL, "0").inc(999)
    for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds", "vllm:request_queue_time"):
        h = Histogram(name, "Latency.", labels, buckets=TTFT_BUCKETS, **kw).labels(MODEL, "0")
        for v in (0.003, 0.05, 0.2, 1.7):
            h.observe(v)
    cache = Gauge(
        "vllm:cache_config_info", "Information of the LLMEngine CacheConfig", list(CACHE_CONFIG), **kw, **recent
    )
    cache.labels(**CACHE_CONFIG).set(1)
    lora = Gauge("vllm:lora_requests_info", "Running stats on lora requests.", list(LORA_LABELS), **kw, **recent)
    lora.labels(max_lora="4", waiting_lora_adapters="", running_lora_adapters="sql-lora,tweet-lora").set(
        1_700_000_000.0
    )


def vllm_registry() -> CollectorRegistry:
    """vLLM's metrics on a registry that knows each collector's names, as vLLM's single API server has."""
    registry = CollectorRegistry(auto_describe=True)
    _define_and_set(registry, multiprocess=False)
    return registry


_WRITER = """
import sys
sys.path.insert(0, {root!r})
from tests.unit.datalayer.prom_servers import _define_and_set
_define_and_set(None, multiprocess=True)
"""


def multiprocess_registry(directory: Path) -> CollectorRegistry:
    """The same metrics written by a child process in multiprocess mode (PROMETHEUS_MULTIPROC_DIR), read by a
    `MultiProcessCollector` on a plain `CollectorRegistry()`, as vLLM and SGLang build it."""
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory)}
    subprocess.run([sys.executable, "-c", _WRITER.format(root=root)], env=env, check=True, timeout=60)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    return registry


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class PromServer:
    """prometheus_client's WSGI exposition app for `registry` on 127.0.0.1, in a thread. Records each
    request's query string and the size of each answer. `ignore_query`: the query string is dropped
    before the app sees it (a server that ignores `name[]`)."""

    def __init__(self, registry: CollectorRegistry, *, ignore_query: bool = False) -> None:
        self.queries: list[str] = []
        self.sizes: list[int] = []
        self._app = make_wsgi_app(registry)
        self._ignore_query = ignore_query
        self._server: WSGIServer = make_server("127.0.0.1", 0, self._wrapped, handler_class=_Quiet)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def _wrapped(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        self.queries.append(environ.get("QUERY_STRING", ""))
        if self._ignore_query:
            environ["QUERY_STRING"] = ""
        body = b"".join(self._app(environ, start_response))
        self.sizes.append(len(body))
        return [body]

    def url(self, path: str = "/metrics") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> PromServer:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def filtered(self) -> Iterator[tuple[str, int]]:
        """(query, answer size) of the requests that carried `name[]`."""
        return ((q, s) for q, s in zip(self.queries, self.sizes, strict=False) if "name%5B%5D=" in q)
