from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import llm_epp
from llm_epp.framework.plugin import TypedName
from llm_epp.observability.metrics import OTHER, MetricsServer, PrometheusRecorder

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


MODELS = frozenset({"m", "t", "m2", "m-v2"})


@pytest.fixture
def rec() -> PrometheusRecorder:
    return PrometheusRecorder(CollectorRegistry(), known_models=MODELS)


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
}


RQ = {"model_name", "target_model_name", "fairness_id", "priority"}
PREFIX = {"plugin_name", "plugin_type"}
# llm-d-router's canonical names (pkg/epp/metrics/llm_d_router_metrics.go, docs/metrics.md), emitted beside
# the names above.
CANONICAL = {
    "llm_d_epp_request": ("counter", RQ),
    "llm_d_epp_request_error": ("counter", RQ | {"error_code"}),
    "llm_d_epp_request_duration_seconds": ("histogram", RQ),
    "llm_d_epp_request_size_bytes": ("histogram", RQ),
    "llm_d_epp_response_size_bytes": ("histogram", RQ),
    "llm_d_epp_request_input_tokens": ("histogram", RQ),
    "llm_d_epp_request_output_tokens": ("histogram", RQ),
    "llm_d_epp_request_cached_tokens": ("histogram", RQ),
    "llm_d_epp_request_ntpot_seconds": ("histogram", RQ),
    "llm_d_epp_request_running": ("gauge", RQ),
    "llm_d_epp_average_kv_cache_utilization": ("gauge", {"name"}),
    "llm_d_epp_average_queue_size": ("gauge", {"name"}),
    "llm_d_epp_average_running_requests": ("gauge", {"name"}),
    "llm_d_epp_ready_endpoints": ("gauge", {"name"}),
    "llm_d_epp_per_endpoint_queue_size": ("gauge", {"name", "model_server_endpoint"}),
    "llm_d_epp_scheduler_e2e_duration_seconds": ("histogram", set()),
    "llm_d_epp_scheduler_attempts": ("counter", {"status", "target_model_name", "endpoint_name", "namespace", "port"}),
    "llm_d_epp_plugin_duration_seconds": ("histogram", {"extension_point", "plugin_type", "plugin_name"}),
    "llm_d_epp_info": ("gauge", {"commit", "build_ref"}),
    "llm_d_epp_model_rewrite_decisions": ("counter", {"model_rewrite_name", "model_name", "target_model"}),
    "llm_d_epp_prefix_indexer_size": ("gauge", PREFIX),
    "llm_d_epp_prefix_indexer_hit_ratio": ("histogram", PREFIX),
    "llm_d_epp_prefix_indexer_hit_bytes": ("histogram", PREFIX),
}


def test_every_metric_has_reference_name_type_and_labels(rec: PrometheusRecorder) -> None:
    record_everything(rec)
    fams = families(rec)
    assert set(fams) == set(EXPECTED) | set(CANONICAL)
    for name, (mtype, labels) in {**EXPECTED, **CANONICAL}.items():
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
    # Never observed: no series at all, as a Go HistogramVec child that was never created.
    assert value(rec, "inference_objective_input_tokens_count", **labels) is None
    assert value(rec, "inference_objective_output_tokens_count", **labels) is None
    assert value(rec, "inference_objective_normalized_time_per_output_token_seconds_count", **labels) is None
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
    a, b = PrometheusRecorder(known_models=MODELS), PrometheusRecorder(known_models=MODELS)
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


# --- client-controlled label values are bounded ------------------------------------------------------------


def exposition(rec: PrometheusRecorder) -> str:
    return generate_latest(rec.registry).decode()


def one_request(rec: PrometheusRecorder, model: str, *, usage: bool = False, fairness_id: str = "") -> None:
    rec.request_scheduled(model, model, 0, fairness_id=fairness_id)
    rec.running_requests(model, 1, fairness_id=fairness_id)
    rec.scheduler_attempt(True, model, "pod-a", "ns", "8000")
    rec.model_rewrite("rule", model, model)
    rec.running_requests(model, -1, fairness_id=fairness_id)
    rec.request_error(model, model, "ModelServerError", fairness_id=fairness_id)
    tokens = 10 if usage else None
    rec.request_completed(model, model, 0.5, 100, 200, tokens, tokens, None, fairness_id=fairness_id)


