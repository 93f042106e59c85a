"""`llm-epp serve` against a model server built on the real prometheus_client: by default its polls ask for
only the samples the extractor reads (`name[]`); `--metrics-name-filter=false` fetches the page as configured."""

from __future__ import annotations

import time
from urllib.parse import parse_qs

import pytest

from llm_epp.gateway.epp_process import EppProcess
from tests.unit.datalayer.prom_servers import PromServer, vllm_registry

VLLM_NAMES = [
    "vllm:cache_config_info",
    "vllm:kv_cache_usage_perc",
    "vllm:lora_requests_info",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
]


def wait_for(srv: PromServer, polls: int) -> None:
    deadline = time.monotonic() + 30
    while len(srv.queries) < polls:
        if time.monotonic() > deadline:
            raise AssertionError(f"the EPP polled {len(srv.queries)} times in 30 s")
        time.sleep(0.05)


@pytest.mark.parametrize("flag", [(), ("--metrics-name-filter=false",)], ids=["default", "off"])
def test_serve_polls_filtered_pages_unless_turned_off(flag: tuple[str, ...]) -> None:
    with PromServer(vllm_registry()) as srv:
        args = ("--endpoints", f"127.0.0.1:{srv.port}", "--secure-serving=false", *flag)
        with EppProcess(*args):
            wait_for(srv, 10)
        queries = list(srv.queries)
    assert queries[0] == ""  # the first page is the full one
    if flag:
        assert set(queries) == {""}
    else:
        assert all(sorted(parse_qs(q)["name[]"]) == VLLM_NAMES for q in queries[1:])
