"""always-disagg-multimodal-decider

Scheduling intent:
    A decider for `disagg-profile-handler` (`deciders.encode`): a request gets a separate encode stage
    when it carries multimodal content.

Inputs consumed:
    InferenceRequest.body.payload: a content block of type `image_url`, `video_url`, `input_audio`,
    `audio_url`, `input_image` or `image` in a chat message (`messages`) or a Responses input item
    (`input`). (llm-d-router reads the multimodal features its tokenizer extracted; llm-epp has no
    tokenizer in the path and reads the content blocks themselves.)

Configuration:
    No parameters. Referenced by name from a profile handler; it runs no hook of its own.
"""

from __future__ import annotations

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, PluginParams, TypedName
from llm_epp.plugins.disagg.common import has_multimodal_content

TYPE = "always-disagg-multimodal-decider"


class Params(PluginParams):
    pass


class AlwaysDisaggMultimodalDecider:
    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def disaggregate(self, cycle: CycleState, request: InferenceRequest, endpoint: Endpoint | None) -> bool:
        return has_multimodal_content(request)


def factory(name: str, params: Params, handle: Handle) -> AlwaysDisaggMultimodalDecider:
    return AlwaysDisaggMultimodalDecider(name)