def test_many_unknown_model_names_share_one_series() -> None:
    one = PrometheusRecorder(CollectorRegistry())
    one_request(one, "unknown-0")
    many = PrometheusRecorder(CollectorRegistry())
    for i in range(3000):
        one_request(many, f"unknown-{i}")
    small, big = exposition(one), exposition(many)
    assert "unknown-" not in big
    assert big.count("\n") == small.count("\n")  # the same series, only the values grew
    assert len(big) < len(small) + 2000
    labels = {"model_name": OTHER, "target_model_name": OTHER, "priority": "0"}
    assert many.registry.get_sample_value("inference_objective_request_total", labels) == 3000


def test_a_megabyte_model_name_never_appears() -> None:
    huge = "m" * (1 << 20)
    rec = PrometheusRecorder(CollectorRegistry(), known_models={huge})  # even when listed as known
    for _ in range(3):
        one_request(rec, huge, usage=True)  # and even when a server answered with usage
    rec.request_ttft(huge, huge, 0.1, streaming=True)
    rec.disagg_decision(QUEUE, huge, "prefill-decode")
    text = exposition(rec)
    assert "mmmmmmmmmmmmmmmm" not in text
    assert len(text) < 200_000
    assert (
        rec.registry.get_sample_value(
            "llm_d_epp_request_total",
            {"model_name": OTHER, "target_model_name": OTHER, "fairness_id": "", "priority": "0"},
        )
        == 3
    )


def test_known_models_are_labelled_as_given_and_can_change_at_run_time() -> None:
    clock = FakeClock()
    live: set[str] = {"llama"}
    rec = PrometheusRecorder(CollectorRegistry(), known_models=live, series_ttl=10, clock=clock)
    one_request(rec, "llama")
    one_request(rec, "qwen")
    total = "inference_objective_request_total"
    assert (
        rec.registry.get_sample_value(total, {"model_name": "llama", "target_model_name": "llama", "priority": "0"})
        == 1
    )
    assert rec.registry.get_sample_value(total, {"model_name": OTHER, "target_model_name": OTHER, "priority": "0"}) == 1
    live.add("qwen")  # e.g. a rewrite rule or a pod now names it
    one_request(rec, "qwen")
    assert (
        rec.registry.get_sample_value(total, {"model_name": "qwen", "target_model_name": "qwen", "priority": "0"}) == 1
    )
    live.discard("llama")
    clock.now += 11
    assert rec.sweep()  # forgets admitted names; llama is now `other`
    one_request(rec, "llama")
    assert rec.registry.get_sample_value(total, {"model_name": OTHER, "target_model_name": OTHER, "priority": "0"}) == 2


def test_served_models_are_learnt_from_usage_up_to_a_cap() -> None:
    rec = PrometheusRecorder(CollectorRegistry(), max_served_models=2)
    one_request(rec, "served-a", usage=False)  # no usage: the server did not serve it
    assert "served-a" not in exposition(rec)
    for name in ("served-a", "served-b", "served-c"):
        one_request(rec, name, usage=True)
    text = exposition(rec)
    assert 'model_name="served-a"' in text and 'model_name="served-b"' in text
    assert "served-c" not in text  # the cap is reached
    duration = "inference_objective_request_duration_seconds_count"
    assert rec.registry.get_sample_value(duration, {"model_name": "served-a", "target_model_name": "served-a"}) == 1


def test_fairness_ids_are_capped() -> None:
    rec = PrometheusRecorder(CollectorRegistry(), known_models=MODELS, max_fairness_ids=2, max_label_length=8)
    for fid in ("a", "b", "c", "far-too-long-id"):
        rec.request_scheduled("m", "t", 0, fairness_id=fid)
    seen = {
        s.labels["fairness_id"]: s.value
        for f in text_string_to_metric_families(exposition(rec))
        if f.name == "llm_d_epp_request"
        for s in f.samples
    }
    assert seen == {"a": 1, "b": 1, OTHER: 2}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_idle_series_expire_but_running_ones_stay() -> None:
    clock = FakeClock()
    rec = PrometheusRecorder(CollectorRegistry(), known_models=MODELS, series_ttl=60, clock=clock)
    rec.request_scheduled("m", "t", 0)
    rec.running_requests("t", 1)  # a long request still running
    rec.scheduler_attempt(True, "m", "pod-old", "ns", "8000")
    clock.now += 30
    assert not rec.sweep()  # not due yet
    clock.now += 31
    assert rec.sweep()  # first sweep: everything was touched in this period
    assert (
        rec.registry.get_sample_value(
            "inference_extension_scheduler_attempts_total",
            {"status": "success", "target_model_name": "m", "pod_name": "pod-old", "namespace": "ns", "port": "8000"},
        )
        == 1
    )
    rec.request_scheduled("m", "m", 0)  # touched again in the second period
    clock.now += 61
    assert rec.sweep()
    text = exposition(rec)
    assert "pod-old" not in text
    assert 'model_name="m",priority="0",target_model_name="t"' not in text
    assert 'model_name="m",priority="0",target_model_name="m"' in text
    assert rec.registry.get_sample_value("inference_objective_running_requests", {"model_name": "t"}) == 1


