"""Tests for disagg-profile-handler: stage order, decider use, primary selection, headers and the
decision counter, through the real scheduler with real role filters."""

from __future__ import annotations

from typing import Any

import pytest

from llm_epp.framework import CycleState, Endpoint, InferenceRequest, ProfileResult, TypedName
from llm_epp.framework.requestcontrol import REQUEST_HEADERS_KEY
from llm_epp.plugins.disagg import disagg_profile_handler as mod
from llm_epp.plugins.disagg.always_disagg_multimodal_decider import AlwaysDisaggMultimodalDecider
from llm_epp.plugins.disagg.always_disagg_pd_decider import AlwaysDisaggPdDecider
from llm_epp.plugins.disagg.common import PEER_ENDPOINT_KEY
from llm_epp.plugins.disagg.prefix_based_pd_decider import PrefixBasedPdDecider
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import PREFIX_MATCH_KEY
from llm_epp.scheduling import SchedulingFailedError
from tests.unit.builders import FakeFilter, FakeHandle, key, names, request
from tests.unit.plugins.disagg_support import match, pod, pool, prompt_request, scheduler


class _CountingDecider:
    """Answers `answer` and records the endpoint names it was asked about."""

    def __init__(self, name: str, answer: bool) -> None:
        self.typed_name = TypedName("counting-decider", name)
        self.answer = answer
        self.asked: list[str | None] = []

    def disaggregate(self, cycle: CycleState, request: InferenceRequest, endpoint: Endpoint | None) -> bool:
        self.asked.append(endpoint.key.name if endpoint is not None else None)
        return self.answer


def _handler(params: dict[str, Any], plugins: dict[str, Any]) -> tuple[mod.DisaggProfileHandler, FakeHandle]:
    handle = FakeHandle(plugins=plugins)
    return mod.factory("disagg", mod.Params.model_validate(params), handle), handle


def _run(
    handler: mod.DisaggProfileHandler,
    handle: FakeHandle,
    req: InferenceRequest,
    *,
    encode: bool = False,
    cycle: CycleState | None = None,
) -> tuple[Any, CycleState]:
    cycle = cycle or CycleState()
    result = scheduler(handler, handle.recorder, encode=encode).schedule(req, pool(), cycle)
    handler.pre_request(cycle, req, result)
    return result, cycle


def test_decode_only_without_deciders() -> None:
    handler, handle = _handler({}, {})
    result, cycle = _run(handler, handle, request())
    assert result.primary_profile_name == "decode"
    assert list(result.profile_results) == ["decode"]
    assert names(result.primary.target_endpoints) == ["dec"]
    assert cycle.read(REQUEST_HEADERS_KEY) == {}
    assert handle.recorder.disagg_decisions == [(TypedName(mod.TYPE, "disagg"), "m", "decode-only")]


def test_prefill_stage_when_the_decider_approves_decode_stays_primary() -> None:
    decider = _CountingDecider("pd", True)
    handler, handle = _handler({"deciders": {"prefill": "pd"}}, {"pd": decider})
    result, cycle = _run(handler, handle, request())
    assert result.primary_profile_name == "decode"
    assert names(result.primary.target_endpoints) == ["dec"]
    assert names(result.profile_results["prefill"].target_endpoints) == ["pre"]
    assert decider.asked == ["dec"]  # asked once, about the decode pick
    assert cycle.read(REQUEST_HEADERS_KEY) == {"x-prefiller-host-port": "10.0.0.2:8200"}
    assert cycle.read(PEER_ENDPOINT_KEY).key.name == "dec"
    assert handle.recorder.disagg_decisions[-1][2] == "prefill-decode"


def test_declined_prefill_is_not_run_and_not_asked_twice() -> None:
    decider = _CountingDecider("pd", False)
    handler, handle = _handler({"deciders": {"prefill": "pd"}}, {"pd": decider})
    result, cycle = _run(handler, handle, request())
    assert list(result.profile_results) == ["decode"]
    assert decider.asked == ["dec"]
    assert "x-prefiller-host-port" not in cycle.read(REQUEST_HEADERS_KEY)
    assert handle.recorder.disagg_decisions[-1][2] == "decode-only"


def test_epd_runs_decode_then_encode_then_prefill() -> None:
    order: list[str] = []
    enc, pd = _CountingDecider("enc", True), _CountingDecider("pd", True)
    handler, handle = _handler({"deciders": {"prefill": "pd", "encode": "enc"}}, {"pd": pd, "enc": enc})
    sched = scheduler(handler, handle.recorder, encode=True)
    for name, profile in sched.profiles.items():
        run = profile.run

        def spy(*args: Any, _name: str = name, _run: Any = run) -> Any:
            order.append(_name)
            return _run(*args)

        profile.run = spy  # type: ignore[method-assign]
    req, cycle = request(), CycleState()
    result = sched.schedule(req, pool(), cycle)
    handler.pre_request(cycle, req, result)
    assert order == ["decode", "encode", "prefill"]
    assert enc.asked == ["dec"] and pd.asked == ["dec"]
    assert cycle.read(REQUEST_HEADERS_KEY) == {
        "x-prefiller-host-port": "10.0.0.2:8200",
        "x-encoder-hosts-ports": "10.0.0.3:8300",
    }
    assert handle.recorder.disagg_decisions[-1][2] == "encode-prefill-decode"


