"""A burst on a fresh EPP, through the real Director and the default configuration, with no scrape in
between: requests count against their pod from the moment they are picked, so the burst spreads."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from llm_epp.config import load_config_text
from llm_epp.datalayer import Datastore
from llm_epp.datalayer.static import parse_endpoint_list
from llm_epp.framework import Metrics, NullRecorder
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.parsers import default_parsers
from llm_epp.requestcontrol.decision import Outcome, RequestInput, RoutingDecision
from llm_epp.requestcontrol.director import Director, RequestPlugins

PODS = "10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000"
# Chat-style prompts: a short common preamble (one or two prefix blocks), then distinct questions.
PREAMBLE = "<|system|>You are a helpful assistant.<|user|>"


def director(ds: Datastore) -> tuple[Director, list[object]]:
    config = load_config_text(None, builtin_registry(), NullRecorder(), ds.snapshot)
    plugins = RequestPlugins(pre_request=config.pre_request, response_complete=config.response_complete)
    return Director(ds.snapshot, config.scheduler, plugins, NullRecorder(), parsers=default_parsers()), list(
        config.plugins.values()
    )


async def burst(d: Director, n: int) -> list[RoutingDecision]:
    async def one(i: int) -> RoutingDecision:
        body = json.dumps({"model": "m", "prompt": f"{PREAMBLE} question {i}: how do tides work near {i}?"})
        return await d.route(RequestInput(f"r{i}", {":path": "/v1/completions"}, body.encode()))

    return list(await asyncio.gather(*(one(i) for i in range(n))))


@pytest.mark.parametrize("scraped", [False, True], ids=["never-scraped", "scraped-idle"])
async def test_a_burst_of_30_on_3_idle_pods_spreads(scraped: bool) -> None:
    ds = Datastore()
    ds.replace_all(parse_endpoint_list(PODS))
    if scraped:  # one scrape showed every pod idle, then the burst arrives within the scrape interval
        for e in ds.snapshot():
            ds.update_metrics(e.key, Metrics(update_time=1.0))
    d, _ = director(ds)
    records = await burst(d, 30)
    counts = Counter(r.endpoint.hostport for r in records if r.endpoint is not None)
    assert sorted(counts.values()) == [10, 10, 10], counts
    for r in records:
        d.finish(r.handle, Outcome(complete=True))
    assert sum(e.load.requests for e in ds.snapshot()) == 0


async def test_a_pod_with_a_scraped_queue_still_gets_less() -> None:
    ds = Datastore()
    ds.replace_all(parse_endpoint_list(PODS))
    busy = ds.snapshot()[0]
    for e in ds.snapshot():
        ds.update_metrics(e.key, Metrics(waiting_queue_size=8 if e.key == busy.key else 0, update_time=1.0))
    d, _ = director(ds)
    counts = Counter(r.endpoint.hostport for r in await burst(d, 30) if r.endpoint is not None)
    # the busy pod gets requests only once the others' unseen requests have caught up with its queue
    assert counts[busy.hostport] < 10 and sum(counts.values()) == 30, counts
