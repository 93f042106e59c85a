"""The committed deployment assets: plain manifests and examples validate, generated files are fresh,
Envoy configs pass `envoy --mode validate`, EndpointPickerConfig examples load, the Dockerfile has the
expected shape and the Grafana dashboard only queries metrics the EPP exports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from dockerfile_parse import DockerfileParser  # type: ignore[import-untyped]

from llm_epp.config import load_config
from llm_epp.framework import NullRecorder, TypedName
from llm_epp.observability.metrics import PrometheusRecorder
from llm_epp.plugins import builtin_registry
from tests.deploy.conftest import load_yaml_docs, validate_object
from tests.deploy.render_assets import DEPLOY, ROOT, expected_files

MANIFESTS = sorted(p for p in DEPLOY.rglob("*.yaml") if "configs" not in p.parts and p.name != "envoy.yaml")
ENVOY_CONFIGS = sorted(DEPLOY.rglob("envoy.yaml"))
PICKER_CONFIGS = sorted((DEPLOY / "examples" / "configs").glob("*.yaml"))
DASHBOARD = ROOT / "dashboards" / "llm-epp-grafana.json"


def rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def test_assets_present() -> None:
    names = {rel(p) for p in MANIFESTS}
    assert {
        "deploy/manifests/epp.yaml",
        "deploy/examples/istio/gateway.yaml",
        "deploy/examples/kgateway/gateway.yaml",
        "deploy/examples/standalone-envoy-sidecar/epp-with-envoy.yaml",
        "deploy/examples/standalone-envoy-sidecar/envoy-configmap.yaml",
    } <= names
    assert ENVOY_CONFIGS and {p.stem for p in PICKER_CONFIGS} == {"default", "lora-heavy", "long-context-agents"}


def test_generated_assets_are_fresh() -> None:
    for path, text in expected_files().items():
        assert path.read_text() == text, f"{rel(path)} is stale: run `python -m tests.deploy.render_assets`"


@pytest.mark.parametrize("path", MANIFESTS, ids=rel)
def test_manifest_validates(path: Path) -> None:
    docs = load_yaml_docs(path)
    assert docs
    checked = [validate_object(d) for d in docs]
    assert any(checked), f"{rel(path)}: nothing had a schema"


def test_gateway_examples_route_to_the_pool() -> None:
    for name in ("istio", "kgateway"):
        docs = load_yaml_docs(DEPLOY / "examples" / name / "gateway.yaml")
        kinds = {d["kind"] for d in docs}
        assert {"Gateway", "HTTPRoute", "InferencePool"} <= kinds
        pools = {d["metadata"]["name"] for d in docs if d["kind"] == "InferencePool"}
        route = next(d for d in docs if d["kind"] == "HTTPRoute")
        refs = [b for rule in route["spec"]["rules"] for b in rule["backendRefs"]]
        assert refs and all(b["group"] == "inference.networking.k8s.io" and b["kind"] == "InferencePool" for b in refs)
        assert {b["name"] for b in refs} <= pools


def test_sidecar_example_mounts_the_generated_envoy_config() -> None:
    docs = load_yaml_docs(DEPLOY / "examples" / "standalone-envoy-sidecar" / "epp-with-envoy.yaml")
    cm = load_yaml_docs(DEPLOY / "examples" / "standalone-envoy-sidecar" / "envoy-configmap.yaml")[0]
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert {c["name"] for c in pod["containers"]} == {"epp", "envoy"}
    assert any(v.get("configMap", {}).get("name") == cm["metadata"]["name"] for v in pod["volumes"])
    assert "envoy.yaml" in cm["data"]


@pytest.mark.parametrize("path", ENVOY_CONFIGS, ids=rel)
def test_envoy_config_validates(path: Path, tmp_path: Path) -> None:
    envoy = Path(sys.executable).parent / "envoy"
    proc = subprocess.run(
        [
            str(envoy),
            "--mode",
            "validate",
            "-c",
            str(path),
            "--base-id",
            "37",
            "--log-path",
            str(tmp_path / "envoy.log"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", PICKER_CONFIGS, ids=rel)
def test_endpoint_picker_config_loads(path: Path) -> None:
    loaded = load_config(path, builtin_registry(), NullRecorder())
    assert loaded is not None


def test_dockerfile() -> None:
    df = DockerfileParser(path=str(DEPLOY / "Dockerfile"))
    instrs = [(i["instruction"], i["value"]) for i in df.structure]
    froms = [v for k, v in instrs if k == "FROM"]
    assert len(froms) >= 2, "multi-stage build expected"
    assert all(re.match(r"python:3\.11(-slim)?\b", v) for v in froms), froms
    builder = froms[0].split()[-1]
    runs = " ".join(v for k, v in instrs if k == "RUN")
    assert "pip wheel" in runs and re.search(r"pip install /wheels/\S*\.whl", runs)
    assert any(k == "COPY" and v.startswith(f"--from={builder} ") for k, v in instrs)
    # Only the last stage ends up in the image: check what it runs as and exposes.
    last = max(i for i, (k, _) in enumerate(instrs) if k == "FROM")
    final = instrs[last:]
    user = [v for k, v in final if k == "USER"]
    assert user, "the runtime stage must set USER"
    uid = user[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "USER must be a numeric non-root UID (runAsNonRoot)"
    exposed = {p for k, v in final if k == "EXPOSE" for p in v.split()}
    assert exposed == {"9002", "9003", "9090"}
    entry = [v for k, v in final if k == "ENTRYPOINT"]
    assert entry and json.loads(entry[-1]) == ["llm-epp"]


PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "rate", "irate", "increase", "histogram_quantile", "clamp_min",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool",
    "label_values", "topk", "bottomk", "abs", "e", "label_replace",
}  # fmt: skip


def exported_series() -> set[str]:
    names: set[str] = set()
    rec = PrometheusRecorder()
    # the latency-predictor families appear once a prediction-carrying request recorded something
    owner = TypedName("predicted-latency-producer", "predicted-latency-producer")
    for kind in ("ttft", "predicted_ttft", "tpot", "predicted_tpot"):
        rec.latency_observed("m", "m", kind, 0.1, owner)  # type: ignore[arg-type]
    rec.latency_slo_checked("m", "m", "ttft", True, owner)
    for fam in rec.registry.collect():
        if fam.type == "counter":
            names.add(fam.name + "_total")
        elif fam.type == "histogram":
            names.update(fam.name + s for s in ("_bucket", "_sum", "_count"))
        else:
            names.add(fam.name)
    return names


def metric_names(expr: str) -> set[str]:
    # Names given as a matcher: {__name__=~"a|b"} or {__name__="a"}.
    named = {n for alt in re.findall(r'__name__=~?"([^"]*)"', expr) for n in alt.split("|")}
    expr = re.sub(r"label_values\(\s*([^,()]+),[^)]*\)", r"\1", expr)  # Grafana: label_values(metric, label)
    expr = re.sub(r'"[^"]*"', "", expr)  # label values
    expr = re.sub(r"\{[^}]*\}", "", expr)  # matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # grouping labels
    expr = re.sub(r"\$\w+", "", expr)  # dashboard variables
    idents = set(re.findall(r"(?<![\w.])[A-Za-z_:][\w:]*", expr))
    return named | {i for i in idents if i not in PROMQL_WORDS}


def all_exprs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        if node.get("type") == "query" and isinstance(node.get("definition"), str):
            found.append(node["definition"])
        return found + [e for v in node.values() for e in all_exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in all_exprs(v)]
    return []


def test_dashboard_queries_only_exported_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert any(v["type"] == "datasource" and v["query"] == "prometheus" for v in dash["templating"]["list"])
    exprs = all_exprs(dash)
    assert len(exprs) >= 15
    exported = exported_series()
    used: set[str] = set()
    for expr in exprs:
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        assert names <= exported, f"{expr!r} uses {sorted(names - exported)}, not exported by the EPP"
        used |= names
    for needed in (
        "inference_objective_request_total",
        "inference_objective_request_error_total",
        "inference_extension_scheduler_e2e_duration_seconds_bucket",
        "inference_extension_plugin_duration_seconds_bucket",
        "inference_pool_average_kv_cache_utilization",
        "inference_pool_average_queue_size",
        "inference_pool_ready_pods",
        "inference_extension_prefix_indexer_size",
        "inference_extension_prefix_indexer_hit_ratio_bucket",
        "inference_objective_running_requests",
    ):
        assert needed in used
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_metric_name_check_catches_unknown_names() -> None:
    assert metric_names('sum by (le) (rate(foo_bucket{a="b"}[5m]))') == {"foo_bucket"}
    assert metric_names("label_values(bar, name)") == {"bar"}
    assert metric_names('label_values({__name__=~"bar|baz"}, name)') == {"bar", "baz"}
    assert "foo_bucket" not in exported_series()


def test_plain_manifest_matches_chart_defaults() -> None:
    docs = load_yaml_docs(DEPLOY / "manifests" / "epp.yaml")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service", "Deployment", "InferencePool"]
    )
    assert (
        yaml.safe_load(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["default-plugins.yaml"])["kind"]
        == "EndpointPickerConfig"
    )


# GIE v1.5 name -> llm-d-router's canonical name, for the series the dashboard reads.
TWINS = {
    "inference_objective_request_total": "llm_d_epp_request_total",
    "inference_objective_request_error_total": "llm_d_epp_request_error_total",
    "inference_objective_running_requests": "llm_d_epp_request_running",
    "inference_objective_request_duration_seconds_bucket": "llm_d_epp_request_duration_seconds_bucket",
    "inference_objective_prompt_cached_tokens_sum": "llm_d_epp_request_cached_tokens_sum",
    "inference_objective_input_tokens_sum": "llm_d_epp_request_input_tokens_sum",
    "inference_objective_output_tokens_sum": "llm_d_epp_request_output_tokens_sum",
    "inference_objective_normalized_time_per_output_token_seconds_bucket": "llm_d_epp_request_ntpot_seconds_bucket",
    "inference_pool_ready_pods": "llm_d_epp_ready_endpoints",
    "inference_pool_average_kv_cache_utilization": "llm_d_epp_average_kv_cache_utilization",
    "inference_pool_average_queue_size": "llm_d_epp_average_queue_size",
    "inference_pool_average_running_requests": "llm_d_epp_average_running_requests",
    "inference_pool_per_pod_queue_size": "llm_d_epp_per_endpoint_queue_size",
    "inference_extension_scheduler_e2e_duration_seconds_bucket": "llm_d_epp_scheduler_e2e_duration_seconds_bucket",
    "inference_extension_scheduler_attempts_total": "llm_d_epp_scheduler_attempts_total",
    "inference_extension_plugin_duration_seconds_bucket": "llm_d_epp_plugin_duration_seconds_bucket",
    "inference_extension_prefix_indexer_size": "llm_d_epp_prefix_indexer_size",
    "inference_extension_prefix_indexer_hit_ratio_bucket": "llm_d_epp_prefix_indexer_hit_ratio_bucket",
    "inference_extension_prefix_indexer_hit_ratio_sum": "llm_d_epp_prefix_indexer_hit_ratio_sum",
    "inference_extension_prefix_indexer_hit_ratio_count": "llm_d_epp_prefix_indexer_hit_ratio_count",
}


def test_dashboard_works_on_both_names() -> None:
    """Each query that reads a GIE v1.5 name also reads its llm_d_epp_* twin (first, joined with `or`), so
    the dashboard shows data from an EPP that exports either set."""
    dash = json.loads(DASHBOARD.read_text())
    exported = exported_series()
    assert set(TWINS.values()) <= exported
    for expr in all_exprs(dash):
        names = metric_names(expr)
        for legacy in names & set(TWINS):
            assert TWINS[legacy] in names, f"{expr!r} reads {legacy} but not {TWINS[legacy]}"
            assert expr.index(TWINS[legacy]) < expr.index(legacy), expr
        for canonical in names & set(TWINS.values()):
            legacy = next(k for k, v in TWINS.items() if v == canonical)
            assert legacy in names, f"{expr!r} reads {canonical} but not {legacy}"
