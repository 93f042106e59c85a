from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from llm_epp.framework import (
    ApiKind,
    CycleState,
    Endpoint,
    InferenceRequest,
    ProfileResult,
    RequestBody,
    SchedulingResult,
)
from llm_epp.framework.flowcontrol import Placement
from llm_epp.framework.requestcontrol import ResponseInfo, Usage
from llm_epp.framework.types import Metrics
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import PREFIX_MATCH_KEY, PrefixMatch, hash_prompt
from llm_epp.plugins.scheduling.kv_cache_headroom_detector import KvCacheHeadroomDetector, Params, factory
from tests.unit.builders import FakeHandle, endpoint, request

BLOCKS, BLOCK = 1000, 16  # 16,000 tokens per endpoint


def _ep(name: str, kv: float = 0.0, updated: float = 1.0, address: str = "10.0.0.1") -> Endpoint:
    ep = endpoint(name, kv=kv, updated=updated, address=address)
    metrics = Metrics(kv_cache_usage=kv, cache_num_blocks=BLOCKS, cache_block_size=BLOCK, update_time=updated)
    return dataclasses.replace(ep, metrics=metrics)


def _detector(
    handle: FakeHandle | None = None, headroom: float = 0.0, overcommit: float = 0.0
) -> KvCacheHeadroomDetector:
    params = Params(headroom=headroom, overcommit=overcommit, defaultOutputTokens=100)
    return factory("kv", params, handle or FakeHandle())


def _send(det: KvCacheHeadroomDetector, ep: Endpoint, prompt_bytes: int, max_tokens: int) -> CycleState:
    """Schedules a request of `prompt_bytes` body bytes (4 per token to start with) onto `ep`."""
    req = dataclasses.replace(
        request(request_id=f"r{prompt_bytes}", payload={"model": "m", "max_tokens": max_tokens}),
        size_bytes=prompt_bytes,
    )
    cycle = CycleState()
    det.pre_request(cycle, req, SchedulingResult({"default": ProfileResult((ep,))}, "default"))
    return cycle


def test_capacity_comes_from_the_scrape_or_the_parameter() -> None:
    assert _detector().capacity(_ep("a")) == 16_000
    assert factory("kv", Params(kvCacheTokens=5000), FakeHandle()).capacity(_ep("a")) == 5000


def test_an_idle_endpoint_has_room_and_a_full_one_does_not() -> None:
    det = _detector()
    assert det.saturation([_ep("a", kv=0.0)]) == pytest.approx(100 / 16_000)  # the typical output only
    assert det.saturation([_ep("a", kv=1.0)]) > 1.0
    assert det.saturation([]) == 1.0
    never = dataclasses.replace(_ep("a"), metrics=Metrics(cache_num_blocks=BLOCKS, cache_block_size=BLOCK))
    assert det.saturation([never]) == 1.0, "never scraped counts as saturated"


def test_promised_prompts_and_growth_count_until_the_scrape_shows_them() -> None:
    handle = FakeHandle(clock=1.0)
    det = _detector(handle)
    ep = _ep("a", kv=0.0, updated=1.0)
    cycle = _send(det, ep, prompt_bytes=4 * 4000, max_tokens=2000)  # 4,000 prompt tokens, 2,000 output
    assert det.peak(ep, 0, 0) == pytest.approx(6000), "prompt not yet allocated + its whole output"
    # the first token came at t=2 and the scrape at t=12 shows the prompt allocated: ten seconds of decoding at
    # the assumed 100 ms per token = 101 tokens generated, 1,899 to go
    req = request()
    handle.clock = 2.0
    det.response_received(cycle, req, ResponseInfo(status=200), ep)
    later = _ep("a", kv=4101 / 16_000, updated=12.0)
    assert det.peak(later, 0, 0) == pytest.approx(4101 + 1899)


