"""Tests for core-metrics-extractor: the built-in engine mappings on real-shaped pages, engine choice by
label, series selection (timestamps, LoRA by value), partial updates and parameter validation."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from llm_epp.datalayer.exposition import parse
from llm_epp.framework import EndpointKey, EndpointMetadata, Metrics, TypedName
from llm_epp.framework.datalayer import Extractor
from llm_epp.framework.registry import PluginParamsError, Registry
from llm_epp.framework.types import EMPTY_METRICS
from llm_epp.plugins.datalayer import core_metrics_extractor as mod
from llm_epp.plugins.datalayer.core_metrics_extractor import CoreMetricsExtractor, Spec, parse_spec
from tests.unit.builders import FakeHandle

TESTDATA = Path(__file__).resolve().parents[1] / "datalayer" / "testdata"
LABEL = "inference.networking.k8s.io/engine-type"
NOW = 1234.5


def ep(engine_label: str | None = None, engine: str = "vllm", **labels: str) -> EndpointMetadata:
    all_labels = dict(labels)
    if engine_label is not None:
        all_labels[LABEL] = engine_label
    return EndpointMetadata(EndpointKey("ns", "pod-rank-0"), "10.0.0.1", 8000, labels=all_labels, engine=engine)


def extract(
    extractor: CoreMetricsExtractor, body: bytes, md: EndpointMetadata, current: Metrics = EMPTY_METRICS
) -> tuple[Metrics | None, tuple[str, ...]]:
    page = parse(body, extractor.families(md))
    result = extractor.extract(page, md, current, NOW)
    return result.metrics, result.problems


def build(params: dict[str, object] | None = None) -> CoreMetricsExtractor:
    registry = Registry(entry_point_group=None)
    registry.register(mod.TYPE, mod.Params, mod.factory)
    plugin = registry.build(mod.TYPE, "ext", params, FakeHandle())
    assert isinstance(plugin, CoreMetricsExtractor)
    return plugin


def test_is_an_extractor_with_its_typed_name() -> None:
    plugin = build()
    assert isinstance(plugin, Extractor)
    assert plugin.typed_name == TypedName(mod.TYPE, "ext")
    assert plugin.engines == ("vllm", "sglang", "trtllm-serve", "triton-tensorrt-llm")


def test_vllm_page() -> None:
    metrics, problems = extract(build(), (TESTDATA / "vllm.txt").read_bytes(), ep())
    assert problems == ()
    assert metrics == Metrics(
        waiting_queue_size=3,
        running_requests=7,
        kv_cache_usage=0.4375,
        active_models=frozenset({"sql-lora", "tweet-lora"}),  # the newest lora_requests_info series
        waiting_models=frozenset({"news-lora"}),
        max_active_models=4,
        cache_block_size=16,
        cache_num_blocks=27310,
        update_time=NOW,
    )


def test_sglang_page() -> None:
    metrics, problems = extract(build(), (TESTDATA / "sglang.txt").read_bytes(), ep("sglang"))
    assert problems == ()
    assert metrics == Metrics(
        waiting_queue_size=4,
        running_requests=12,
        kv_cache_usage=0.62,
        cache_block_size=1,
        cache_num_blocks=131072,
        update_time=NOW,
    )


def test_trtllm_serve_page() -> None:
    metrics, problems = extract(build(), (TESTDATA / "trtllm_serve.txt").read_bytes(), ep("trtllm-serve"))
    assert problems == ()
    assert metrics == Metrics(
        waiting_queue_size=2,
        running_requests=5,
        kv_cache_usage=0.25,
        cache_block_size=32,
        cache_num_blocks=8192,
        update_time=NOW,
    )


def test_triton_page_selects_series_by_label() -> None:
    metrics, problems = extract(build(), (TESTDATA / "triton.txt").read_bytes(), ep("triton-tensorrt-llm"))
    assert problems == ()
    assert metrics == Metrics(
        waiting_queue_size=9,
        running_requests=6,
        kv_cache_usage=0.125,
        cache_block_size=64,
        cache_num_blocks=6239,
        update_time=NOW,
    )


def test_families_are_the_engines_metric_names() -> None:
    plugin = build()
    assert plugin.families(ep("triton-tensorrt-llm")) == {
        "nv_trt_llm_request_metrics",
        "nv_trt_llm_kv_cache_block_metrics",
    }
    assert "vllm:lora_requests_info" in plugin.families(ep())


@pytest.mark.parametrize(
    ("md", "engine"),
    [
        (ep(), "vllm"),
        (ep("sglang"), "sglang"),
        (ep("no-such-engine"), "vllm"),
        (ep(""), "vllm"),
        (ep(engine="sglang"), "sglang"),
        (ep("trtllm-serve", engine="sglang"), "trtllm-serve"),
    ],
    ids=["unlabeled", "labeled", "unknown-falls-back", "empty-label", "metadata-engine", "label-wins"],
)
def test_engine_choice(md: EndpointMetadata, engine: str) -> None:
    assert build().engine_of(md) == engine


def test_default_engine_and_label_key_are_configurable() -> None:
    plugin = build({"defaultEngine": "sglang", "engineLabelKey": "llm-d.ai/engine-type"})
    assert plugin.engine_of(ep()) == "sglang"
    assert plugin.engine_of(ep("vllm")) == "sglang"  # the old label key is not looked at
    md = EndpointMetadata(EndpointKey("", "x"), "10.0.0.1", 80, labels={"llm-d.ai/engine-type": "trtllm-serve"})
    assert plugin.engine_of(md) == "trtllm-serve"


def test_empty_strings_mean_the_defaults() -> None:
    plugin = build({"defaultEngine": "", "engineLabelKey": ""})
    assert plugin.default_engine == "vllm"
    assert plugin.engine_label_key == LABEL


def test_missing_families_are_reported_and_the_rest_still_applies() -> None:
    body = b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 5\n"
    previous = Metrics(running_requests=9, kv_cache_usage=0.9, update_time=1.0)
    metrics, problems = extract(build(), body, ep(), previous)
    assert metrics == Metrics(waiting_queue_size=5, running_requests=9, kv_cache_usage=0.9, update_time=NOW)
    assert problems == (
        "metric family 'vllm:num_requests_running' not found",
        "metric family 'vllm:kv_cache_usage_perc' not found",
        "metric family 'vllm:lora_requests_info' not found",
        "metric family 'vllm:cache_config_info' not found",
    )


def test_nothing_found_means_no_metrics() -> None:
    metrics, problems = extract(build(), b"other 1\n", ep())
    assert metrics is None
    assert len(problems) == 5


def test_the_newest_timestamp_wins_and_the_first_series_without_timestamps() -> None:
    body = b'm{a="old"} 1 1000\nm{a="new"} 2 3000\nm{a="mid"} 3 2000\nu{a="1"} 10\nu{a="2"} 20\n'
    plugin = build({"engineConfigs": [{"name": "custom", "queuedRequestsSpec": "m", "runningRequestsSpec": "u"}]})
    metrics, problems = extract(plugin, body, ep("custom"))
    assert problems == ()
    assert metrics is not None and (metrics.waiting_queue_size, metrics.running_requests) == (2, 10)


def test_a_series_with_a_timestamp_beats_ones_without() -> None:
    plugin = build({"engineConfigs": [{"name": "custom", "queuedRequestsSpec": "m"}]})
    metrics, _ = extract(plugin, b"m 1\nm 2 5\nm 3\n", ep("custom"))
    assert metrics is not None and metrics.waiting_queue_size == 2


def test_values_are_truncated_to_integers_for_counts() -> None:
    plugin = build({"engineConfigs": [{"name": "c", "queuedRequestsSpec": "q", "kvUsageSpec": "kv"}]})
    metrics, _ = extract(plugin, b"q 3.9\nkv 0.5\n", ep("c"))
    assert metrics is not None and (metrics.waiting_queue_size, metrics.kv_cache_usage) == (3, 0.5)


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf"])
def test_non_finite_values_are_reported_and_not_applied(value: str) -> None:
    plugin = build({"engineConfigs": [{"name": "c", "queuedRequestsSpec": "q", "kvUsageSpec": "kv"}]})
    body = f"q {value}\nkv {value}\n".encode()
    metrics, problems = extract(plugin, body, ep("c"), Metrics(waiting_queue_size=1, kv_cache_usage=0.1))
    assert metrics is None
    assert len(problems) == 2 and all("not a finite number" in p for p in problems)


def test_label_matchers_select_series_and_report_when_none_matches() -> None:
    plugin = build({"engineConfigs": [{"name": "c", "queuedRequestsSpec": 'r{type="waiting", pool=a}'}]})
    body = b'r{type="waiting",pool="b"} 1\nr{type="waiting",pool="a",extra="x"} 2\n'
    metrics, _ = extract(plugin, body, ep("c"))
    assert metrics is not None and metrics.waiting_queue_size == 2
    metrics, problems = extract(plugin, b'r{type="running",pool="a"} 1\n', ep("c"))
    assert metrics is None
    assert problems == ('no \'r\' series matches r{type="waiting",pool="a"}',)


def test_lora_takes_the_series_with_the_largest_value() -> None:
    body = (
        b'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a",waiting_lora_adapters=""} 20\n'
        b'vllm:lora_requests_info{max_lora="3",running_lora_adapters=" b , c ,",waiting_lora_adapters="d"} 30\n'
        b'vllm:lora_requests_info{max_lora="4",running_lora_adapters="e",waiting_lora_adapters=""} NaN\n'
    )
    metrics, _ = extract(build(), body, ep())
    assert metrics is not None
    assert (metrics.active_models, metrics.waiting_models, metrics.max_active_models) == (
        frozenset({"b", "c"}),
        frozenset({"d"}),
        3,
    )


def test_lora_without_adapters_clears_the_sets_and_keeps_max_when_absent() -> None:
    previous = Metrics(active_models=frozenset({"x"}), waiting_models=frozenset({"y"}), max_active_models=8)
    body = b'vllm:lora_requests_info{running_lora_adapters="",waiting_lora_adapters=""} 1\n'
    metrics, _ = extract(build(), body, ep(), previous)
    assert metrics is not None
    assert (metrics.active_models, metrics.waiting_models, metrics.max_active_models) == (frozenset(), frozenset(), 8)


def test_bad_integer_labels_are_reported() -> None:
    body = (
        b'vllm:lora_requests_info{max_lora="many",running_lora_adapters="a"} 1\n'
        b'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1\n'
    )
    metrics, problems = extract(build(), body, ep(), Metrics(cache_num_blocks=5))
    assert metrics is not None
    assert metrics.active_models == {"a"} and metrics.cache_block_size == 16 and metrics.cache_num_blocks == 5
    assert "'vllm:lora_requests_info' label max_lora='many' is not an integer" in problems
    assert "'vllm:cache_config_info' label num_gpu_blocks='None' is not an integer" in problems


def test_custom_cache_info_label_names() -> None:
    plugin = build(
        {
            "engineConfigs": [
                {
                    "name": "c",
                    "cacheInfoSpec": "info",
                    "cacheBlockSizeLabelName": "bs",
                    "cacheNumBlocksLabelName": "nb",
                }
            ]
        }
    )
    metrics, _ = extract(plugin, b'info{bs="64",nb="100",block_size="1"} 1\n', ep("c"))
    assert metrics is not None and (metrics.cache_block_size, metrics.cache_num_blocks) == (64, 100)


def test_a_user_entry_with_a_builtin_name_replaces_it_and_empty_specs_disable() -> None:
    plugin = build({"engineConfigs": [{"name": "vllm", "queuedRequestsSpec": "my_queue", "kvUsageSpec": ""}]})
    assert plugin.families(ep()) == {"my_queue"}
    body = (TESTDATA / "vllm.txt").read_bytes() + b"my_queue 11\n"
    metrics, problems = extract(plugin, body, ep())
    assert problems == ()
    assert metrics == Metrics(waiting_queue_size=11, update_time=NOW)
    assert build().families(ep("sglang")) == plugin.families(ep("sglang"))  # other built-ins stay


def test_default_engine_may_name_a_user_engine() -> None:
    plugin = build({"defaultEngine": "mine", "engineConfigs": [{"name": "mine", "queuedRequestsSpec": "q"}]})
    assert plugin.engine_of(ep()) == "mine"


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"engineConfigs": [{"name": "default"}]}, "'default' is reserved"),
        ({"engineConfigs": [{"name": ""}]}, "must not be empty"),
        ({"engineConfigs": [{"name": "a"}, {"name": "a"}]}, "configured twice"),
        ({"engineConfigs": [{"name": "a", "kvUsageSpec": "kv{"}]}, "engineConfigs[0].kvUsageSpec"),
        ({"engineConfigs": [{"name": "a", "loraSpec": 'x{a!="b"}'}]}, "only equality matchers"),
        ({"engineConfigs": [{"name": "a", "queuedRequestsSpec": "{a=b}"}]}, "not a metric selector"),
        ({"defaultEngine": "nope"}, "'nope' is neither a built-in engine nor in engineConfigs"),
        ({"engineConfigs": [{"name": "a", "queueSpec": "q"}]}, "unknown parameter"),
        ({"engineConfigs": [{"queuedRequestsSpec": "q"}]}, "Field required"),
    ],
    ids=[
        "reserved",
        "empty-name",
        "duplicate",
        "bad-spec",
        "regex-matcher",
        "no-name",
        "unknown-default",
        "unknown-key",
        "missing-name",
    ],
)
def test_invalid_params(params: dict[str, object], message: str) -> None:
    with pytest.raises(PluginParamsError) as info:
        build(params)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("", None),
        ("  ", None),
        ("vllm:num_requests_waiting", Spec("vllm:num_requests_waiting")),
        ("m{a=b}", Spec("m", (("a", "b"),))),
        ('m{a="b", c = "d e"}', Spec("m", (("a", "b"), ("c", "d e")))),
        ("m{a='b'}", Spec("m", (("a", "b"),))),
        ('m{a="x\\"y"}', Spec("m", (("a", 'x"y'),))),
        ("m{}", Spec("m")),
        (" m { a = b , } ", Spec("m", (("a", "b"),))),
    ],
)
def test_parse_spec(text: str, spec: Spec | None) -> None:
    assert parse_spec(text) == spec


@pytest.mark.parametrize("text", ["m{", "m{a}", "m{a=}", "9m", 'm{a=~"x"}', "m{a=b c=d}", "sum(m)"])
def test_parse_spec_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_spec(text)


def test_extract_does_not_touch_the_current_metrics() -> None:
    current = Metrics(waiting_queue_size=1)
    metrics, _ = extract(build(), b"vllm:num_requests_waiting 4\n", ep(), current)
    assert current.waiting_queue_size == 1
    assert metrics is not None and metrics is not current and not math.isnan(metrics.kv_cache_usage)


def test_custom_metrics_become_endpoint_attributes() -> None:
    from llm_epp.framework.registry import PluginParamsError as _Err
    from llm_epp.plugins import builtin_registry as _reg

    engine = {"name": "my-engine", "queuedRequestsSpec": "q"}
    good = {
        **engine,
        "customMetrics": [
            {"attributeKey": "custom.queue_depth", "metricSpec": "custom_queue_depth{tier=gold}"},
            {"attributeKey": "llm-d.ai/gpu-temp", "metricSpec": "gpu_temp"},
            {"attributeKey": "missing", "metricSpec": "absent_metric"},
        ],
    }
    params = _reg().parse_params("core-metrics-extractor", {"engineConfigs": [good], "defaultEngine": "my-engine"})
    ex = CoreMetricsExtractor("core-metrics-extractor", "", "my-engine", params.engine_configs)
    md = ep()
    assert {"custom_queue_depth", "gpu_temp", "absent_metric", "q"} <= ex.families(md)
    page = parse(
        b'q 3\ncustom_queue_depth{tier="silver"} 9\ncustom_queue_depth{tier="gold"} 7\ngpu_temp 71.5\n',
        ex.families(md),
    )
    result = ex.extract(page, md, Metrics(), 5.0)
    assert result.metrics is not None and result.metrics.waiting_queue_size == 3
    assert result.attributes == {
        "custom.queue_depth": 7.0,
        "custom.queue_depth/core-metrics-extractor": 7.0,
        "llm-d.ai/gpu-temp": 71.5,
        "llm-d.ai/gpu-temp/core-metrics-extractor": 71.5,
    }
    assert any("custom metric 'missing'" in p for p in result.problems)
    only_custom = ex.extract(parse(b"gpu_temp 70\n", ex.families(md)), md, Metrics(), 6.0)
    assert only_custom.metrics is not None and only_custom.metrics.update_time == 6.0
    twice = {
        **engine,
        "customMetrics": [{"attributeKey": "k", "metricSpec": "x"}, {"attributeKey": "k", "metricSpec": "y"}],
    }
    with pytest.raises(_Err, match="attributeKey is listed twice"):
        _reg().parse_params("core-metrics-extractor", {"engineConfigs": [twice]})
    bad = {**engine, "customMetrics": [{"attributeKey": "k", "metricSpec": "x{a=~b}"}]}
    with pytest.raises(_Err, match=r"customMetrics\[0\].metricSpec: .*only equality matchers"):
        _reg().parse_params("core-metrics-extractor", {"engineConfigs": [bad]})
    with pytest.raises(_Err, match="attributeKey"):
        _reg().parse_params(
            "core-metrics-extractor", {"engineConfigs": [{**engine, "customMetrics": [{"metricSpec": "x"}]}]}
        )
