from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import llm_epp
from llm_epp.framework.plugin import TypedName
from llm_epp.observability.metrics import MetricsServer, PrometheusRecorder

G = "0.005 0.025 0.05 0.1 0.2 0.4 0.6 0.8 1 1.25 1.5 2 3 4 5 6 8 10 15 20 30 45 60 120 180 240 300 360 480 600 900 1200 1800 2700 3600"  # noqa: E501
S = "0.0001 0.0002 0.0005 0.001 0.002 0.005 0.01 0.02 0.05 0.1"
REQ = (
    "64 128 256 512 1024 2048 4096 8192 16384 32768 65536 131072 262144 524288 1.048576e+06 "
    "2.097152e+06 4.194304e+06 8.388608e+06 1.6777216e+07 3.3554432e+07 6.7108864e+07 1.34217728e+08 "
    "2.68435456e+08 5.36870912e+08 1.073741824e+09"
)
RESP = "1 8 16 32 64 128 256 512 1024 2048 4096 8192 16384 32778 65536"
TOK = RESP + " 131072 262144 524288 1.048576e+06"
OUT = "1 8 16 32 64 128 256 512 1024 2048 4096 8192"
NTPOT = "0.001 0.002 0.005 0.01 0.02 0.05 0.1 0.2 0.5 1 2 5 10"

QUEUE = TypedName("queue-scorer", "queue-scorer")


@pytest.fixture
def rec() -> PrometheusRecorder:
    return PrometheusRecorder(CollectorRegistry())


def families(rec: PrometheusRecorder) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(generate_latest(rec.registry).decode())}


def value(rec: PrometheusRecorder, metric: str, /, **labels: str) -> float | None:
    return rec.registry.get_sample_value(metric, labels)


def le_values(rec: PrometheusRecorder, name: str, **labels: str) -> list[str]:
    text = generate_latest(rec.registry).decode()
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name + "_bucket" and all(s.labels.get(k) == v for k, v in labels.items()):
                out.append(s.labels["le"])
    return out


def record_everything(rec: PrometheusRecorder) -> None:
    rec.model_rewrite("rule", "m", "m2")
    rec.prefix_index_size(1)
    rec.prefix_match(1.0, 64)
    rec.plugin_duration("Scorer", QUEUE, 0.0003)
    rec.plugin_error("Scorer", QUEUE)
    rec.scheduler_duration(0.001)
    rec.score_out_of_range(QUEUE)
    rec.scheduler_attempt(True, "t", "pod-a", "ns", "8000")
    rec.request_scheduled("m", "t", 0)
    rec.request_error("m", "t", "Internal")
    rec.running_requests("m", 1)
    rec.request_completed("m", "t", 2.0, 100, 200, 10, 20, 5)
    rec.set_pool_gauges("pool", 0.5, 1.0, 2.0, 2, {"pod-a": 1.0})
    rec.disagg_decision(TypedName("disagg-profile-handler", "h"), "m", "prefill-decode")
    rec.pd_decision(TypedName("pd-profile-handler", "h"), "m", "decode-only")


