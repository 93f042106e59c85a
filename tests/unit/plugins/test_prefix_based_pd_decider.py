"""Tests for prefix-based-pd-decider: disaggregate iff the uncached part of the prompt (by the decode
endpoint's prefix match) reaches nonCachedTokens."""

from __future__ import annotations

import pytest

from llm_epp.framework import ApiKind, CycleState, InferenceRequest, RequestBody, TypedName
from llm_epp.plugins.disagg import prefix_based_pd_decider as mod
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import PREFIX_MATCH_KEY
from tests.unit.builders import FakeHandle, key, request
from tests.unit.plugins.disagg_support import match, pod, prompt_request

DECODE = pod("dec", "decode", "10.0.0.1")


def _cycle(matched_blocks: int, block_size_tokens: int = 16) -> CycleState:
    cycle = CycleState()
    cycle.write(PREFIX_MATCH_KEY, match({key("dec"): matched_blocks}, block_size_tokens=block_size_tokens))
    return cycle


def _decider(non_cached: int, prompt_tokens: int = 0) -> mod.PrefixBasedPdDecider:
    params = mod.Params.model_validate({"nonCachedTokens": non_cached, "promptTokens": prompt_tokens})
    return mod.factory("d", params, FakeHandle())


@pytest.mark.parametrize(
    ("prompt_tokens", "cached_blocks", "expected"),
    [
        (100, 0, True),  # 100 uncached >= 16
        (15, 0, False),  # shorter than the threshold
        (16, 0, True),  # exactly the threshold
        (100, 5, True),  # 100 - 80 = 20 >= 16
        (100, 6, False),  # 100 - 96 = 4 < 16
        (96, 5, True),  # 96 - 80 = 16: the boundary disaggregates
    ],
)
def test_threshold_counts_cached_tokens_of_the_decode_endpoint(
    prompt_tokens: int, cached_blocks: int, expected: bool
) -> None:
    decider = _decider(16)
    assert decider.disaggregate(_cycle(cached_blocks), prompt_request(prompt_tokens * 4), DECODE) is expected


def test_cached_tokens_use_the_producers_block_size() -> None:
    decider = _decider(16)
    req = prompt_request(100 * 4)
    assert decider.disaggregate(_cycle(2, block_size_tokens=32), req, DECODE)  # 100 - 64 = 36
    assert not decider.disaggregate(_cycle(3, block_size_tokens=32), req, DECODE)  # 100 - 96 = 4


def test_only_the_decode_endpoints_own_match_counts() -> None:
    cycle = CycleState()
    cycle.write(PREFIX_MATCH_KEY, match({key("other"): 6}))
    assert _decider(16).disaggregate(cycle, prompt_request(400), DECODE)


def test_zero_threshold_never_disaggregates() -> None:
    assert not _decider(0).disaggregate(_cycle(0), prompt_request(100_000), DECODE)


def test_no_endpoint_or_no_match_info_does_not_disaggregate() -> None:
    decider = _decider(16)
    assert not decider.disaggregate(_cycle(0), prompt_request(4000), None)
    assert not decider.disaggregate(CycleState(), prompt_request(4000), DECODE)


def test_prompt_tokens_floor() -> None:
    decider = _decider(16, prompt_tokens=200)
    assert not decider.disaggregate(_cycle(0), prompt_request(199 * 4), DECODE)
    assert decider.disaggregate(_cycle(0), prompt_request(200 * 4), DECODE)


def test_token_ids_are_counted_exactly_when_present() -> None:
    body = RequestBody(ApiKind.GENERATE, {"prompt": "z" * 10_000}, token_ids=(1,) * 20)
    req = InferenceRequest(request_id="r", incoming_model="m", target_model="m", body=body)
    assert _decider(20).disaggregate(_cycle(0), req, DECODE)
    assert not _decider(21).disaggregate(_cycle(0), req, DECODE)


def test_chat_messages_are_measured_as_json() -> None:
    messages = [{"role": "user", "content": "y" * 200}]
    req = request(payload={"model": "m", "messages": messages})
    # the JSON of the messages is a little longer than 200 characters: 50+ tokens
    assert _decider(50).disaggregate(_cycle(0), req, DECODE)
    assert not _decider(60).disaggregate(_cycle(0), req, DECODE)


def test_params_defaults_and_validation() -> None:
    assert mod.Params().non_cached_tokens == 0
    with pytest.raises(ValueError, match="nonCachedTokens"):
        mod.Params.model_validate({"nonCachedTokens": -1})
    assert mod.factory("n", mod.Params(), FakeHandle()).typed_name == TypedName("prefix-based-pd-decider", "n")