def test_sweeps_run_from_the_recording_path() -> None:
    clock = FakeClock()
    rec = PrometheusRecorder(CollectorRegistry(), known_models=MODELS, series_ttl=1, clock=clock)
    rec.scheduler_attempt(True, "m", "pod-old", "ns", "8000")
    for _ in range(2):
        clock.now += 2
        rec.set_pool_gauges("pool", 0.0, 0.0, 0.0, 1, {})  # the data layer's periodic call sweeps
    assert "pod-old" not in exposition(rec)
    rec.scheduler_attempt(True, "m", "pod-new", "ns", "8000")
    for _ in range(2):
        clock.now += 2
        for _ in range(256):
            rec.request_completed("m", "m", 0.1, 1, 1, None, None, None)
    assert "pod-new" not in exposition(rec)


# --- legacy and canonical names ------------------------------------------------------------------------------


def test_legacy_names_sum_the_canonical_series(rec: PrometheusRecorder) -> None:
    rec.request_scheduled("m", "t", 5, fairness_id="tenant-a")
    rec.request_scheduled("m", "t", 5, fairness_id="tenant-b")
    rec.request_completed("m", "t", 1.0, 10, 10, 5, 5, 0, fairness_id="tenant-a", priority=5)
    rec.request_completed("m", "t", 3.0, 10, 10, 5, 5, 0, fairness_id="tenant-b", priority=5)
    get = rec.registry.get_sample_value
    assert get("inference_objective_request_total", {"model_name": "m", "target_model_name": "t", "priority": "5"}) == 2
    for tenant in ("tenant-a", "tenant-b"):
        labels = {"model_name": "m", "target_model_name": "t", "fairness_id": tenant, "priority": "5"}
        assert get("llm_d_epp_request_total", labels) == 1
        assert get("llm_d_epp_request_duration_seconds_count", labels) == 1
    legacy = {"model_name": "m", "target_model_name": "t"}
    assert get("inference_objective_request_duration_seconds_count", legacy) == 2
    assert get("inference_objective_request_duration_seconds_sum", legacy) == 4.0
    assert get("inference_objective_request_duration_seconds_bucket", {**legacy, "le": "1"}) == 1


def test_canonical_renames(rec: PrometheusRecorder) -> None:
    rec.scheduler_attempt(True, "t", "pod-a", "ns", "8000")
    rec.set_pool_gauges("pool", 0.5, 1.0, 2.0, 3, {"pod-a": 4.0}, std_dev_queue=0.5)
    rec.prefix_match(0.5, 64, plugin=TypedName("approx-prefix-cache-producer", "my-prefix"))
    rec.prefix_index_size(7, plugin=TypedName("approx-prefix-cache-producer", "my-prefix"))
    get = rec.registry.get_sample_value
    endpoint = {"status": "success", "target_model_name": "t", "endpoint_name": "pod-a", "namespace": "ns"}
    assert get("llm_d_epp_scheduler_attempts_total", {**endpoint, "port": "8000"}) == 1
    assert get("llm_d_epp_ready_endpoints", {"name": "pool"}) == 3
    assert get("inference_pool_ready_pods", {"name": "pool"}) == 3
    assert get("llm_d_epp_per_endpoint_queue_size", {"name": "pool", "model_server_endpoint": "pod-a"}) == 4
    assert get("llm_d_epp_std_dev_queue_size", {"name": "pool"}) == 0.5
    assert "llm_d_epp_std_dev_kv_cache_utilization" not in exposition(rec)  # not given: no family
    prefix = {"plugin_name": "my-prefix", "plugin_type": "approx-prefix-cache-producer"}
    assert get("llm_d_epp_prefix_indexer_size", prefix) == 7
    assert get("inference_extension_prefix_indexer_size") == 7
    assert get("llm_d_epp_prefix_indexer_hit_ratio_count", prefix) == 1


