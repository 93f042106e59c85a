"""burst-prefix-cache-producer: requests of one window that share a prompt land together; groups are
balanced across replicas, capped by maxPerReplica, joined by prefix-sharing singles with minColocateBlocks,
and balanced by blocks with balanceBy tokens. Also through a loaded configuration and the real director,
with a window longer than the director's default PrepareData deadline."""

from __future__ import annotations

import asyncio
import json
import struct
from collections import Counter
from collections.abc import Sequence

import pytest
import xxhash

from llm_epp.config import load_config_text
from llm_epp.datalayer import Datastore
from llm_epp.datalayer.static import parse_endpoint_list
from llm_epp.framework import ApiKind, CycleState, Endpoint, EndpointMetadata, InferenceRequest, Metrics, RequestBody
from llm_epp.framework.registry import PluginParamsError
from llm_epp.framework.tokenization import TOKENIZED_PROMPT_KEY, TokenizedPrompt
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.parsers import default_parsers
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import PrefixMatch, prefix_match_key
from llm_epp.plugins.requestcontrol.burst_prefix_cache_producer import (
    BurstPrefixCacheProducer,
    Params,
    block_hashes,
)
from llm_epp.requestcontrol.decision import RequestInput
from llm_epp.requestcontrol.director import PREPARE_DATA_TIMEOUT_S, Director, DirectorOptions, RequestPlugins
from tests.unit.builders import FakeRecorder, key

BS = 4


def ep(name: str, i: int, running: int = 0) -> Endpoint:
    return Endpoint(EndpointMetadata(key(name), f"10.0.5.{i}", 8000), Metrics(running_requests=running))


A, B, C = ep("a", 1), ep("b", 2), ep("c", 3)


def req(i: int = 0) -> InferenceRequest:
    return InferenceRequest(f"r{i}", "m", "m", RequestBody(ApiKind.COMPLETIONS, {"model": "m", "prompt": "x"}))


def producer(**params: object) -> BurstPrefixCacheProducer:
    return BurstPrefixCacheProducer("burst", Params.model_validate({"blockSizeTokens": BS, **params}))


def tokens(seed: int, blocks: int) -> tuple[int, ...]:
    return tuple(range(seed * 1000, seed * 1000 + blocks * BS))


async def window(
    plugin: BurstPrefixCacheProducer, prompts: Sequence[tuple[int, ...] | None], pool: Sequence[Endpoint] = (A, B, C)
) -> list[PrefixMatch]:
    """Sends `prompts` into one window at once; the match each request got."""

    async def one(i: int, prompt: tuple[int, ...] | None) -> PrefixMatch:
        cycle = CycleState()
        if prompt is not None:
            cycle.write(TOKENIZED_PROMPT_KEY, TokenizedPrompt(prompt))
        await plugin.prepare_data(cycle, req(i), pool)
        match = cycle.read(plugin.match_key)
        assert match is not None
        return match

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


def placed(matches: Sequence[PrefixMatch]) -> list[str | None]:
    """The replica each request was steered to (its full match), or None."""
    out: list[str | None] = []
    for m in matches:
        full = [k.name for k, n in m.matches.items() if n == m.total_blocks and n > 0]
        assert len(full) <= 1 and all(n in (0, m.total_blocks) for n in m.matches.values())
        out.append(full[0] if full else None)
    return out


def test_block_hashes_chain_every_block_including_a_partial_tail() -> None:
    toks = list(range(10))  # two blocks of 4 and a tail of 2
    seed = xxhash.xxh64_intdigest(b"m" + b"salt")
    expected = []
    prev = seed
    for chunk in ([0, 1, 2, 3], [4, 5, 6, 7], [8, 9]):
        block_id = xxhash.xxh64_intdigest(struct.pack(f"<{len(chunk)}I", *chunk))
        prev = xxhash.xxh64_intdigest(struct.pack("<QQ", block_id, prev))
        expected.append(prev)
    assert block_hashes(toks, "m", "salt", 4, 2048) == expected
    assert block_hashes(toks, "m", "salt", 4, 2) == expected[:2]
    assert block_hashes(toks, "m", "", 4, 2048) != expected
    assert block_hashes([], "m", "", 4, 2048) == []


async def test_samples_of_one_prompt_land_on_one_replica_and_groups_spread() -> None:
    plugin = producer()
    p, q = tokens(1, 3), tokens(2, 3)
    matches = await window(plugin, [p, q, p, p, q, tokens(3, 3)])
    where = placed(matches)
    assert where[0] == where[2] == where[3] and where[1] == where[4] and where[0] != where[1]
    assert where[5] is None  # a prompt nobody else sent gets no affinity
    assert matches[0].total_blocks == 3 and matches[0].block_size_tokens == BS
    assert plugin.windows == 1


async def test_max_per_replica_spills_a_group_over_the_least_loaded_replicas() -> None:
    matches = await window(producer(maxPerReplica=2), [tokens(1, 2)] * 5)
    assert sorted(Counter(placed(matches)).values()) == [1, 2, 2]


async def test_min_colocate_blocks_joins_a_prefix_sharing_request_to_its_group() -> None:
    p, q = tokens(1, 4), tokens(2, 4)
    longer = (*p, *tokens(9, 2))  # shares p's 4 blocks, then goes on
    for min_blocks, joins in ((2, True), (0, False)):
        matches = await window(producer(minColocateBlocks=min_blocks), [p, p, q, q, longer], pool=(A, B))
        where = placed(matches)
        assert where[0] == where[1] != where[2] == where[3]
        assert (where[4] == where[0]) is joins and (where[4] is None) is not joins