def test_encode_declined_prefill_approved_counts_prefill_decode_and_asks_each_once() -> None:
    enc, pd = _CountingDecider("enc", False), _CountingDecider("pd", True)
    handler, handle = _handler({"deciders": {"prefill": "pd", "encode": "enc"}}, {"pd": pd, "enc": enc})
    result, _ = _run(handler, handle, request(), encode=True)
    assert sorted(result.profile_results) == ["decode", "prefill"]
    assert enc.asked == ["dec"] and pd.asked == ["dec"]
    assert handle.recorder.disagg_decisions == [(TypedName(mod.TYPE, "disagg"), "m", "prefill-decode")]


def test_multimodal_encode_only_for_media_requests() -> None:
    handler, handle = _handler({"deciders": {"encode": "mm"}}, {"mm": AlwaysDisaggMultimodalDecider("mm")})
    text, _ = _run(handler, handle, request(), encode=True)
    assert list(text.profile_results) == ["decode"]
    media = request(payload={"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]})
    result, cycle = _run(handler, handle, media, encode=True)
    assert sorted(result.profile_results) == ["decode", "encode"]
    assert cycle.read(REQUEST_HEADERS_KEY) == {"x-encoder-hosts-ports": "10.0.0.3:8300"}
    assert [d[2] for d in handle.recorder.disagg_decisions] == ["decode-only", "encode-decode"]


def test_prefix_decider_uses_the_decode_pods_cached_tokens() -> None:
    handler, handle = _handler({"deciders": {"prefill": "pd"}}, {"pd": PrefixBasedPdDecider("pd", 16)})
    assert handler.consumes == {PREFIX_MATCH_KEY.name}
    req = prompt_request(100 * 4)
    cold = CycleState()
    cold.write(PREFIX_MATCH_KEY, match({}))
    assert "prefill" in _run(handler, handle, req, cycle=cold)[0].profile_results
    warm = CycleState()
    warm.write(PREFIX_MATCH_KEY, match({key("dec"): 6}))  # 96 of 100 tokens cached on the decode pod
    assert "prefill" not in _run(handler, handle, req, cycle=warm)[0].profile_results


def test_prefill_first_runs_prefill_then_decode_and_publishes_the_prefill_pick() -> None:
    handler, handle = _handler({"stageOrder": "prefill-first"}, {})
    result, cycle = _run(handler, handle, request())
    assert result.primary_profile_name == "decode"
    assert names(result.primary.target_endpoints) == ["dec"]
    assert cycle.read(PEER_ENDPOINT_KEY).key.name == "pre"
    assert cycle.read(REQUEST_HEADERS_KEY) == {"x-prefiller-host-port": "10.0.0.2:8200"}
    assert handle.recorder.disagg_decisions[-1][2] == "prefill-decode"


def test_no_decode_endpoint_fails_scheduling() -> None:
    handler, handle = _handler({"deciders": {"prefill": "pd"}}, {"pd": AlwaysDisaggPdDecider("pd")})
    with pytest.raises(SchedulingFailedError):
        scheduler(handler, handle.recorder).schedule(request(), [pod("pre", "prefill", "10.0.0.2")])
    assert handle.recorder.disagg_decisions == []


def test_pre_request_replaces_stale_header_values() -> None:
    handler, _ = _handler({}, {})
    cycle = CycleState()
    cycle.write(REQUEST_HEADERS_KEY, {"x-prefiller-host-port": "1.2.3.4:1", "x-other": "v"})
    from llm_epp.framework import SchedulingResult

    handler.pre_request(
        cycle, request(), SchedulingResult({"decode": ProfileResult((pod("d", None, "10.0.0.9"),))}, "decode")
    )
    assert cycle.read(REQUEST_HEADERS_KEY) == {"x-other": "v"}


def test_legacy_flat_parameters_and_custom_profile_names() -> None:
    handler, _ = _handler(
        {"decodeProfile": "d", "prefillProfile": "p", "deciderPluginName": "x", "stageOrder": "Decode_First"},
        {"x": AlwaysDisaggPdDecider("x")},
    )
    assert (handler.decode_profile, handler.prefill_profile, handler.encode_profile) == ("d", "p", "encode")
    assert handler.prefill_decider is not None and handler.prefill_decider.name == "x"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"stageOrder": "sideways"}, "stageOrder"),
        ({"stageOrder": "prefill-first", "deciders": {"prefill": "pd"}}, "prefill decider"),
        ({"profiles": {"decode": "d"}, "prefillProfile": "p"}, "flat"),
        ({"deciders": {"decode": "x"}}, "decode"),
    ],
)
def test_bad_parameters_are_rejected(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mod.Params.model_validate(params)


def test_a_missing_or_wrong_decider_is_reported_by_name() -> None:
    handler, handle = _handler({"deciders": {"prefill": "nope"}}, {})
    with pytest.raises(LookupError, match=r"deciders\.prefill: no plugin named 'nope'"):
        scheduler(handler, handle.recorder).schedule(request(), pool())
    with pytest.raises(ValueError, match="not a decider"):
        _handler({"deciders": {"prefill": "f"}}, {"f": FakeFilter("f")})


def test_an_unresolvable_decider_is_logged_when_the_loader_asks_for_its_data(caplog: pytest.LogCaptureFixture) -> None:
    handler, _ = _handler({"deciders": {"prefill": "typo"}}, {})
    with caplog.at_level("ERROR"):
        assert handler.consumes == frozenset()
        assert handler.consumes == frozenset()
    assert [r.getMessage() for r in caplog.records if "typo" in r.getMessage()] == [
        "disagg_decider_unresolved deciders.prefill: no plugin named 'typo' is configured; declare the decider; "
        "every request will fail until the config is fixed"
    ]
