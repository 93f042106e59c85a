from __future__ import annotations

from llm_epp.framework import ApiKind, CycleState, InferenceRequest, RequestBody
from llm_epp.framework.tokenization import TOKENIZED_PROMPT_KEY, TokenizedPrompt
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.requestcontrol.tokenizer import Tokenizer
from tests.unit.builders import FakeHandle


async def test_the_legacy_name_builds_a_token_producer_with_the_same_parameters() -> None:
    plugin = builtin_registry().build("tokenizer", "legacy", {"estimate": {}}, FakeHandle())
    assert isinstance(plugin, Tokenizer)
    assert plugin.typed_name.type == "tokenizer"
    cycle = CycleState()
    body = RequestBody(ApiKind.GENERATE, {}, token_ids=(1, 2))
    await plugin.prepare_data(cycle, InferenceRequest("r", "m", "m", body), [])
    assert cycle.read(TOKENIZED_PROMPT_KEY) == TokenizedPrompt((1, 2))
