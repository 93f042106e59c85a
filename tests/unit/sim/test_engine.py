"""The engine model runs on virtual time: these tests assert behaviour and exact virtual durations only."""

from __future__ import annotations

import dataclasses
import random

import pytest

from llm_epp.sim.engine import Engine, EventKind, RequestEvent, SimRequest, StepInfo, block_hashes
from llm_epp.sim.profiles import PROFILES, QWEN3_32B_H100_TP2, TINY, Profile, get_profile


def _profile(**overrides: object) -> Profile:
    return dataclasses.replace(TINY, **overrides)  # type: ignore[arg-type]


def _tokens(seed: int, n: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(100_000) for _ in range(n))


def _run(engine: Engine, trace: list[tuple[float, SimRequest]]) -> list[RequestEvent]:
    """Drive ``engine`` through ``trace`` (arrival time, request) until it is idle; all events."""
    trace = sorted(trace, key=lambda item: item[0])
    events: list[RequestEvent] = []
    i = 0
    while True:
        while i < len(trace) and trace[i][0] <= engine.clock:
            engine.submit(trace[i][1], trace[i][0])
            i += 1
        nxt = engine.next_event_time()
        arrival = trace[i][0] if i < len(trace) else None
        if nxt is None and arrival is None:
            return events
        target = min(t for t in (nxt, arrival) if t is not None)
        events.extend(engine.advance(target))


def _by_kind(events: list[RequestEvent], kind: EventKind) -> dict[str, RequestEvent]:
    return {e.request_id: e for e in events if e.kind is kind}


# ------------------------------------------------------------------ profiles


def test_profiles_registered_and_documented() -> None:
    assert set(PROFILES) == {"qwen3-32b-h100-tp2", "tiny"}
    assert get_profile("tiny") is TINY
    assert QWEN3_32B_H100_TP2.kv_capacity_tokens == 307_328
    assert QWEN3_32B_H100_TP2.max_num_seqs == 1024 and QWEN3_32B_H100_TP2.max_num_batched_tokens == 8192
    with pytest.raises(KeyError, match="known: qwen3-32b-h100-tp2, tiny"):
        get_profile("nope")
    with pytest.raises(ValueError, match="step_base"):
        _profile(step_base=0.0)
    with pytest.raises(ValueError, match="num_gpu_blocks"):
        _profile(num_gpu_blocks=0)


# ------------------------------------------------------------------ cost model and timing


def test_step_durations_follow_the_cost_formula() -> None:
    p = _profile()
    engine = Engine(p, clock_start=10.0)
    events = _run(engine, [(10.0, SimRequest("r", _tokens(1, 100), max_tokens=3))])
    times = [e.time for e in events]
    t0 = 10.0 + p.step_base + p.prefill_cost_per_token * 100 + p.kv_read_cost_per_token * 100
    t1 = t0 + p.step_base + p.decode_cost_per_seq + p.kv_read_cost_per_token * 101
    t2 = t1 + p.step_base + p.decode_cost_per_seq + p.kv_read_cost_per_token * 102
    assert [e.kind for e in events] == [EventKind.FIRST_TOKEN, EventKind.TOKEN, EventKind.TOKEN, EventKind.FINISHED]
    assert [e.token_index for e in events[:3]] == [0, 1, 2]
    assert times == pytest.approx([t0, t1, t2, t2])
    assert engine.next_event_time() is None and engine.idle


def test_the_step_observer_is_told_each_step_and_its_work() -> None:
    p = _profile()
    engine = Engine(p, clock_start=10.0)
    steps: list[StepInfo] = []
    engine.step_observer = steps.append
    events = _run(engine, [(10.0, SimRequest("r", _tokens(1, 100), max_tokens=3))])
    assert [(s.decoding, s.prefill_tokens, s.kv_tokens) for s in steps] == [(0, 100, 100), (1, 0, 101), (1, 0, 102)]
    assert [s.start + s.duration for s in steps] == pytest.approx([e.time for e in events[:3]])
    assert steps[1].start == pytest.approx(steps[0].start + steps[0].duration) and steps[0].start == 10.0