def test_with_response_bodies_read_decoding_is_dated_from_the_first_body_bytes() -> None:
    # The headers came on admission at t=2; prefill took until t=7, when the first body bytes (the first token)
    # arrived. At the scrape at t=12: 5 s of decoding at the assumed 100 ms per token = 51 tokens generated,
    # 1,949 to go (dated from the headers it would be 101 and 1,899).
    handle = FakeHandle(clock=2.0)
    det = _detector(handle)
    ep = _ep("a", kv=0.0, updated=1.0)
    cycle = _send(det, ep, prompt_bytes=4 * 4000, max_tokens=2000)
    det.response_received(cycle, request(), ResponseInfo(status=200, streaming=True), ep)
    handle.clock = 7.0
    det.response_first_body(cycle, request(), ResponseInfo(status=200, streaming=True, first_body_at=7.0), ep)
    later = _ep("a", kv=4051 / 16_000, updated=12.0)
    assert det.peak(later, 0, 0) == pytest.approx(4051 + 1949)


def test_requests_the_pod_still_queued_at_the_scrape_count_as_unallocated_whatever_their_headers_said() -> None:
    # vLLM sends a streamed response's headers before it admits the request: behind response bodies NONE they
    # are the only response signal, and they say nothing about the KV cache. The pod's waiting queue does: it
    # admits in arrival order, so of the requests sent before the scrape the last `waiting` had no blocks.
    handle = FakeHandle(clock=1.0)
    det = _detector(handle)
    ep = _ep("a")
    cycles = [_send(det, ep, prompt_bytes=4 * 1000, max_tokens=100) for _ in range(3)]  # 1,000 + 100 each
    for cycle in cycles:
        det.response_received(cycle, request(), ResponseInfo(status=200, streaming=True), ep)
    handle.clock = 3.0
    later = _send(det, ep, prompt_bytes=4 * 1000, max_tokens=100)  # sent after the scrape below
    det.response_received(later, request(), ResponseInfo(status=200, streaming=True), ep)
    # scraped at t=2 (before the fourth was sent): one request running (1,000 prompt tokens in use), two waiting
    scrape = dataclasses.replace(
        ep, metrics=dataclasses.replace(ep.metrics, kv_cache_usage=1000 / 16_000, update_time=2.0, waiting_queue_size=2)
    )
    # in use 1,000; unallocated prompts: the two waiting and the one sent after, 3,000; the peak comes when the
    # first three end (their headers came at t=1: 1 s / 0.1 s + 1 = 11 tokens decoded, 89 to go), all four 89
    # tokens longer
    assert det.peak(scrape, 0, 0) == pytest.approx(1000 + 3000 + 4 * 89)
    nobody_waits = dataclasses.replace(scrape, metrics=dataclasses.replace(scrape.metrics, waiting_queue_size=0))
    assert det.peak(nobody_waits, 0, 0) == pytest.approx(1000 + 1000 + 4 * 89)  # only the fourth unallocated


def test_the_peak_accounts_for_requests_that_end_and_free_their_blocks() -> None:
    handle = FakeHandle(clock=1.0)
    det = _detector(handle)
    ep = _ep("a", kv=0.0, updated=0.5)
    _send(det, ep, prompt_bytes=4 * 1000, max_tokens=100)  # short: 1,100 tokens, gone after 100 steps
    _send(det, ep, prompt_bytes=4 * 1000, max_tokens=3000)  # long: grows to 4,000
    # at step 100 both are live: 2,000 prompt + 100 + 100 = 2,200; at step 3,000 only the long one: 4,000
    assert det.peak(ep, 0, 0) == pytest.approx(4000)
    # a new request of 500 prompt + 3,000 output ends with the long one: 4,000 + 3,500 = 7,500
    assert det.peak(ep, 500, 3000) == pytest.approx(7500)


@given(st.lists(st.tuples(st.integers(1, 4000), st.integers(1, 3000)), max_size=12), st.floats(0, 0.5))
def test_the_peak_is_the_maximum_of_a_step_by_step_replay(requests: list[tuple[int, int]], kv: float) -> None:
    det = _detector(FakeHandle(clock=1.0))
    ep = _ep("a", kv=kv, updated=0.5)
    for prompt, output in requests:
        _send(det, ep, prompt_bytes=4 * prompt, max_tokens=output)
    live = [(p, o) for p, o in requests]
    steps = sorted({0, *(o for _, o in live)})
    replay = max(kv * 16_000 + sum(p + min(s, o) for p, o in live if o >= s) for s in steps)
    assert det.peak(ep, 0, 0) == pytest.approx(replay)


