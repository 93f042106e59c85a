"""Request parsers (the reference's `requestHandler.parsers`)."""

from __future__ import annotations

from llm_epp.framework.parsing import Parser
from llm_epp.plugins.parsers.anthropic_parser import AnthropicParser
from llm_epp.plugins.parsers.openai_parser import OpenaiParser
from llm_epp.plugins.parsers.passthrough_parser import PassthroughParser
from llm_epp.plugins.parsers.vllmhttp_parser import VllmhttpParser


def default_parsers() -> list[Parser]:
    """The parsers used when none are configured: llm-d-router's default list (openai-parser,
    anthropic-parser, vllmhttp-parser), then passthrough-parser as the fallback for every other path."""
    return [OpenaiParser(), AnthropicParser(), VllmhttpParser(), PassthroughParser()]