def test_chunked_prefill_splits_a_long_prompt_over_steps() -> None:
    p = _profile(max_num_batched_tokens=256)
    engine = Engine(p)
    engine.submit(SimRequest("r", _tokens(2, 600), max_tokens=1), 0.0)
    ends = []
    while (t := engine.next_event_time()) is not None:
        ends.append(t)
        engine.advance(t)
    assert len(ends) == 3  # 256 + 256 + 88 prompt tokens
    chunk1 = p.step_base + p.prefill_cost_per_token * 256 + p.kv_read_cost_per_token * 256
    assert ends[0] == pytest.approx(chunk1)


def test_advance_only_runs_steps_that_end_by_until() -> None:
    engine = Engine(TINY)
    engine.submit(SimRequest("r", _tokens(3, 50), max_tokens=4), 0.0)
    end = engine.next_event_time()
    assert end is not None
    assert engine.advance(end / 2) == []
    assert engine.next_event_time() == end
    first = engine.advance(end)
    assert [e.kind for e in first] == [EventKind.FIRST_TOKEN]
    assert engine.clock == end


def test_submit_validation() -> None:
    engine = Engine(_profile(max_loras=0))
    with pytest.raises(ValueError, match="max_tokens"):
        engine.submit(SimRequest("a", (1, 2), max_tokens=0), 0.0)
    with pytest.raises(ValueError, match="max_model_len"):
        engine.submit(SimRequest("a", _tokens(1, 4096), max_tokens=1), 0.0)
    with pytest.raises(ValueError, match="LoRA"):
        engine.submit(SimRequest("a", (1, 2), max_tokens=1, lora="x"), 0.0)
    engine.submit(SimRequest("a", (1, 2), max_tokens=5), 1.0)
    with pytest.raises(ValueError, match="already"):
        engine.submit(SimRequest("a", (1, 2), max_tokens=5), 1.0)
    with pytest.raises(ValueError, match="before the engine clock"):
        engine.submit(SimRequest("b", (1, 2), max_tokens=5), 0.5)
    with pytest.raises(ValueError, match="advance the engine"):
        engine.submit(SimRequest("b", (1, 2), max_tokens=5), 100.0)
    small = Engine(_profile(num_gpu_blocks=4, max_model_len=4096))
    with pytest.raises(ValueError, match="KV capacity"):
        small.submit(SimRequest("a", _tokens(1, 64), max_tokens=1), 0.0)


# ------------------------------------------------------------------ prefix cache


def test_block_hashes_are_chained_by_content() -> None:
    a = block_hashes(tuple(range(40)), 16)
    b = block_hashes((*range(16), 99, *range(17, 40)), 16)
    assert len(a) == 2  # the partial third block has no id
    assert a[0] == b[0] and a[1] != b[1]
    assert block_hashes(tuple(range(40)), 16, lora="x")[0] != a[0]
    assert block_hashes(tuple(range(40)), 16) == a


def test_repeated_prefix_is_cached_and_cheaper() -> None:
    prefix = _tokens(7, 1000)
    first = SimRequest("first", prefix + _tokens(8, 50), max_tokens=4)
    second = SimRequest("second", prefix + _tokens(9, 50), max_tokens=4)
    engine = Engine(TINY)
    events = _run(engine, [(0.0, first), (5.0, second)])
    done = _by_kind(events, EventKind.FINISHED)
    ttft = {
        rid: e.time - (0.0 if rid == "first" else 5.0) for rid, e in _by_kind(events, EventKind.FIRST_TOKEN).items()
    }
    assert done["first"].cached_tokens == 0
    assert done["second"].cached_tokens >= 992
    assert done["second"].prompt_tokens == 1050 and done["second"].completion_tokens == 4
    assert ttft["second"] < ttft["first"]
    m = engine.metrics()
    assert m.prefix_cache_queries == 2100
    assert m.prefix_cache_hits == done["second"].cached_tokens


def test_full_prompt_hit_still_computes_one_token() -> None:
    prompt = _tokens(5, 64)  # exactly 4 blocks
    engine = Engine(TINY)
    events = _run(engine, [(0.0, SimRequest("a", prompt, 2)), (1.0, SimRequest("b", prompt, 2))])
    assert _by_kind(events, EventKind.FINISHED)["b"].cached_tokens == 48


