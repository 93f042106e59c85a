"""Aborting a request in the simulated engine: one in the step being executed leaves at the step's end,
any other at once; its blocks are freed and it emits nothing more; the others carry on."""

from __future__ import annotations

from llm_epp.sim.engine import Engine, EventKind, SimRequest
from llm_epp.sim.profiles import TINY


def _tokens(seed: int, n: int) -> tuple[int, ...]:
    return tuple(1000 * seed + i for i in range(n))


def _drain(engine: Engine) -> list[tuple[EventKind, str]]:
    out: list[tuple[EventKind, str]] = []
    while (t := engine.next_event_time()) is not None:
        out += [(e.kind, e.request_id) for e in engine.advance(t) if e.kind is not EventKind.TOKEN]
    return out


def test_a_running_request_leaves_at_the_end_of_its_step_and_frees_its_blocks() -> None:
    engine = Engine(TINY)
    engine.submit(SimRequest("a", _tokens(1, 200), 50), 0.0)
    engine.submit(SimRequest("b", _tokens(2, 200), 50), 0.0)
    t = engine.next_event_time()
    assert t is not None
    engine.advance(t)  # both prefilled: first tokens out, both running
    used = engine.metrics().kv_cache_usage_perc
    assert engine.metrics().num_requests_running == 2
    engine.next_event_time()  # the next step is planned with both in it
    assert engine.abort("a")
    assert engine.metrics().num_requests_running == 2, "a is part of the step being executed"
    events = _drain(engine)
    assert (EventKind.FINISHED, "b") in events and all(rid == "b" for _, rid in events)
    assert engine.idle and engine.metrics().kv_cache_usage_perc == 0 < used
    assert not engine.abort("a"), "gone"


def test_a_waiting_request_leaves_at_once_and_an_unknown_one_is_refused() -> None:
    engine = Engine(TINY)
    engine.submit(SimRequest("a", _tokens(1, 100), 20), 0.0)
    assert not engine.abort("nope")
    assert engine.abort("a")
    assert engine.idle and engine.next_event_time() is None
    engine.submit(SimRequest("a", _tokens(1, 100), 20), 0.0)  # the id is free again
    assert (EventKind.FINISHED, "a") in _drain(engine)
