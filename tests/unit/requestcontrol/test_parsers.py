"""Parser resolution: longest claimed suffix wins, the first fallback ends registration, 400 naming the path."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from llm_epp.framework import ApiKind, EppError, RequestBody, TypedName
from llm_epp.framework.parsing import Claims, ParsedRequest, ResponseReader
from llm_epp.requestcontrol.parsers import ParserTable, path_matches, request_path


class P:
    def __init__(self, kind: str, *paths: str, name: str = "") -> None:
        self.typed_name = TypedName(kind, name or kind)
        self._paths = paths

    def claims(self) -> Claims:
        return Claims(paths=self._paths)

    def parse_request(self, path: str, headers: Mapping[str, str], body: bytes) -> ParsedRequest:
        return ParsedRequest(RequestBody(ApiKind.OPAQUE))

    def rewrite_model(self, parsed: ParsedRequest, body: bytes, model: str) -> bytes | None:
        return None

    def response_reader(self, parsed: ParsedRequest, headers: Mapping[str, str]) -> ResponseReader | None:
        return None


def resolved(table: ParserTable, path: str) -> str:
    return table.resolve(path).typed_name.name


def test_longest_suffix_wins_regardless_of_order() -> None:
    short, long = P("short", "completions"), P("long", "/chat/completions/")
    for order in ([short, long], [long, short]):
        table = ParserTable(order)
        assert resolved(table, "/v1/chat/completions") == "long"
        assert resolved(table, "/v1/completions") == "short"
        assert resolved(table, "/v1/chat/completions/") == "long"


def test_equal_suffixes_go_to_the_first_registered() -> None:
    table = ParserTable([P("a", "x/y"), P("b", "/x/y")])
    assert resolved(table, "/v1/x/y") == "a"


def test_fallback_takes_unclaimed_paths_and_ends_registration() -> None:
    table = ParserTable([P("openai", "completions"), P("pass"), P("late", "rerank")])
    assert resolved(table, "/v1/rerank") == "pass"  # `late` comes after the fallback: never used
    assert resolved(table, "/v1/completions") == "openai"
    assert [p.typed_name.name for p in table.parsers] == ["openai", "pass"]


def test_a_second_parser_of_a_type_is_skipped() -> None:
    table = ParserTable([P("openai", "completions", name="one"), P("openai", "embeddings", name="two")])
    assert [p.typed_name.name for p in table.parsers] == ["one"]
    with pytest.raises(EppError):
        table.resolve("/v1/embeddings")


@pytest.mark.parametrize("parsers", [[], [P("openai", "completions")]], ids=["none", "no-fallback"])
def test_no_match_without_fallback_is_a_400_naming_the_path(parsers: list[P]) -> None:
    with pytest.raises(EppError) as err:
        ParserTable(parsers).resolve("/v1/rerank")
    assert err.value.code.http_status == 400
    assert "'/v1/rerank'" in err.value.message and "passthrough-parser" in err.value.message


def test_path_matching_and_path_source() -> None:
    assert path_matches("/v1/chat/completions/", "chat/completions")
    assert not path_matches("/v1/rerank", "completions")
    assert request_path({":path": "/v1/chat/completions?x=1", "x-original-path": "/a"}) == "/v1/chat/completions"
    assert request_path({"x-original-path": "/v1/embeddings"}) == "/v1/embeddings"
    assert request_path({"x-forwarded-path": "/v1/responses"}) == "/v1/responses"
    assert request_path({}) == "/v1/completions"