def test_free_blocks_form_one_queue_in_the_order_they_were_freed() -> None:
    # 8 blocks of 16; each prompt = 2 full blocks + 1 token, 1 output token -> 2 cached blocks + 1 block with no
    # content id (the partial one) while running.  A request's blocks are freed tail first.
    engine = Engine(_profile(num_gpu_blocks=8))
    prompts = {name: _tokens(seed, 33) for seed, name in enumerate("ABCDF")}

    def run(name: str, rid: str | None = None) -> None:
        _run(engine, [(engine.clock + 1.0, SimRequest(rid or name, prompts[name], max_tokens=1))])

    run("A")  # never-used blocks go first: 5 left; free queue: A's partial block, A1, A0
    run("B")  # 2 never-used left; queue: A-partial, A1, A0, B-partial, B1, B0
    run("C")  # the last 2 never-used blocks, then the queue's head (A's partial block: nothing evicted)
    assert all(engine.cached_prefix_tokens(prompts[n]) == 32 for n in "ABC")
    assert engine.metrics().evicted_blocks == 0
    run("D")  # takes A1, A0 (A's tail first) and B's partial block
    assert engine.cached_prefix_tokens(prompts["A"]) == 0
    assert engine.metrics().evicted_blocks == 2
    run("B", "B-again")  # a hit takes B's blocks out of the queue; they rejoin it at the tail when freed
    assert engine.metrics().prefix_cache_hits == 32
    run("F")  # the head now: C's partial block, C1, C0 -- B was refreshed, D is younger
    assert engine.cached_prefix_tokens(prompts["C"]) == 0
    assert engine.cached_prefix_tokens(prompts["B"]) == 32
    assert engine.cached_prefix_tokens(prompts["D"]) == 32
    assert engine.metrics().evicted_blocks == 4


def test_blocks_of_running_requests_are_never_evicted() -> None:
    engine = Engine(_profile(num_gpu_blocks=16))
    long_prompt = _tokens(1, 64)
    trace = [(0.0, SimRequest("long", long_prompt, max_tokens=60))]
    trace += [(0.001 * k, SimRequest(f"s{k}", _tokens(100 + k, 40), max_tokens=1)) for k in range(1, 30)]
    engine_events: list[RequestEvent] = []
    for t, request in trace:
        engine_events.extend(engine.advance(t))
        engine.submit(request, t)
        assert engine.cached_prefix_tokens(long_prompt) in (0, 64)  # 0 only before its first step ends
    engine_events.extend(engine.advance(0.05))
    assert engine.cached_prefix_tokens(long_prompt) == 64
    assert engine.metrics().evicted_blocks > 0


# ------------------------------------------------------------------ capacity, preemption, queueing


def test_preemption_when_kv_runs_out_and_every_request_finishes() -> None:
    engine = Engine(_profile(num_gpu_blocks=32, max_num_seqs=8))
    trace = [(0.0, SimRequest(f"r{k}", _tokens(k, 64), max_tokens=100)) for k in range(6)]
    events = _run(engine, trace)
    done = _by_kind(events, EventKind.FINISHED)
    assert set(done) == {f"r{k}" for k in range(6)}
    assert all(e.completion_tokens == 100 and e.prompt_tokens == 64 for e in done.values())
    for k in range(6):
        mine = [e for e in events if e.request_id == f"r{k}" and e.kind is not EventKind.FINISHED]
        assert [e.token_index for e in mine] == list(range(100))
        assert mine[0].kind is EventKind.FIRST_TOKEN
    m = engine.metrics()
    assert m.num_preemptions > 0
    assert sum(e.preemptions for e in done.values()) == m.num_preemptions
    assert m.generation_tokens == 600
    assert m.kv_cache_usage_perc == 0.0 and m.num_requests_running == 0 and m.num_requests_waiting == 0


def test_running_request_scheduled_last_is_preempted_and_requeued_first() -> None:
    engine = Engine(_profile(num_gpu_blocks=12, max_num_seqs=8))
    engine.submit(SimRequest("old", _tokens(1, 48), max_tokens=100), 0.0)
    engine.submit(SimRequest("young", _tokens(2, 48), max_tokens=100), 0.0)
    engine.submit(SimRequest("later", _tokens(3, 16), max_tokens=2), 0.0)
    while engine.metrics().num_preemptions == 0:
        t = engine.next_event_time()
        assert t is not None
        engine.advance(t)
    engine.next_event_time()  # preemption happens while planning; the next plan readmits nobody
    m = engine.metrics()
    assert m.num_requests_running == 1
    assert engine._waiting[0].rid == "young"  # front of the queue, ahead of "later"


