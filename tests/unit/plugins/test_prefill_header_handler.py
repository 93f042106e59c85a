"""Tests for prefill-header-handler: the older name of disagg-headers-handler, same behaviour."""

from __future__ import annotations

from llm_epp.framework import CycleState, ProfileResult, SchedulingResult, TypedName
from llm_epp.framework.requestcontrol import REQUEST_HEADERS_KEY
from llm_epp.plugins.disagg import prefill_header_handler as mod
from tests.unit.builders import FakeHandle, endpoint, request


def test_writes_the_prefill_header_for_the_named_profile() -> None:
    handler = mod.factory("h", mod.Params.model_validate({"prefillProfile": "pf"}), FakeHandle())
    result = SchedulingResult(
        {
            "decode": ProfileResult((endpoint("d"),)),
            "pf": ProfileResult((endpoint("p", address="10.1.1.1", port=8200),)),
        },
        "decode",
    )
    cycle = CycleState()
    handler.pre_request(cycle, request(), result)
    assert cycle.read(REQUEST_HEADERS_KEY) == {"x-prefiller-host-port": "10.1.1.1:8200"}
    assert handler.typed_name == TypedName("prefill-header-handler", "h")