def test_the_filter_keeps_endpoints_with_room_for_this_request_else_the_emptiest() -> None:
    det = _detector()
    roomy, tight, full = _ep("a", kv=0.1), _ep("b", kv=0.85, address="10.0.0.2"), _ep("c", kv=0.95, address="10.0.0.3")
    big = dataclasses.replace(request(payload={"model": "m", "max_tokens": 2000}), size_bytes=4 * 1000)
    assert [e.key.name for e in det.filter(CycleState(), big, [roomy, tight, full])] == ["a"]
    assert [e.key.name for e in det.filter(CycleState(), big, [tight, full])] == ["b"]


def _complete_many(det: KvCacheHeadroomDetector, handle: FakeHandle, ep: Endpoint, headers_lead: float) -> None:
    """60 requests, one after another: 1,000 prompt tokens in 3,000 bytes, 200 of 400 tokens out at 20 ms
    each. The response headers come `headers_lead` seconds before the first token; with a lead (a streamed
    response, bodies read by the EPP) the first body bytes are timed as well."""
    for _ in range(60):
        cycle = _send(det, ep, prompt_bytes=3000, max_tokens=400)
        handle.clock += 1.0
        det.response_received(cycle, request(), ResponseInfo(status=200, streaming=headers_lead > 0), ep)
        handle.clock += headers_lead
        first_body_at = handle.clock if headers_lead > 0 else None
        handle.clock += 0.02 * 199
        usage = Usage(prompt_tokens=1000, completion_tokens=200, total_tokens=1200)
        info = ResponseInfo(
            status=200, streaming=headers_lead > 0, usage=usage, complete=True, first_body_at=first_body_at
        )
        det.response_complete(cycle, request(), info, ep)


def test_completions_calibrate_tokens_per_byte_output_and_itl() -> None:
    handle = FakeHandle(clock=0.0)
    det = _detector(handle)
    ep = _ep("a")
    _complete_many(det, handle, ep, headers_lead=0.0)
    assert det.in_flight(ep.key) == 0, "nothing leaks"
    assert det.tokens_per_byte == pytest.approx(1 / 3, rel=0.01)
    assert det.output_ratio == pytest.approx(0.5, rel=0.01)
    assert det.itl == pytest.approx(0.02, rel=0.02)


def test_itl_is_timed_from_the_first_body_bytes_when_the_headers_came_before_them() -> None:
    # Response bodies streamed to the EPP: vLLM sends a streamed response's headers on admission, here 3 s of
    # queueing and prefill before its first token; only the first body bytes time the decode.
    handle = FakeHandle(clock=0.0)
    det = _detector(handle)
    _complete_many(det, handle, _ep("a"), headers_lead=3.0)
    assert det.itl == pytest.approx(0.02, rel=0.02), "the headers' lead is not decode time"


def test_an_aborted_request_is_forgotten_without_calibrating() -> None:
    det = _detector()
    ep = _ep("a")
    cycle = _send(det, ep, prompt_bytes=4000, max_tokens=100)
    det.response_complete(cycle, request(), ResponseInfo(status=0, complete=False), ep)
    assert det.in_flight(ep.key) == 0 and det.tokens_per_byte == 0.25


def _with_prefix(hashes: tuple[int, ...]) -> CycleState:
    cycle = CycleState()
    cycle.write(PREFIX_MATCH_KEY, PrefixMatch(hashes, {}, 16))
    return cycle