async def test_balance_by_tokens_weighs_a_long_prompt_by_its_blocks() -> None:
    long, short1, short2 = tokens(1, 10), tokens(2, 1), tokens(3, 1)
    prompts = [long, long, short1, short1, short2, short2]
    by_requests = placed(await window(producer(), prompts, pool=(A, B)))
    by_tokens = placed(await window(producer(balanceBy="tokens"), prompts, pool=(A, B)))
    assert by_requests[0] == by_requests[4]  # 2 requests each so far: the tie goes to the lower name
    assert by_tokens[0] != by_tokens[2] == by_tokens[4]  # both short prompts beside the 10-block one


async def test_ties_go_to_fewer_running_requests() -> None:
    busy_a, idle_b = ep("a", 1, running=5), ep("b", 2, running=0)
    assert placed(await window(producer(), [tokens(1, 2)] * 2, pool=(busy_a, idle_b))) == ["b", "b"]


async def test_a_window_closes_and_the_next_request_opens_another() -> None:
    plugin = producer(windowDurationMs=20)
    first = await window(plugin, [tokens(1, 2)] * 2)
    second = await window(plugin, [tokens(1, 2)])
    assert placed(first)[0] is not None and placed(second) == [None]  # alone in its window
    assert plugin.windows == 2


async def test_a_full_window_refuses_more_requests() -> None:
    plugin = producer(maxBatchSize=2)
    with pytest.raises(RuntimeError, match="maxBatchSize 2 reached"):
        await window(plugin, [tokens(1, 2)] * 3)


async def test_requests_without_tokens_wait_and_get_no_match() -> None:
    matches = await window(producer(), [None, None, tokens(1, 1), tokens(1, 1)])
    assert placed(matches)[:2] == [None, None] and matches[0].total_blocks == 0
    assert placed(matches)[2] == placed(matches)[3] is not None


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"windowDurationMs": 0}, "windowDurationMs"),
        ({"windowDurationMs": 10_001}, "windowDurationMs"),
        ({"maxPerReplica": 0}, "-1 \\(unlimited\\) or >= 1"),
        ({"maxBatchSize": -2}, "-1 \\(unlimited\\) or >= 1"),
        ({"blockSizeTokens": 0}, "blockSizeTokens"),
        ({"maxPrefixTokensToMatch": 10}, "must be 0 or >= blockSizeTokens"),
        ({"minColocateBlocks": -1}, "minColocateBlocks"),
        ({"balanceBy": "bytes"}, "balanceBy"),
    ],
)
def test_bad_parameters_are_refused(params: dict[str, object], message: str) -> None:
    with pytest.raises(PluginParamsError, match=message):
        builtin_registry().parse_params("burst-prefix-cache-producer", params)


def test_max_prefix_tokens_bound_the_blocks() -> None:
    assert Params().max_blocks == 2048
    assert Params.model_validate({"maxPrefixTokensToMatch": 200}).max_blocks == 3  # 200 // 64


CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: burst-prefix-cache-producer
  parameters: {windowDurationMs: 600, blockSizeTokens: 4}
- type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: burst-prefix-cache-producer}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: prefix-cache-scorer, weight: 2}, {pluginRef: max-score-picker}]
"""


async def test_a_burst_through_the_director_lands_on_one_pod() -> None:
    """The reference sample's pipeline (token-producer created by the loader), with a window longer than
    the director's default PrepareData deadline: the whole burst of one prompt is routed to one pod."""
    loaded = load_config_text(CONFIG, builtin_registry(), FakeRecorder())
    burst = loaded.plugins["burst-prefix-cache-producer"]
    assert isinstance(burst, BurstPrefixCacheProducer) and burst.prepare_data_timeout_s > PREPARE_DATA_TIMEOUT_S
    assert loaded.plugins["prefix-cache-scorer"].consumes == {prefix_match_key("burst-prefix-cache-producer").name}  # type: ignore[attr-defined]
    ds = Datastore()
    ds.replace_all(parse_endpoint_list(",".join(f"10.0.6.{i}:8000" for i in range(1, 5))))
    rec = FakeRecorder()
    director = Director(
        ds.snapshot,
        loaded.scheduler,
        RequestPlugins(prepare_data=loaded.prepare_data, pre_request=loaded.pre_request),
        rec,
        DirectorOptions(),
        parsers=default_parsers(),
    )

    def body(prompt: str) -> bytes:
        return json.dumps({"model": "m", "prompt": prompt, "max_tokens": 1}).encode()

    def send(i: int, prompt: str) -> RequestInput:
        return RequestInput(f"r{i}", {":path": "/v1/completions"}, body(prompt), None)

    prompts = ["the same long rollout prompt " * 8] * 6 + ["another prompt entirely " * 8] * 6
    decisions = await asyncio.gather(*(director.route(send(i, p)) for i, p in enumerate(prompts)))
    first = {d.destination for d in decisions[:6]}
    second = {d.destination for d in decisions[6:]}
    assert len(first) == 1 and len(second) == 1 and first != second
    assert burst.windows == 1