# name -> (type, label names without `le`)
EXPECTED = {
    "inference_objective_request": ("counter", {"model_name", "target_model_name", "priority"}),
    "inference_objective_request_error": ("counter", {"model_name", "target_model_name", "error_code"}),
    "inference_objective_request_duration_seconds": ("histogram", {"model_name", "target_model_name"}),
    "inference_objective_request_sizes": ("histogram", {"model_name", "target_model_name"}),
    "inference_objective_response_sizes": ("histogram", {"model_name", "target_model_name"}),
    "inference_objective_input_tokens": ("histogram", {"model_name", "target_model_name"}),
    "inference_objective_output_tokens": ("histogram", {"model_name", "target_model_name"}),
    "inference_objective_prompt_cached_tokens": ("histogram", {"model_name", "target_model_name"}),
    "inference_objective_normalized_time_per_output_token_seconds": (
        "histogram",
        {"model_name", "target_model_name"},
    ),
    "inference_objective_running_requests": ("gauge", {"model_name"}),
    "inference_pool_average_kv_cache_utilization": ("gauge", {"name"}),
    "inference_pool_average_queue_size": ("gauge", {"name"}),
    "inference_pool_average_running_requests": ("gauge", {"name"}),
    "inference_pool_ready_pods": ("gauge", {"name"}),
    "inference_pool_per_pod_queue_size": ("gauge", {"name", "model_server_pod"}),
    "inference_extension_scheduler_e2e_duration_seconds": ("histogram", set()),
    "inference_extension_scheduler_attempts": (
        "counter",
        {"status", "target_model_name", "pod_name", "namespace", "port"},
    ),
    "inference_extension_plugin_duration_seconds": (
        "histogram",
        {"extension_point", "plugin_type", "plugin_name"},
    ),
    "inference_extension_info": ("gauge", {"commit", "build_ref"}),
    "inference_extension_model_rewrite_decisions": ("counter", {"model_rewrite_name", "model_name", "target_model"}),
    "inference_extension_prefix_indexer_size": ("gauge", set()),
    "inference_extension_prefix_indexer_hit_ratio": ("histogram", set()),
    "inference_extension_prefix_indexer_hit_bytes": ("histogram", set()),
    "llm_epp_plugin_errors": ("counter", {"extension_point", "plugin_type", "plugin_name"}),
    "llm_epp_scores_out_of_range": ("counter", {"plugin_type", "plugin_name"}),
    "llm_d_epp_disagg_decision": ("counter", {"plugin_name", "plugin_type", "model_name", "decision_type"}),
    "llm_d_epp_pd_decision": ("counter", {"plugin_name", "plugin_type", "model_name", "decision_type"}),
}


def test_every_metric_has_reference_name_type_and_labels(rec: PrometheusRecorder) -> None:
    record_everything(rec)
    fams = families(rec)
    assert set(fams) == set(EXPECTED)
    for name, (mtype, labels) in EXPECTED.items():
        fam = fams[name]
        assert fam.type == mtype, name  # type: ignore[attr-defined]
        samples = fam.samples  # type: ignore[attr-defined]
        assert samples, name
        for s in samples:
            assert set(s.labels) - {"le"} == labels, (name, s.labels)


def test_help_carries_the_reference_stability_prefix(rec: PrometheusRecorder) -> None:
    text = generate_latest(rec.registry).decode()
    assert "# HELP inference_objective_request_total [ALPHA] Counter of inference objective" in text
    assert "# HELP inference_pool_per_pod_queue_size [ALPHA] " in text


def test_no_created_series(rec: PrometheusRecorder) -> None:
    record_everything(rec)
    assert "_created" not in generate_latest(rec.registry).decode()


@pytest.mark.parametrize(
    ("name", "labels", "expected"),
    [
        ("inference_objective_request_duration_seconds", {"model_name": "m"}, G),
        ("inference_objective_request_sizes", {"model_name": "m"}, REQ),
        ("inference_objective_response_sizes", {"model_name": "m"}, RESP),
        ("inference_objective_input_tokens", {"model_name": "m"}, TOK),
        ("inference_objective_prompt_cached_tokens", {"model_name": "m"}, TOK),
        ("inference_objective_output_tokens", {"model_name": "m"}, OUT),
        ("inference_objective_normalized_time_per_output_token_seconds", {"model_name": "m"}, NTPOT),
        ("inference_extension_scheduler_e2e_duration_seconds", {}, S),
        ("inference_extension_plugin_duration_seconds", {"plugin_type": "queue-scorer"}, S),
    ],
    ids=lambda v: v if isinstance(v, str) and v.startswith("inference") else "",
)
def test_buckets_match_the_reference_as_go_formats_them(
    rec: PrometheusRecorder, name: str, labels: dict[str, str], expected: str
) -> None:
    record_everything(rec)
    assert le_values(rec, name, **labels) == [*expected.split(), "+Inf"]