@pytest.mark.parametrize(("keep_home", "expected"), [(False, ["b"]), (True, ["a"])])
def test_a_request_whose_prefix_pod_is_full_moves_or_waits_there(keep_home: bool, expected: list[str]) -> None:
    det = factory("kv", Params(keepPrefixHome=keep_home), FakeHandle(clock=2.0))  # sent after the scrape
    home, other = _ep("a", kv=0.9), _ep("b", kv=0.1, address="10.0.0.2")
    prefix = tuple(range(100))  # 1,600 tokens held by a request in flight on `a`
    first = dataclasses.replace(request(payload={"model": "m", "max_tokens": 500}), size_bytes=4 * 2000)
    det.pre_request(_with_prefix(prefix), first, SchedulingResult({"default": ProfileResult((home,))}, "default"))
    second = dataclasses.replace(request(payload={"model": "m", "max_tokens": 500}), size_bytes=4 * 2000)
    # the held prefix makes `a` cheaper for it (400 new prompt tokens instead of 2,000), but `a` is still full
    assert det._request_size(_with_prefix(prefix), second, home.key)[0] == pytest.approx(400)
    kept = det.filter(_with_prefix(prefix), second, [home, other])
    assert [e.key.name for e in kept] == expected


def _prompted(text: str, max_tokens: int = 500) -> InferenceRequest:
    body = RequestBody(ApiKind.COMPLETIONS, {"model": "m", "prompt": text, "max_tokens": max_tokens})
    return dataclasses.replace(request(payload=body.payload), body=body, size_bytes=len(text) + 40)


def _hold(det: KvCacheHeadroomDetector, req: InferenceRequest, ep: Endpoint) -> None:
    """Schedules `req` onto `ep` with the default prefix producer's hashes of its prompt."""
    match = PrefixMatch(hash_prompt(req, 16, 256), {}, 16)
    cycle = CycleState()
    cycle.write(PREFIX_MATCH_KEY, match)
    det.pre_request(cycle, req, SchedulingResult({"default": ProfileResult((ep,))}, "default"))


SYSTEM = "You are a careful assistant. " * 80  # ~2,300 characters: 36 blocks of 64 characters


@pytest.mark.parametrize(("home_kv", "expected"), [(0.1, Placement.HOME_FITS), (0.95, Placement.HOME_FULL)])
def test_a_queued_request_is_placed_by_where_its_prefix_is_held(home_kv: float, expected: Placement) -> None:
    det = factory("kv", Params(overcommit=0), FakeHandle())
    assert det.dispatch_window == 16 and det.dispatch_max_wait == 10.0
    home, other = _ep("a", kv=home_kv), _ep("b", kv=0.1, address="10.0.0.2")
    _hold(det, _prompted(SYSTEM + "first question"), home)
    queued = det.affinity_key(_prompted(SYSTEM + "second question"))
    placement, cost = det.placement(queued, [home, other])
    assert placement is expected
    stranger = det.affinity_key(_prompted("Something else entirely. " * 100))
    far, far_cost = det.placement(stranger, [home, other])
    assert far is Placement.NO_HOME
    # what each adds: its prompt less the ~575 tokens of prefix held at home (the stranger: all of it), and
    # the expected output
    full = sum(det._size(_prompted(SYSTEM + "second question"), 0.0))
    assert full - 600 < cost < full - 500
    assert far_cost == pytest.approx(sum(det._size(_prompted("Something else entirely. " * 100), 0.0)))


def test_the_filter_keeps_a_request_on_its_prefix_endpoint_when_that_has_room() -> None:
    home, other = _ep("a", kv=0.3), _ep("b", kv=0.0, address="10.0.0.2")
    second = _prompted(SYSTEM + "second question")
    kept: dict[int, list[str]] = {}
    for window in (0, 8):
        det = factory("kv", Params(dispatchWindow=window), FakeHandle())
        _hold(det, _prompted(SYSTEM + "first question"), home)
        cycle = CycleState()
        cycle.write(PREFIX_MATCH_KEY, PrefixMatch(hash_prompt(second, 16, 256), {}, 16))
        kept[window] = [e.key.name for e in det.filter(cycle, second, [home, other])]
    assert kept == {0: ["a", "b"], 8: ["a"]}


