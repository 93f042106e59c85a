"""passthrough-parser: opaque bodies, no model, no rewrite, no response reading; the fallback."""

from __future__ import annotations

from llm_epp.framework import ApiKind
from llm_epp.framework.parsing import Parser
from llm_epp.plugins.parsers import default_parsers
from llm_epp.plugins.parsers.passthrough_parser import TYPE, Params, PassthroughParser, factory
from tests.unit.builders import FakeHandle


def test_any_body_is_opaque_and_names_no_model() -> None:
    parser = PassthroughParser()
    for body in (b"", b"\x00\xff not json", b'{"model": "m", "query": "q"}'):
        parsed = parser.parse_request("/v1/rerank", {}, body)
        assert parsed.body.api is ApiKind.OPAQUE
        assert parsed.model == ""
        assert not parsed.body.payload
        assert parser.rewrite_model(parsed, body, "other") is None
        assert parser.response_reader(parsed, {"content-type": "application/json"}) is None


def test_claims_no_path_so_it_is_a_fallback() -> None:
    assert PassthroughParser().claims().paths == ()


def test_factory_and_default_list_order() -> None:
    parser = factory("pt", Params(), FakeHandle())
    assert isinstance(parser, Parser) and parser.typed_name.type == TYPE
    assert [p.typed_name.type for p in default_parsers()] == [
        "openai-parser",
        "anthropic-parser",
        "vllmhttp-parser",
        TYPE,
    ]