def test_request_completed_observes_all_histograms(rec: PrometheusRecorder) -> None:
    rec.request_completed("m", "t", 2.0, 1024, 5000, 100, 50, 32)
    labels = {"model_name": "m", "target_model_name": "t"}
    assert value(rec, "inference_objective_request_duration_seconds_sum", **labels) == 2.0
    assert value(rec, "inference_objective_request_duration_seconds_bucket", le="2", **labels) == 1
    assert value(rec, "inference_objective_request_duration_seconds_bucket", le="1.5", **labels) == 0
    assert value(rec, "inference_objective_request_sizes_sum", **labels) == 1024
    assert value(rec, "inference_objective_request_sizes_bucket", le="1024", **labels) == 1  # le inclusive
    assert value(rec, "inference_objective_request_sizes_bucket", le="512", **labels) == 0
    assert value(rec, "inference_objective_response_sizes_sum", **labels) == 5000
    assert value(rec, "inference_objective_input_tokens_sum", **labels) == 100
    assert value(rec, "inference_objective_output_tokens_sum", **labels) == 50
    assert value(rec, "inference_objective_prompt_cached_tokens_sum", **labels) == 32
    ntpot = "inference_objective_normalized_time_per_output_token_seconds"
    assert value(rec, ntpot + "_sum", **labels) == pytest.approx(0.04)
    assert value(rec, ntpot + "_bucket", le="0.05", **labels) == 1
    assert value(rec, ntpot + "_bucket", le="0.02", **labels) == 0
    assert value(rec, ntpot + "_count", **labels) == 1


def test_request_completed_skips_missing_token_counts(rec: PrometheusRecorder) -> None:
    rec.request_completed("m", "t", 1.0, 10, 20, None, None, None)
    rec.request_completed("m", "t", 1.0, 10, 20, 0, 0, 0)
    labels = {"model_name": "m", "target_model_name": "t"}
    assert value(rec, "inference_objective_request_duration_seconds_count", **labels) == 2
    assert value(rec, "inference_objective_input_tokens_count", **labels) == 0
    assert value(rec, "inference_objective_output_tokens_count", **labels) == 0
    assert value(rec, "inference_objective_normalized_time_per_output_token_seconds_count", **labels) == 0
    assert value(rec, "inference_objective_prompt_cached_tokens_count", **labels) == 1  # 0 is reported


def test_histogram_counts_are_cumulative_with_inf(rec: PrometheusRecorder) -> None:
    for seconds in (0.00005, 0.0001, 0.003, 0.5):
        rec.scheduler_duration(seconds)
    name = "inference_extension_scheduler_e2e_duration_seconds"
    assert value(rec, name + "_bucket", le="0.0001") == 2
    assert value(rec, name + "_bucket", le="0.005") == 3
    assert value(rec, name + "_bucket", le="0.1") == 3
    assert value(rec, name + "_bucket", le="+Inf") == 4
    assert value(rec, name + "_count") == 4
    assert value(rec, name + "_sum") == pytest.approx(0.50315)


def test_counters(rec: PrometheusRecorder) -> None:
    rec.request_scheduled("m", "t", 0)
    rec.request_scheduled("m", "t", 0)
    rec.request_scheduled("m", "t", -1)
    rec.request_error("m", "t", "ResourceExhausted")
    rec.request_error("m", "t", "")  # ignored, as in the reference
    rec.scheduler_attempt(True, "t", "pod-a", "ns", "8000")
    rec.scheduler_attempt(False, "", "", "", "")
    rec.plugin_error("Filter", TypedName("header-based-testing-filter", "f1"))
    rec.score_out_of_range(QUEUE)
    assert value(rec, "inference_objective_request_total", model_name="m", target_model_name="t", priority="0") == 2
    assert value(rec, "inference_objective_request_total", model_name="m", target_model_name="t", priority="-1") == 1
    err = {"model_name": "m", "target_model_name": "t"}
    assert value(rec, "inference_objective_request_error_total", error_code="ResourceExhausted", **err) == 1
    assert value(rec, "inference_objective_request_error_total", error_code="", **err) is None
    attempts = "inference_extension_scheduler_attempts_total"
    ok = {"target_model_name": "t", "pod_name": "pod-a", "namespace": "ns", "port": "8000"}
    assert value(rec, attempts, status="success", **ok) == 1
    failed = {"target_model_name": "", "pod_name": "", "namespace": "", "port": ""}
    assert value(rec, attempts, status="failure", **failed) == 1
    plugin = {"extension_point": "Filter", "plugin_type": "header-based-testing-filter", "plugin_name": "f1"}
    assert value(rec, "llm_epp_plugin_errors_total", **plugin) == 1
    assert value(rec, "llm_epp_scores_out_of_range_total", plugin_type="queue-scorer", plugin_name="queue-scorer") == 1


