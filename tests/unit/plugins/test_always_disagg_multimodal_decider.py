"""Tests for always-disagg-multimodal-decider: an encode stage only for requests with media blocks."""

from __future__ import annotations

from typing import Any

import pytest

from llm_epp.framework import ApiKind, CycleState, TypedName
from llm_epp.plugins.disagg import always_disagg_multimodal_decider as mod
from tests.unit.builders import FakeHandle, request


def _chat(content: Any) -> Any:
    return request(
        payload={"model": "m", "messages": [{"role": "system", "content": "hi"}, {"role": "user", "content": content}]}
    )


@pytest.mark.parametrize("block_type", ["image_url", "video_url", "input_audio"])
def test_media_blocks_in_chat_messages_disaggregate(block_type: str) -> None:
    decider = mod.factory("m", mod.Params(), FakeHandle())
    req = _chat([{"type": "text", "text": "what is this"}, {"type": block_type, block_type: {"url": "u"}}])
    assert decider.disaggregate(CycleState(), req, None)


@pytest.mark.parametrize(
    "content",
    ["plain text", [{"type": "text", "text": "image_url"}], [], None],
    ids=["string", "text-block", "empty", "none"],
)
def test_text_only_requests_do_not(content: Any) -> None:
    assert not mod.AlwaysDisaggMultimodalDecider("m").disaggregate(CycleState(), _chat(content), None)


def test_responses_input_image() -> None:
    payload = {"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}
    req = request(api=ApiKind.RESPONSES, payload=payload)
    assert mod.AlwaysDisaggMultimodalDecider("m").disaggregate(CycleState(), req, None)


def test_identity() -> None:
    assert mod.AlwaysDisaggMultimodalDecider("z").typed_name == TypedName("always-disagg-multimodal-decider", "z")
