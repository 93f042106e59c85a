"""The worker path (front -> frames over a Unix socket -> the serving process's Director) decides exactly
as the Director called in-process (the simulator's and the single-process EPP's path)."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from pathlib import Path

from llm_epp.composition import build_request_path
from llm_epp.datalayer.static import parse_endpoint_list
from llm_epp.framework import NullRecorder
from llm_epp.framework.plugin import seeded_random
from llm_epp.observability import HealthState
from llm_epp.requestcontrol.decision import Outcome, RequestInput, ResponseSeen
from llm_epp.requestcontrol.director import Director
from llm_epp.workers.hub import Hub
from llm_epp.workers.remote import RemoteDirector

ENDPOINTS = ",".join(f"10.0.0.{i}:8000" for i in range(1, 5))
TOKEN = b"t" * 32


def _director() -> Director:
    ticks = itertools.count()
    path = build_request_path(
        recorder=NullRecorder(), clock=lambda: next(ticks) * 0.01, random_source=seeded_random(11)
    )
    path.datastore.replace_all(parse_endpoint_list(ENDPOINTS))
    return path.director


def _trace(n: int = 120) -> list[tuple[str, bool]]:
    """Requests: (prompt, finish the previous request before routing this one)."""
    rng = random.Random(5)
    prefixes = [f"system prompt number {k}: " + "context words " * 300 for k in range(5)]
    out = []
    for i in range(n):
        prompt = rng.choice(prefixes) + f"question {i} " * rng.randint(1, 30) if rng.random() < 0.7 else f"{i} " * 400
        out.append((prompt, rng.random() < 0.5))
    return out


def _input(i: int, prompt: str) -> RequestInput:
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 4}).encode()
    return RequestInput(f"req-{i}", {":path": "/v1/completions", "content-type": "application/json"}, body)


async def _in_process(director: Director, trace: list[tuple[str, bool]]) -> list[str]:
    picked, open_handles = [], []
    for i, (prompt, finish_one) in enumerate(trace):
        if finish_one and open_handles:
            director.finish(open_handles.pop(0), Outcome(complete=True, status=200))
        d = await director.route(_input(i, prompt))
        director.response_received(d.handle, ResponseSeen(status=200))
        open_handles.append(d.handle)
        picked.append(d.destination)
    return picked


async def _through_worker_path(director: Director, trace: list[tuple[str, bool]], sock: str) -> list[str]:
    hub = Hub(director, HealthState(), TOKEN, with_scores=False, on_ready=lambda i, p: None, on_lost=lambda i: None)
    await hub.start(sock)
    remote = RemoteDirector(HealthState())
    await asyncio.get_running_loop().create_unix_connection(lambda: remote.conn, sock)
    remote.conn.send_raw(TOKEN)
    picked, open_handles = [], []
    try:
        for i, (prompt, finish_one) in enumerate(trace):
            if finish_one and open_handles:
                await remote.finish_async(open_handles.pop(0), Outcome(complete=True, status=200))
            d = await remote.route(_input(i, prompt))
            await remote.response_received_async(d.handle, ResponseSeen(status=200))
            open_handles.append(d.handle)
            picked.append(d.destination)
    finally:
        remote.conn.close()
        await hub.stop()
    return picked


async def test_the_same_trace_gets_the_same_decisions_in_process_and_through_workers(tmp_path: Path) -> None:
    trace = _trace()
    local = await _in_process(_director(), trace)
    remote = await _through_worker_path(_director(), trace, str(tmp_path / "s.sock"))
    assert remote == local
    assert len(set(local)) >= 3  # a trace that exercises the scorers, not one that always picks one pod


async def test_in_flight_load_lives_in_the_serving_process_and_is_released_by_finish(tmp_path: Path) -> None:
    director = _director()
    sock = str(tmp_path / "s.sock")
    hub = Hub(director, HealthState(), TOKEN, with_scores=False, on_ready=lambda i, p: None, on_lost=lambda i: None)
    await hub.start(sock)
    fronts = [RemoteDirector(HealthState()) for _ in range(2)]
    for f in fronts:
        await asyncio.get_running_loop().create_unix_connection(lambda f=f: f.conn, sock)
        f.conn.send_raw(TOKEN)
    try:
        decisions = [await fronts[i % 2].route(_input(i, f"prompt {i} " * 50)) for i in range(6)]

        def in_flight() -> int:
            return sum(e.load.requests for e in director.candidates(None))

        assert in_flight() == 6  # both fronts' requests counted in the one datastore
        for i, d in enumerate(decisions[:3]):
            fronts[i % 2].finish(d.handle, Outcome(complete=True, status=200))
        await asyncio.sleep(0.05)
        assert in_flight() == 3
        fronts[1].conn.close()  # a front that goes away releases what it held (decisions 3 and 5)
        await asyncio.sleep(0.05)
        assert in_flight() == 1
    finally:
        fronts[0].conn.close()
        await hub.stop()


async def test_scores_for_explain_and_emit_cross_over_when_asked(tmp_path: Path) -> None:
    trace = _trace(6)
    local_director = _director()
    local = []
    for i, (prompt, _) in enumerate(trace):
        d = await local_director.route(_input(i, prompt))
        local.append(d.endpoint_scores())
    director = _director()
    sock = str(tmp_path / "s.sock")
    hub = Hub(director, HealthState(), TOKEN, with_scores=True, on_ready=lambda i, p: None, on_lost=lambda i: None)
    await hub.start(sock)
    remote = RemoteDirector(HealthState())
    await asyncio.get_running_loop().create_unix_connection(lambda: remote.conn, sock)
    remote.conn.send_raw(TOKEN)
    try:
        through = [(await remote.route(_input(i, prompt))).endpoint_scores() for i, (prompt, _) in enumerate(trace)]
    finally:
        remote.conn.close()
        await hub.stop()
    assert through == local
    assert all(len(scores) == 4 for scores in through)


async def test_fronts_follow_the_serving_processs_health(tmp_path: Path) -> None:
    """Readiness on a worker's port (--health-checking) mirrors the serving process: synced, leader, draining."""
    health = HealthState(synced=True, leader_election=True, is_leader=True)
    sock = str(tmp_path / "s.sock")
    ready: list[tuple[int, int]] = []
    hub = Hub(
        _director(),
        health,
        TOKEN,
        with_scores=False,
        on_ready=lambda i, p: ready.append((i, p)),
        on_lost=lambda i: None,
    )
    await hub.start(sock)
    mirror = HealthState(leader_election=True)
    remote = RemoteDirector(mirror)
    await asyncio.get_running_loop().create_unix_connection(lambda: remote.conn, sock)
    remote.conn.send_raw(TOKEN)
    remote.conn.send(("p", 0, 12345))
    try:
        for _ in range(100):
            if mirror.synced:
                break
            await asyncio.sleep(0.02)
        assert ready == [(0, 12345)]
        assert (mirror.synced, mirror.is_leader, mirror.draining) == (True, True, False)
        health.is_leader = False  # leadership lost, then a drain
        health.draining = True
        for _ in range(100):
            if mirror.draining:
                break
            await asyncio.sleep(0.02)
        assert (mirror.is_leader, mirror.draining) == (False, True)
    finally:
        remote.conn.close()
        await hub.stop()
