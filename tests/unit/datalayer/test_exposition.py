"""Tests for the selective Prometheus text parser: only the requested samples come back, everything else
is skipped; escapes, timestamps, special floats, CRLF, truncation and non-metrics pages."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from llm_epp.datalayer import exposition
from llm_epp.datalayer.exposition import ExpositionError, parse

TESTDATA = Path(__file__).parent / "testdata"
VLLM_NAMES = frozenset(
    {
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc",
        "vllm:lora_requests_info",
        "vllm:cache_config_info",
    }
)


def page(text: str) -> bytes:
    return text.encode()


def test_vllm_page_returns_only_the_requested_families() -> None:
    got = parse((TESTDATA / "vllm.txt").read_bytes(), VLLM_NAMES)
    assert got.complete
    assert set(got.samples) == VLLM_NAMES
    (waiting,) = got.samples["vllm:num_requests_waiting"]
    assert waiting.value == 3.0
    assert dict(waiting.labels) == {"engine": "0", "model_name": "meta-llama/Llama-3.1-8B-Instruct"}
    assert waiting.timestamp_ms is None
    lora = got.samples["vllm:lora_requests_info"]
    assert [s.value for s in lora] == [1.7461234e09, 1.7461239e09]
    assert lora[1].labels["running_lora_adapters"] == "sql-lora,tweet-lora"
    assert lora[0].labels["waiting_lora_adapters"] == ""
    (cache,) = got.samples["vllm:cache_config_info"]
    assert cache.labels["block_size"] == "16"
    assert cache.labels["num_gpu_blocks"] == "27310"


def test_histogram_series_are_read_only_when_asked_for_by_their_sample_name() -> None:
    body = (TESTDATA / "vllm.txt").read_bytes()
    prefix_only = parse(body, {"vllm:time_to_first_token_seconds"})
    assert prefix_only.samples == {}  # the family name alone matches no sample line
    got = parse(body, {"vllm:time_to_first_token_seconds_count", "vllm:e2e_request_latency_seconds_bucket"})
    assert len(got.samples["vllm:time_to_first_token_seconds_count"]) == 3
    buckets = got.samples["vllm:e2e_request_latency_seconds_bucket"]
    assert len(buckets) == 3 * 22
    assert buckets[21].labels == {"engine": "0", "le": "+Inf", "model_name": "meta-llama/Llama-3.1-8B-Instruct"}


def test_names_sharing_a_prefix_are_told_apart() -> None:
    text = 'foo_bar 1\nfoo 2\nfoo{a="b"} 4\nfoo_total 3\n'
    got = parse(page(text), {"foo"})
    assert [s.value for s in got.samples["foo"]] == [2.0, 4.0]


def test_help_and_type_lines_never_match() -> None:
    text = "# HELP foo foo 9\n# TYPE foo gauge\nfoo 1\n"
    assert [s.value for s in parse(page(text), {"foo"}).samples["foo"]] == [1.0]


def test_first_line_of_the_page_is_read() -> None:
    assert parse(page("foo 1\nbar 2\n"), {"foo", "bar"}).samples["foo"][0].value == 1.0


@pytest.mark.parametrize(
    ("line", "labels"),
    [
        ('m{a="x\\"y"} 1', {"a": 'x"y'}),
        ('m{a="back\\\\slash"} 1', {"a": "back\\slash"}),
        ('m{a="two\\nlines"} 1', {"a": "two\nlines"}),
        ('m{a="}{,=# "} 1', {"a": "}{,=# "}),
        ('m{a="b",} 1', {"a": "b"}),
        ('m{ a = "b" , c="d" } 1', {"a": "b", "c": "d"}),
        ("m{} 1", {}),
        ("m 1", {}),
        ('m {a="b"} 1', {"a": "b"}),
        ('m{a="ünïcödé"} 1', {"a": "ünïcödé"}),
        ('m{a="x\\"y",b="z"} 1', {"a": 'x"y', "b": "z"}),
    ],
    ids=[
        "quote",
        "backslash",
        "newline",
        "specials",
        "trailing-comma",
        "blanks",
        "empty",
        "none",
        "blank-before",
        "utf8",
        "escape-then-plain",
    ],
)
def test_label_sets(line: str, labels: dict[str, str]) -> None:
    (sample,) = parse(page(line + "\n"), {"m"}).samples["m"]
    assert dict(sample.labels) == labels


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("NaN", math.nan),
        ("+Inf", math.inf),
        ("-Inf", -math.inf),
        ("1e-3", 0.001),
        ("-2.5", -2.5),
        ("7", 7.0),
        ("1.7461234e+09", 1.7461234e09),
    ],
)
def test_values(text: str, value: float) -> None:
    (sample,) = parse(page(f"m {text}\n"), {"m"}).samples["m"]
    assert sample.value == value or (math.isnan(value) and math.isnan(sample.value))


def test_timestamps() -> None:
    got = parse(page('m{a="1"} 1 1712345678000\nm{a="2"} 2 -5\nm{a="3"} 3\n'), {"m"})
    assert [s.timestamp_ms for s in got.samples["m"]] == [1712345678000, -5, None]


def test_crlf_and_blank_lines() -> None:
    text = '# TYPE m gauge\r\n\r\nm{a="b"} 1\r\nm 2 123\r\n\r\nother 3\r\n'
    got = parse(page(text), {"m", "other"})
    assert got.complete
    assert [(s.value, s.timestamp_ms) for s in got.samples["m"]] == [(1.0, None), (2.0, 123)]
    assert got.samples["other"][0].value == 3.0


def test_truncated_page_drops_the_cut_line_and_says_so() -> None:
    body = (TESTDATA / "vllm.txt").read_bytes()
    cut = body.index(b"vllm:kv_cache_usage_perc{") + 40
    got = parse(body[:cut], VLLM_NAMES)
    assert got.truncated and not got.complete
    assert "vllm:num_requests_waiting" in got.samples
    assert "vllm:kv_cache_usage_perc" not in got.samples
    assert "vllm:cache_config_info" not in got.samples


def test_cut_in_the_middle_of_a_value_is_not_read_as_a_smaller_number() -> None:
    got = parse(page("m 1\nn 12"), {"m", "n"})
    assert got.truncated
    assert "n" not in got.samples


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('m{a="b" 1', "malformed label set"),
        ("m{a=b} 1", "malformed label set"),
        ('m{a="b"c="d"} 1', "malformed label set"),
        ('m{1a="b"} 1', "bad label name"),
        ("m one", "bad value"),
        ("m 1_000", "bad value"),
        ("m", "expected a value"),
        ("m 1 2 3", "expected a value"),
        ("m 1 12.5", "bad timestamp"),
    ],
)
def test_malformed_wanted_lines_are_reported_and_skipped(line: str, reason: str) -> None:
    got = parse(page(f"m 0\n{line}\nm 2\nother 1\n"), {"m", "other"})
    assert not got.complete and not got.truncated
    assert [s.value for s in got.samples["m"]] == [0.0, 2.0]
    assert len(got.problems) == 1 and reason in got.problems[0] and got.problems[0].startswith("m: ")
    assert got.samples["other"][0].value == 1.0


def test_malformed_lines_of_unwanted_metrics_are_not_looked_at() -> None:
    assert parse(page("junk{{{ x\nm 1\n"), {"m"}).complete


def test_problems_are_capped() -> None:
    got = parse(page("m x\n" * 50), {"m"})
    assert len(got.problems) == 5


def test_the_search_ends_where_the_next_family_starts() -> None:
    got = parse(page("# TYPE m gauge\nm 1\nm 2\n# HELP other x\nother 0\nm 3\n"), {"m"})
    assert [s.value for s in got.samples["m"]] == [1.0, 2.0]


def test_samples_of_a_family_may_be_interleaved_with_its_other_series() -> None:
    got = parse(page('h_bucket{le="1"} 1\nh_count 1\nh_bucket{a="2",le="1"} 2\nh_count{a="2"} 2\n'), {"h_count"})
    assert [s.value for s in got.samples["h_count"]] == [1.0, 2.0]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"<!DOCTYPE html><html><body>502 Bad Gateway</body></html>", "HTML"),
        (b"\n  <html><head><title>Error</title></head></html>\n", "HTML"),
        (b'{"error": "not found"}\n', "not a Prometheus text page"),
        (b"m 1\n\x00\x01\x02garbage\n", "binary"),
        (b"\x1f\x8b\x08\x00gzipped", "not a Prometheus text page"),
    ],
    ids=["html", "html-leading-blank", "json", "nul-bytes", "gzip"],
)
def test_pages_that_are_not_metrics_raise(body: bytes, reason: str) -> None:
    with pytest.raises(ExpositionError) as info:
        parse(body, {"m"})
    assert reason in info.value.reason


@pytest.mark.parametrize("body", [b"", b"\n\n", b"   "], ids=["empty", "blank-lines", "spaces"])
def test_empty_pages_have_no_samples(body: bytes) -> None:
    got = parse(body, {"m"})
    assert got.samples == {} and got.complete


def test_missing_families_are_simply_absent() -> None:
    got = parse((TESTDATA / "vllm.txt").read_bytes(), {"vllm:num_requests_swapped", "sglang:num_queue_reqs"})
    assert got.samples == {} and got.complete


@pytest.mark.parametrize("name", ["sglang.txt", "trtllm_serve.txt", "triton.txt"])
def test_other_engine_pages_parse_cleanly(name: str) -> None:
    body = (TESTDATA / name).read_bytes()
    names = {line.split(" ")[2] for line in body.decode().splitlines() if line.startswith("# TYPE ")}
    got = parse(body, names)
    assert got.complete
    assert got.samples


def _every_name(text: str) -> frozenset[str]:
    return frozenset(
        line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")
    )


@pytest.mark.parametrize("name", ["vllm.txt", "sglang.txt", "triton.txt", "trtllm_serve.txt"])
def test_remembered_label_sets_parse_as_a_fresh_parse_does(name: str) -> None:
    text = (TESTDATA / name).read_text()
    names = _every_name(text)
    exposition._label_set.cache_clear()
    first = parse(text.encode(), names)
    second = parse(text.encode(), names)  # every label set now comes from memory
    assert exposition._label_set.cache_info().hits > 0
    assert first == second
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" in line:
            rest = line[line.index("{") :]
            assert exposition._labels_of_line(rest) == exposition._labels(rest)


@pytest.mark.parametrize(
    "line",
    [
        'm{a="x"} 1 }',  # a brace after the value: the label set does not end at the last one
        'm{a="x} 1',
        'm{a="x",b} 1',
        'm{a="1"}} 2',
        'm{a="\\"}"} 3',
    ],
)
def test_odd_label_sets_give_the_same_answer_as_before(line: str) -> None:
    rest = line[line.index("{") :]
    try:
        expected: object = exposition._labels(rest)
    except ValueError as e:
        expected = str(e)
    try:
        got: object = exposition._labels_of_line(rest)
    except ValueError as e:
        got = str(e)
    assert got == expected


def test_label_sets_remembered_stay_within_their_bound() -> None:
    exposition._label_set.cache_clear()
    limit = exposition.LABEL_SETS_REMEMBERED
    lines = "".join(f'm{{request="{i}"}} 1\n' for i in range(limit + 500))  # a server inventing label sets
    got = parse(lines.encode(), {"m"})
    assert len(got.samples["m"]) == limit + 500
    assert got.samples["m"][-1].labels == {"request": str(limit + 499)}
    assert exposition._label_set.cache_info().currsize == limit