def test_families_without_a_feed_appear_once_recorded(rec: PrometheusRecorder) -> None:
    lazy = (
        "llm_d_inference_scheduler_datalayer_poll_errors_total",
        "llm_d_epp_datalayer_poll_errors_total",
        "llm_d_inference_scheduler_datalayer_extract_errors_total",
        "llm_d_epp_datalayer_extract_errors_total",
        "llm_d_inference_scheduler_disagg_decision_total",
        "llm_d_epp_disagg_decision_total",
        "llm_d_inference_scheduler_pd_decision_total",
        "llm_d_epp_pd_decision_total",
        "llm_d_epp_request_ttft_seconds",
        "llm_d_epp_request_streaming_tpot_seconds",
        "llm_d_epp_request_streaming_itl_seconds",
        "llm_d_epp_request_processing_duration_seconds",
        "llm_d_epp_response_processing_duration_seconds",
    )
    record_everything(rec)
    before = exposition(rec)
    assert not [n for n in lazy if f"# TYPE {n} " in before]
    handler = TypedName("pd-profile-handler", "pd")
    rec.datalayer_poll_error("metrics-data-source")
    rec.datalayer_extract_error("metrics-data-source", "core-metrics-extractor")
    rec.disagg_decision(handler, "m", "prefill-decode")
    rec.disagg_decision(handler, "", "decode-only")
    rec.pd_decision(handler, "m", "decode-only")
    rec.request_ttft("m", "t", 0.2, streaming=True)
    rec.request_streaming_tpot("m", "t", 0.01)
    rec.request_inter_token_latency("m", "t", 0.02)
    rec.request_processing_duration(0.001)
    rec.response_processing_duration(0.001)
    get = rec.registry.get_sample_value
    assert get("llm_d_inference_scheduler_datalayer_poll_errors_total", {"source_type": "metrics-data-source"}) == 1
    decision = {"model_name": "m", "decision_type": "prefill-decode"}
    assert get("llm_d_inference_scheduler_disagg_decision_total", decision) == 1
    assert (
        get("llm_d_epp_disagg_decision_total", {**decision, "plugin_name": "pd", "plugin_type": "pd-profile-handler"})
        == 1
    )
    assert (
        get(
            "llm_d_inference_scheduler_disagg_decision_total", {"model_name": "unknown", "decision_type": "decode-only"}
        )
        == 1
    )
    ttft = {"model_name": "m", "target_model_name": "t", "fairness_id": "", "priority": "", "streaming": "true"}
    assert get("llm_d_epp_request_ttft_seconds_count", ttft) == 1
    after = exposition(rec)
    assert all(f"# TYPE {n} " in after for n in lazy)


def test_rollout_screener_families_appear_once_recorded_and_drop_gone_revisions(rec: PrometheusRecorder) -> None:
    assert "disaggregatedset" not in exposition(rec)
    screener = TypedName("disaggregatedset-rollout-screener", "rollout")
    rec.rollout_strict_no_match(screener, "revision")
    rec.rollout_strict_no_match(screener, "revision")
    rec.rollout_revision_shares(screener, "max-role", {"A": 0.9, "B": 0.1, "C": 0.0})
    get = rec.registry.get_sample_value
    base = {"plugin_type": "disaggregatedset-rollout-screener", "plugin_name": "rollout"}
    assert get("llm_d_epp_disaggregatedset_strict_header_no_match_total", {**base, "selector": "revision"}) == 2
    share = "llm_d_epp_disaggregatedset_revision_gating_share"
    assert get(share, {**base, "mode": "max-role", "revision": "A"}) == 0.9
    assert get(share, {**base, "mode": "max-role", "revision": "C"}) == 0.0
    rec.rollout_revision_shares(screener, "max-role", {"B": 1.0})
    assert get(share, {**base, "mode": "max-role", "revision": "A"}) is None
    assert get(share, {**base, "mode": "max-role", "revision": "B"}) == 1.0