def test_plugin_duration_labels(rec: PrometheusRecorder) -> None:
    rec.plugin_duration("Scorer", TypedName("queue-scorer", "my-queue"), 0.0004)
    rec.plugin_duration("Scorer", TypedName("queue-scorer", "my-queue"), 0.0004)
    labels = {"extension_point": "Scorer", "plugin_type": "queue-scorer", "plugin_name": "my-queue"}
    assert value(rec, "inference_extension_plugin_duration_seconds_count", **labels) == 2
    assert value(rec, "inference_extension_plugin_duration_seconds_bucket", le="0.0005", **labels) == 2


def test_running_requests_gauge(rec: PrometheusRecorder) -> None:
    rec.running_requests("m", 1)
    rec.running_requests("m", 1)
    rec.running_requests("m", -1)
    rec.running_requests("", 1)  # no series for an empty model, as in the reference
    assert value(rec, "inference_objective_running_requests", model_name="m") == 1
    assert value(rec, "inference_objective_running_requests", model_name="") is None


def test_info_gauge(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_EPP_COMMIT", "abc123")
    rec = PrometheusRecorder(CollectorRegistry())
    assert value(rec, "inference_extension_info", commit="abc123", build_ref=llm_epp.__version__) == 1
    monkeypatch.delenv("LLM_EPP_COMMIT")
    rec = PrometheusRecorder(CollectorRegistry())
    assert value(rec, "inference_extension_info", commit="unknown", build_ref=llm_epp.__version__) == 1


def test_pool_gauges_replace_per_pod_series(rec: PrometheusRecorder) -> None:
    rec.set_pool_gauges("pool", 0.25, 1.5, 3.0, 2, {"pod-a": 1.0, "pod-b": 2.0})
    assert value(rec, "inference_pool_average_kv_cache_utilization", name="pool") == 0.25
    assert value(rec, "inference_pool_average_queue_size", name="pool") == 1.5
    assert value(rec, "inference_pool_average_running_requests", name="pool") == 3.0
    assert value(rec, "inference_pool_ready_pods", name="pool") == 2
    per_pod = "inference_pool_per_pod_queue_size"
    assert value(rec, per_pod, name="pool", model_server_pod="pod-b") == 2.0
    rec.set_pool_gauges("pool", 0.5, 4.0, 1.0, 1, {"pod-a": 4.0})
    assert value(rec, per_pod, name="pool", model_server_pod="pod-a") == 4.0
    assert value(rec, per_pod, name="pool", model_server_pod="pod-b") is None
    assert value(rec, "inference_pool_ready_pods", name="pool") == 1


def test_recorders_are_independent() -> None:
    a, b = PrometheusRecorder(), PrometheusRecorder()
    a.request_scheduled("m", "t", 0)
    assert value(a, "inference_objective_request_total", model_name="m", target_model_name="t", priority="0") == 1
    assert value(b, "inference_objective_request_total", model_name="m", target_model_name="t", priority="0") is None


def test_metrics_server_serves_and_stops(rec: PrometheusRecorder) -> None:
    rec.request_scheduled("m", "t", 0)
    server = MetricsServer(rec.registry, "127.0.0.1", 0).start()
    try:
        port = server.port
        assert port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            body = resp.read().decode()
            assert resp.status == 200
        assert 'inference_objective_request_total{model_name="m",priority="0",target_model_name="t"} 1.0' in body
    finally:
        server.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
    with pytest.raises(RuntimeError):
        _ = server.port
    server.stop()  # idempotent


def test_metrics_server_context_manager(rec: PrometheusRecorder) -> None:
    with MetricsServer(rec.registry, "127.0.0.1", 0) as server:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as resp:
            assert b"inference_extension_info" in resp.read()


def test_prefix_index_and_rewrite_metrics(rec: PrometheusRecorder) -> None:
    rec.prefix_index_size(42)
    rec.prefix_match(0.5, 1024)
    rec.model_rewrite("canary", "m", "m-v2")
    assert value(rec, "inference_extension_prefix_indexer_size") == 42
    assert value(rec, "inference_extension_prefix_indexer_hit_ratio_count") == 1
    assert value(rec, "inference_extension_prefix_indexer_hit_bytes_sum") == 1024
    labels = {"model_rewrite_name": "canary", "model_name": "m", "target_model": "m-v2"}
    assert value(rec, "inference_extension_model_rewrite_decisions_total", **labels) == 1