def _step_until(engine: Engine, kind: EventKind, rid: str) -> list[RequestEvent]:
    events: list[RequestEvent] = []
    while not any(e.kind is kind and e.request_id == rid for e in events):
        t = engine.next_event_time()
        assert t is not None
        events.extend(engine.advance(t))
    return events


def test_a_preempted_request_resumes_from_its_own_cached_blocks() -> None:
    # 12 blocks.  A and B (32-token prompts) run in lock step; at 96 computed tokens each holds 6 full blocks and
    # A needs a 7th for its last token: B, scheduled last, is preempted.  Its 6 blocks (2 prompt, 4 generated)
    # are freed tail first, A takes B's tail block and finishes.  Resumed, B finds its other 5 blocks cached and
    # prefills only the 17 tokens after them, not its prompt and the 65 tokens it had generated.
    p = _profile(num_gpu_blocks=12, max_num_seqs=8)
    engine = Engine(p)
    engine.submit(SimRequest("A", _tokens(1, 32), max_tokens=66), 0.0)
    engine.submit(SimRequest("B", _tokens(2, 32), max_tokens=150), 0.0)
    events = _step_until(engine, EventKind.FINISHED, "A")
    assert engine.metrics().num_preemptions == 1
    assert [e.token_index for e in events if e.request_id == "B"][-1] == 64  # B had emitted 65 tokens
    start = engine.clock
    end = engine.next_event_time()  # B is readmitted: 5 cached blocks (80 tokens), 97 tokens in all
    assert end is not None
    assert end - start == pytest.approx(p.step_base + p.prefill_cost_per_token * 17 + p.kv_read_cost_per_token * 97)
    rest = _run(engine, [])
    b_tokens = [e.token_index for e in events + rest if e.request_id == "B" and e.kind is not EventKind.FINISHED]
    assert b_tokens == list(range(150))  # nothing emitted twice, nothing skipped
    done = _by_kind(rest, EventKind.FINISHED)["B"]
    assert done.preemptions == 1 and done.cached_tokens == 0
    m = engine.metrics()
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (64, 0)  # the resumed lookup is not counted
    assert m.evicted_blocks >= 1


def test_generated_blocks_are_private_to_their_request() -> None:
    # Same prompt, different requests: the prompt's blocks are shared, the generated ones are not.
    prompt = _tokens(3, 32)
    engine = Engine(TINY)
    _run(engine, [(0.0, SimRequest("a", prompt, max_tokens=40))])
    events = _run(engine, [(engine.clock + 1.0, SimRequest("b", prompt + _tokens(4, 64), max_tokens=1))])
    assert _by_kind(events, EventKind.FINISHED)["b"].cached_tokens == 32


def test_queueing_at_max_num_seqs() -> None:
    engine = Engine(_profile(max_num_seqs=2))
    for k in range(5):
        engine.submit(SimRequest(f"r{k}", _tokens(k, 20), max_tokens=10), 0.0)
    m = engine.metrics()
    assert (m.num_requests_running, m.num_requests_waiting) == (0, 5)
    engine.next_event_time()
    m = engine.metrics()
    assert (m.num_requests_running, m.num_requests_waiting) == (2, 3)
    events = _run(engine, [])
    starts = [e.request_id for e in events if e.kind is EventKind.FIRST_TOKEN]
    assert starts == ["r0", "r1", "r2", "r3", "r4"]  # FIFO


def test_request_at_step_start_joins_that_step() -> None:
    engine = Engine(TINY)
    engine.submit(SimRequest("a", _tokens(1, 20), max_tokens=1), 0.0)
    engine.submit(SimRequest("b", _tokens(2, 20), max_tokens=1), 0.0)
    events = _run(engine, [])
    first = _by_kind(events, EventKind.FIRST_TOKEN)
    assert first["a"].time == first["b"].time


# ------------------------------------------------------------------ LoRA


