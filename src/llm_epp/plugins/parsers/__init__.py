"""Request parsers (the reference's `requestHandler.parsers`)."""

from __future__ import annotations

from llm_epp.framework.parsing import Parser
from llm_epp.plugins.parsers.openai_parser import OpenaiParser
from llm_epp.plugins.parsers.passthrough_parser import PassthroughParser


def default_parsers() -> list[Parser]:
    """The parsers used when none are configured: openai-parser, then passthrough-parser as the fallback
    (the reference's default list, for the parser types that exist here)."""
    return [OpenaiParser(), PassthroughParser()]