def test_overcommit_lets_the_predicted_peak_pass_capacity_by_that_fraction() -> None:
    handle = FakeHandle(clock=1.0)
    strict, loose = _detector(handle), _detector(handle, overcommit=0.1)
    ep = _ep("a", kv=0.0, updated=0.5)
    for det in (strict, loose):
        _send(det, ep, prompt_bytes=4 * 8000, max_tokens=8400)  # predicted peak 16,400 tokens: 102.5%
    assert strict._ratio(ep, 0, 0) == pytest.approx(16_400 / 16_000)
    assert loose._ratio(ep, 0, 0) == pytest.approx(16_400 / 17_600)
    # a 1,000-token request more: past the limit without overcommit, within it with 10%
    assert strict._ratio(ep, 500, 500) > 1.0 > loose._ratio(ep, 500, 500)
    both = _detector(handle, headroom=0.02, overcommit=0.1)
    _send(both, ep, prompt_bytes=4 * 8000, max_tokens=8400)
    assert both._ratio(ep, 0, 0) == pytest.approx(16_400 / (16_000 * 1.08))


@pytest.mark.parametrize("bad", [-0.1, 0.6, float("nan")])
def test_overcommit_out_of_range_is_refused_with_its_bounds(bad: float) -> None:
    with pytest.raises(ValidationError, match="overcommit"):
        Params.model_validate({"overcommit": bad})
    assert Params().overcommit == 0.1 and Params().headroom == 0.0


def test_prefix_groups_in_flight_are_counted_until_their_requests_end() -> None:
    det = factory("kv", Params(), FakeHandle())
    home = _ep("a")
    assert det.dispatch_groups and not det.hot_groups()
    first, second = _prompted(SYSTEM + "first question"), _prompted(SYSTEM + "second question")
    group = det.group_key(det.affinity_key(_prompted(SYSTEM + "third question")))
    assert group is not None, "a prompt of 36 blocks has a group: its first 16 blocks"
    assert group == det.group_key(det.affinity_key(second))
    assert det.group_key(det.affinity_key(_prompted("Something else entirely. " * 100))) != group
    short = det.group_key(det.affinity_key(_prompted("Hi there. " * 20)))
    assert short is not None and short != group, "a prompt shorter than a group is a group of its own"
    assert det.group_key(det.affinity_key(_prompted("Hi"))) is None, "less than a block: no group"
    cycles = []
    for req in (first, second):
        match = PrefixMatch(hash_prompt(req, 16, 256), {}, 16)
        cycle = CycleState()
        cycle.write(PREFIX_MATCH_KEY, match)
        det.pre_request(cycle, req, SchedulingResult({"default": ProfileResult((home,))}, "default"))
        cycles.append(cycle)
    assert list(det.hot_groups()) == [group]
    det.response_complete(cycles[0], first, ResponseInfo(status=200, complete=True), home)
    assert list(det.hot_groups()) == [group], "the second request still holds the group"
    det.response_complete(cycles[1], second, ResponseInfo(status=0, complete=False), home)
    assert not det.hot_groups()


@pytest.mark.parametrize("params", [{"dispatchGroups": False}, {"dispatchWindow": 0}])
def test_prefix_groups_can_be_turned_off(params: dict[str, object]) -> None:
    det = factory("kv", Params.model_validate(params), FakeHandle())
    assert det.group_key(det.affinity_key(_prompted(SYSTEM + "question"))) is None
    _hold(det, _prompted(SYSTEM + "first question"), _ep("a"))
    assert not det.hot_groups(), "groups in flight are not even counted when nothing would use them"
    assert Params().dispatch_groups is True