def test_lora_slots_third_adapter_waits_and_load_is_paid_once() -> None:
    p = _profile(max_loras=2, lora_load_time=0.5)
    engine = Engine(p)
    engine.submit(SimRequest("a", _tokens(1, 20), max_tokens=50, lora="A"), 0.0)
    engine.submit(SimRequest("b", _tokens(2, 20), max_tokens=200, lora="B"), 0.0)
    engine.submit(SimRequest("c", _tokens(3, 20), max_tokens=5, lora="C"), 0.0)
    engine.submit(SimRequest("base", _tokens(4, 20), max_tokens=5), 0.0)
    engine.next_event_time()
    m = engine.metrics()
    assert m.running_lora_adapters == ("A", "B")
    assert m.waiting_lora_adapters == ("C",)
    assert m.num_requests_running == 3  # the base-model request went past the blocked one
    assert m.max_lora == 2 and m.lora_loads == 2
    events = _run(engine, [])
    first = _by_kind(events, EventKind.FIRST_TOKEN)
    done = _by_kind(events, EventKind.FINISHED)
    assert done["a"].time <= first["c"].time < done["b"].time  # C took A's slot once A finished
    assert engine.metrics().lora_loads == 3
    assert engine.metrics().loaded_lora_adapters == ("B", "C")

    # Alone on the engine, a resident adapter costs exactly lora_load_time less than a new one.
    def ttft(rid: str, lora: str, seed: int) -> float:
        start = engine.clock + 1.0
        evs = _run(engine, [(start, SimRequest(rid, _tokens(seed, 40), max_tokens=1, lora=lora))])
        return _by_kind(evs, EventKind.FIRST_TOKEN)[rid].time - start

    fresh = ttft("d", "D", 10)
    resident = ttft("d2", "D", 11)
    assert fresh - resident == pytest.approx(p.lora_load_time)
    assert engine.metrics().lora_loads == 4


# ------------------------------------------------------------------ metrics and determinism


def test_metrics_reflect_state() -> None:
    engine = Engine(TINY)
    m = engine.metrics()
    assert (m.num_requests_running, m.num_requests_waiting, m.kv_cache_usage_perc) == (0, 0, 0.0)
    assert (m.block_size, m.num_gpu_blocks) == (16, TINY.num_gpu_blocks)
    prompt = _tokens(1, 320)
    engine.submit(SimRequest("a", prompt, max_tokens=10), 0.0)
    t = engine.next_event_time()
    assert t is not None
    engine.advance(t)
    m = engine.metrics()
    assert m.num_requests_running == 1
    assert m.kv_cache_usage_perc == pytest.approx(20 / TINY.num_gpu_blocks)  # 320 computed tokens
    engine.next_event_time()  # the next step computes token 321: one more block
    assert engine.metrics().kv_cache_usage_perc == pytest.approx(21 / TINY.num_gpu_blocks)
    _run(engine, [])
    assert engine.metrics().kv_cache_usage_perc == 0.0  # freed blocks stay cached but count as free
    _run(engine, [(engine.clock + 1.0, SimRequest("b", prompt, max_tokens=1))])
    m = engine.metrics()
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (640, 304)
    assert m.prompt_tokens == 640 and m.generation_tokens == 11


def _random_trace(seed: int, n: int) -> list[tuple[float, SimRequest]]:
    rng = random.Random(seed)
    prefixes = [_tokens(1000 + g, 200) for g in range(4)]
    trace = []
    t = 0.0
    for k in range(n):
        t += rng.expovariate(40.0)
        prompt = rng.choice(prefixes) + _tokens(rng.randrange(10**6), rng.randrange(1, 120))
        lora = rng.choice([None, None, "x", "y", "z"])
        trace.append((t, SimRequest(f"r{k}", prompt, max_tokens=rng.randrange(1, 80), lora=lora)))
    return trace


def test_same_trace_gives_the_same_events() -> None:
    profile = _profile(num_gpu_blocks=96)
    first = _run(Engine(profile), _random_trace(3, 120))
    second = _run(Engine(profile), _random_trace(3, 120))
    assert first == second
    assert len(_by_kind(first, EventKind.FINISHED)) == 120


def test_token_events_can_be_omitted() -> None:
    trace = _random_trace(4, 40)
    full = _run(Engine(TINY), trace)
    lean = _run(Engine(TINY, token_events=False), trace)
    assert lean == [e for e in full if e.kind is not EventKind.TOKEN]
