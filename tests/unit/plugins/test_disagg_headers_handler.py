"""Tests for disagg-headers-handler (and its older name prefill-header-handler)."""

from __future__ import annotations

from llm_epp.framework import CycleState, ProfileResult, SchedulingResult, TypedName
from llm_epp.framework.requestcontrol import REQUEST_HEADERS_KEY
from llm_epp.plugins.disagg import disagg_headers_handler as mod
from tests.unit.builders import FakeHandle, endpoint, request


def _result() -> SchedulingResult:
    return SchedulingResult(
        {
            "d": ProfileResult((endpoint("dec", address="10.0.0.1"),)),
            "p": ProfileResult((endpoint("pre1", address="10.0.0.2", port=81), endpoint("pre2", address="10.0.0.3"))),
            "e": ProfileResult(
                (endpoint("e1", address="10.0.0.4", port=91), endpoint("e2", address="fd00::5", port=92))
            ),
        },
        "d",
    )


def test_writes_the_first_prefill_and_every_encoder() -> None:
    params = mod.Params.model_validate({"prefillProfile": "p", "encodeProfile": "e"})
    handler = mod.factory("h", params, FakeHandle())
    cycle = CycleState()
    handler.pre_request(cycle, request(), _result())
    assert cycle.read(REQUEST_HEADERS_KEY) == {
        "x-prefiller-host-port": "10.0.0.2:81",
        "x-encoder-hosts-ports": "10.0.0.4:91,[fd00::5]:92",
    }
    assert handler.typed_name == TypedName("disagg-headers-handler", "h")


def test_profiles_that_did_not_run_clear_the_headers() -> None:
    handler = mod.factory("h", mod.Params(), FakeHandle())
    cycle = CycleState()
    cycle.write(REQUEST_HEADERS_KEY, {"x-prefiller-host-port": "6.6.6.6:1", "x-encoder-hosts-ports": "6.6.6.6:2"})
    handler.pre_request(cycle, request(), _result())  # default names "prefill"/"encode" are not in the result
    assert cycle.read(REQUEST_HEADERS_KEY) == {}
    empty = SchedulingResult({"d": ProfileResult((endpoint("d"),)), "prefill": ProfileResult(())}, "d")
    handler.pre_request(cycle, request(), empty)
    assert cycle.read(REQUEST_HEADERS_KEY) == {}