@pytest.mark.parametrize(
    ("params", "named"),
    [
        ({"dispatchWindow": 0, "dispatchGroups": True}, "dispatchGroups only acts"),
        ({"dispatchWindow": 0, "dispatchMaxWaitSeconds": 5}, "dispatchMaxWaitSeconds only acts"),
        ({"dispatchWindow": 0, "dispatchGroups": True, "dispatchMaxWaitSeconds": 5}, "and dispatchGroups only act "),
    ],
)
def test_dispatch_settings_without_the_window_are_refused(params: dict[str, object], named: str) -> None:
    with pytest.raises(ValidationError, match=named) as err:
        Params.model_validate(params)
    assert "set dispatchWindow > 0" in str(err.value)
    # the window alone off, or grouping explicitly off with it, is fine
    assert Params.model_validate({"dispatchWindow": 0}).dispatch_window == 0
    assert Params.model_validate({"dispatchWindow": 0, "dispatchGroups": False}).dispatch_groups is False


def _dispatch(det: KvCacheHeadroomDetector, ep: Endpoint) -> CycleState:
    """What the director does when it sends a small request to `ep`: reserves it in the endpoint's in-flight
    load, then runs PreRequest."""
    ep.load.requests += 1
    return _send(det, ep, prompt_bytes=40, max_tokens=10)


def _end(det: KvCacheHeadroomDetector, ep: Endpoint, cycle: CycleState) -> None:
    """What the director does when that request ends: releases the reservation, then runs ResponseComplete."""
    ep.load.requests -= 1
    det.response_complete(cycle, request(), ResponseInfo(status=200, complete=True), ep)


def test_max_concurrency_leaves_no_room_on_an_endpoint_at_its_limit_until_a_request_ends() -> None:
    det = factory("kv", Params(maxConcurrency=2, defaultOutputTokens=100), FakeHandle())
    busy, idle = _ep("a", kv=0.01), _ep("b", kv=0.01, address="10.0.0.2")
    small = dataclasses.replace(request(payload={"model": "m", "max_tokens": 10}), size_bytes=40)
    first = _dispatch(det, busy)
    assert det.saturation([busy]) < 1.0, "one of two in flight: room for the second"
    _dispatch(det, busy)
    # two tiny requests use almost none of the KV cache, yet the endpoint is at its limit
    assert det.saturation([busy]) == pytest.approx(3 / 2)
    assert det.saturation([busy, idle]) < 1.0
    assert [e.key.name for e in det.filter(CycleState(), small, [busy, idle])] == ["b"]
    assert [e.key.name for e in det.filter(CycleState(), small, [busy])] == ["a"], "none fits: the emptiest"
    _end(det, busy, first)
    assert det.saturation([busy]) < 1.0
    assert [e.key.name for e in det.filter(CycleState(), small, [busy, idle])] == ["a", "b"]


def test_max_concurrency_counts_the_directors_in_flight_requests_not_only_its_own() -> None:
    # The limit reads the core's in-flight account (what concurrency-detector reads), so requests the detector
    # never saw through PreRequest (another profile's, or sent before a reconfiguration) count too.
    det = factory("kv", Params(maxConcurrency=3), FakeHandle())
    ep = _ep("a", kv=0.01)
    ep.load.requests = 3
    assert det.in_flight(ep.key) == 0
    assert det.saturation([ep]) == pytest.approx(4 / 3)
    ep.load.requests = 2
    assert det.saturation([ep]) < 1.0


def test_max_concurrency_makes_a_queued_requests_full_home_hold_it() -> None:
    det = factory("kv", Params(overcommit=0, maxConcurrency=1), FakeHandle())
    home, other = _ep("a", kv=0.1), _ep("b", kv=0.1, address="10.0.0.2")
    home.load.requests += 1  # the director's reservation for the request held below
    _hold(det, _prompted(SYSTEM + "first question"), home)
    placement, _ = det.placement(det.affinity_key(_prompted(SYSTEM + "second question")), [home, other])
    assert placement is Placement.HOME_FULL  # the KV cache has room; the limit does not


def test_max_concurrency_is_off_by_default_and_refuses_negatives() -> None:
    assert Params().max_concurrency == 0
    det = _detector()
    ep = _ep("a", kv=0.0)
    for _ in range(50):
        _dispatch(det, ep)
    assert det.saturation([ep]) < 1.0, "without a limit, only the KV prediction counts"
    with pytest.raises(ValidationError, match="maxConcurrency"):
        Params.model_validate({"maxConcurrency": -1})
