"""mm-embeddings-cache-scorer: the share of a request's multimodal items an endpoint holds, read from the
producer it names."""

from __future__ import annotations

import pytest

from llm_epp.framework import CycleState
from llm_epp.framework.registry import PluginParamsError
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.requestcontrol.mm_embeddings_cache_producer import (
    DEFAULT_MATCH_KEY,
    EncoderCacheMatch,
    MatchItem,
    match_key,
)
from llm_epp.plugins.scheduling.mm_embeddings_cache_scorer import MmEmbeddingsCacheScorer
from tests.unit.builders import FakeHandle, endpoints, key, request

EPS = endpoints("a", "b", "c")
ITEMS = (MatchItem("x", "image"), MatchItem("y", "image"), MatchItem("z", "video", size=2))


def test_score_is_matched_size_over_request_size() -> None:
    cycle = CycleState()
    cycle.write(DEFAULT_MATCH_KEY, EncoderCacheMatch(ITEMS, {key("a"): ITEMS[:1], key("b"): ITEMS[1:]}))
    scores = MmEmbeddingsCacheScorer().score(cycle, request(), EPS)
    assert scores == {key("a"): 0.25, key("b"): 0.75, key("c"): 0.0}


def test_no_match_or_no_items_scores_zero() -> None:
    scorer = MmEmbeddingsCacheScorer()
    assert set(scorer.score(CycleState(), request(), EPS).values()) == {0.0}
    cycle = CycleState()
    cycle.write(DEFAULT_MATCH_KEY, EncoderCacheMatch((), {}))
    assert set(scorer.score(cycle, request(), EPS).values()) == {0.0}


def test_producer_name_selects_whose_matches_are_read() -> None:
    registry = builtin_registry()
    named = registry.build("mm-embeddings-cache-scorer", "s", {"producerName": "enc"}, FakeHandle())
    default = registry.build("mm-embeddings-cache-scorer", "t", None, FakeHandle())
    assert isinstance(named, MmEmbeddingsCacheScorer) and isinstance(default, MmEmbeddingsCacheScorer)
    assert named.consumes == {match_key("enc").name} and default.consumes == {DEFAULT_MATCH_KEY.name}
    cycle = CycleState()
    cycle.write(match_key("enc"), EncoderCacheMatch(ITEMS[:1], {key("c"): ITEMS[:1]}))
    assert named.score(cycle, request(), EPS)[key("c")] == 1.0
    assert default.score(cycle, request(), EPS)[key("c")] == 0.0


@pytest.mark.parametrize("bad", [" enc", "a/b"])
def test_a_producer_name_that_is_not_a_plugin_name_is_refused(bad: str) -> None:
    with pytest.raises(PluginParamsError, match="producerName"):
        builtin_registry().parse_params("mm-embeddings-cache-scorer", {"producerName": bad})
