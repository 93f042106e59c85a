"""Requests with distinct ids through what `llm-epp serve` builds leave nothing behind once they end: no
object per request stays reachable, no request bytes stay counted (the memory benchmark's in-process path,
at a size a test can afford)."""

from __future__ import annotations

import asyncio
import gc
import json
import re

import pytest

from llm_epp.app import build
from llm_epp.options import Options
from tests.unit.extproc.fake_envoy import FakeContext, body_msg, headers_msg, response_headers_msg

BATCH = 300
ID = re.compile(r"client-chosen-[0-9]+")


def _reachable_atoms() -> list[object]:
    """What the collector's objects refer to, through the containers it does not track (a dict or tuple of
    strings and numbers is untracked, so `gc.get_objects()` alone would not see the strings it holds)."""
    seen: set[int] = set()
    out: list[object] = []
    todo = gc.get_referents(*gc.get_objects())
    while todo:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, dict | list | tuple | set | frozenset) and not gc.is_tracked(o):
            todo.extend(gc.get_referents(o))
        else:
            out.append(o)
    return out


def _stream(i: int) -> FakeContext:
    prompt = f"shared prefix {i % 8} " * 20 + f"request {i} " + f"{i:08x}" * 40
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 8}).encode()
    return FakeContext(
        [
            headers_msg({":path": "/v1/completions", ":method": "POST", "x-request-id": f"client-chosen-{i}"}),
            body_msg(body, eos=True),
            response_headers_msg({":status": "200", "content-type": "application/json"}),
        ]
    )


async def test_requests_with_distinct_ids_leave_no_object_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")  # tracing on as serve's default, spans not printed
    c = build(Options(endpoints="10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000", secure_serving=False))
    c.servicer.close_wait_s = 0.0  # these streams half-close and are never reset: no wait for a reset

    async def batch(start: int) -> None:
        for i in range(start, start + BATCH):
            ctx = _stream(i)
            await c.servicer.process(None, ctx)  # type: ignore[arg-type]
            assert "request_headers" in ctx.kinds(), ctx.kinds()  # routed, not refused
            await asyncio.sleep(0)

    await batch(0)  # first use: lazily built caches, metric series of the one model, the hash memo
    gc.collect()
    before = len(gc.get_objects())
    await batch(BATCH)
    gc.collect()
    grown = len(gc.get_objects()) - before
    assert grown < BATCH // 10, f"{grown} more tracked objects after {BATCH} more requests"
    assert c.servicer.held.used == 0
    ids = [o for o in _reachable_atoms() if isinstance(o, str) and ID.fullmatch(o)]
    assert ids == [], f"{len(ids)} request ids still referenced"
