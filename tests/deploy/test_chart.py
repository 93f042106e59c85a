"""The Helm chart renders offline (helm-python-sdk), lints clean, rejects bad values by name, and every
rendered object validates against the Kubernetes schemas (or, for InferencePool, the v1 CRD schema)."""

from __future__ import annotations

import itertools
from typing import Any

import helm_python
import pytest
import yaml

from llm_epp.cli import build_parser
from tests.deploy.conftest import KUBE_VERSION, validate_object
from tests.deploy.render_assets import CHART, chart_objects, render_chart

LABELS = {"inferencePool": {"modelServers": {"matchLabels": {"app": "vllm-llama3-8b"}}}}


def values(**overrides: Any) -> dict[str, Any]:
    """LABELS deep-merged with overrides given as dotted paths: values(**{"provider.name": "gke"})."""
    out: dict[str, Any] = yaml.safe_load(yaml.safe_dump(LABELS))
    for dotted, value in overrides.items():
        node = out
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return out


def objects(vals: dict[str, Any], name: str = "demo", namespace: str = "llm") -> dict[tuple[str, str], Any]:
    return {(o["kind"], o["metadata"]["name"]): o for o in chart_objects(render_chart(vals, name, namespace))}


def epp_container(objs: dict[tuple[str, str], Any]) -> dict[str, Any]:
    container: dict[str, Any] = objs[("Deployment", "demo-epp")]["spec"]["template"]["spec"]["containers"][0]
    return container


MATRIX = list(itertools.product(["none", "istio", "gke"], [1, 3], [False, True]))


@pytest.mark.parametrize(("provider", "replicas", "monitoring"), MATRIX)
def test_matrix_renders_and_validates(provider: str, replicas: int, monitoring: bool) -> None:
    vals = values(
        **{
            "provider.name": provider,
            "inferenceExtension.replicas": replicas,
            "inferenceExtension.monitoring.prometheus.enabled": monitoring,
        }
    )
    objs = objects(vals)
    for obj in objs.values():
        validate_object(obj)
    kinds = {k for k, _ in objs}
    assert {"Deployment", "Service", "ConfigMap", "ServiceAccount", "Role", "RoleBinding", "InferencePool"} <= kinds
    ha = replicas > 1
    assert (("PodDisruptionBudget" in kinds) is ha) and (
        ("ServiceMonitor" in kinds) is (monitoring and provider != "gke")
    )
    assert ("DestinationRule" in kinds) is (provider == "istio")
    assert ({"HealthCheckPolicy", "GCPBackendPolicy"} <= kinds) is (provider == "gke")
    assert ("PodMonitoring" in kinds) is (monitoring and provider == "gke")

    deploy = objs[("Deployment", "demo-epp")]
    args = epp_container(objs)["args"]
    assert ("--ha-enable-leader-election" in args) is ha
    assert (deploy["spec"].get("strategy", {}).get("type") == "Recreate") is ha
    rules = objs[("Role", "demo-epp")]["rules"]
    assert any("leases" in r["resources"] for r in rules) is ha
    probe_services = {epp_container(objs)[p]["grpc"]["service"] for p in ("livenessProbe", "readinessProbe")}
    assert probe_services == ({"liveness", "readiness"} if ha else {"inference-extension"})


def test_defaults() -> None:
    objs = objects(LABELS)
    c = epp_container(objs)
    assert c["args"][0] == "serve"
    for flag in (
        "--pool-name=demo",
        "--pool-namespace=llm",
        "--config-file=/config/default-plugins.yaml",
        "--zap-encoder=json",
        "--v=1",
    ):
        assert flag in c["args"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"grpc": 9002, "grpc-health": 9003, "metrics": 9090}
    assert c["livenessProbe"]["grpc"]["port"] == c["readinessProbe"]["grpc"]["port"] == 9003
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
    assert env == {"NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"]["drop"] == ["ALL"]

    svc = objs[("Service", "demo-epp")]
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"grpc-ext-proc": 9002, "http-metrics": 9090}

    pool = objs[("InferencePool", "demo")]
    assert pool["spec"]["selector"]["matchLabels"] == {"app": "vllm-llama3-8b"}
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"] == {
        "name": "demo-epp",
        "port": {"number": 9002},
        "failureMode": "FailOpen",
    }

    rules = {
        (g, r): sorted(rule["verbs"])
        for rule in objs[("Role", "demo-epp")]["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    read = ["get", "list", "watch"]
    assert rules == {
        ("", "pods"): read,
        ("inference.networking.k8s.io", "inferencepools"): read,
        ("inference.networking.x-k8s.io", "inferenceobjectives"): read,
        ("inference.networking.x-k8s.io", "inferencemodelrewrites"): read,
    }


def test_epp_accepts_the_rendered_args() -> None:
    """Every flag the chart passes is one `llm-epp serve` accepts, leader election included."""
    parser = build_parser()
    for replicas in (1, 3):
        vals = values(
            **{"inferenceExtension.replicas": replicas, "inferenceExtension.flags": {"v": 4, "enable-explain": "true"}}
        )
        args = epp_container(objects(vals))["args"]
        ns = parser.parse_args(args)
        assert ns.pool_name == "demo" and ns.zap_encoder == "json" and ns.verbosity == 4
        assert ns.ha_enable_leader_election is (replicas > 1)


def test_default_plugins_config_loads_with_each_engine(tmp_path: Any) -> None:
    from llm_epp.config import load_config
    from llm_epp.framework import NullRecorder
    from llm_epp.plugins import builtin_registry

    for engine in ("vllm", "sglang", "trtllm-serve", "triton-tensorrt-llm"):
        cm = objects(values(**{"inferencePool.modelServerType": engine}))[("ConfigMap", "demo-epp")]
        text = cm["data"]["default-plugins.yaml"]
        assert f"defaultEngine: {engine}" in text
        path = tmp_path / f"{engine}.yaml"
        path.write_text(text)
        load_config(path, builtin_registry(), NullRecorder())


def test_custom_plugins_config_and_objectives() -> None:
    custom = (
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\n"
        "kind: EndpointPickerConfig\n"
        "plugins:\n- type: queue-scorer\n"
    )
    vals = values(
        **{
            "inferenceExtension.pluginsConfigFile": "mine.yaml",
            "inferenceExtension.pluginsCustomConfig": {"mine.yaml": custom},
            "inferenceExtension.failureMode": "FailClose",
            "inferencePool.name": "pool-a",
            "inferencePool.targetPorts": [{"number": 8000}, {"number": 8001}],
        }
    )
    vals["inferenceObjectives"] = [{"name": "critical", "priority": 10}, {"name": "batch", "priority": -1}]
    objs = objects(vals)
    assert yaml.safe_load(objs[("ConfigMap", "demo-epp")]["data"]["mine.yaml"]) == yaml.safe_load(custom)
    assert "--config-file=/config/mine.yaml" in epp_container(objs)["args"]
    assert "--pool-name=pool-a" in epp_container(objs)["args"]
    pool = objs[("InferencePool", "pool-a")]
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"
    assert len(pool["spec"]["targetPorts"]) == 2
    obj = objs[("InferenceObjective", "critical")]
    assert obj["apiVersion"] == "inference.networking.x-k8s.io/v1alpha2"
    assert obj["spec"] == {
        "priority": 10,
        "poolRef": {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "pool-a"},
    }
    assert objs[("InferenceObjective", "batch")]["spec"]["priority"] == -1


def test_provider_extras() -> None:
    istio = objects(
        values(
            **{
                "provider.name": "istio",
                "provider.istio.destinationRule.trafficPolicy": {
                    "connectionPool": {"http": {"http2MaxRequests": 1000}}
                },
            }
        )
    )
    dr = istio[("DestinationRule", "demo-epp")]
    assert dr["spec"]["host"] == "demo-epp.llm.svc.cluster.local"
    assert dr["spec"]["trafficPolicy"]["tls"] == {"mode": "SIMPLE", "insecureSkipVerify": True}
    assert dr["spec"]["trafficPolicy"]["connectionPool"] == {"http": {"http2MaxRequests": 1000}}

    gke = objects(values(**{"provider.name": "gke", "inferencePool.targetPorts": [{"number": 8080}]}))
    hc = gke[("HealthCheckPolicy", "demo")]["spec"]
    assert hc["targetRef"] == {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "demo"}
    assert hc["default"]["config"]["httpHealthCheck"] == {"requestPath": "/health", "port": 8080}
    assert gke[("GCPBackendPolicy", "demo")]["spec"]["default"]["timeoutSec"] == 300


def test_monitoring_labels_and_pool_create_off() -> None:
    objs = objects(
        values(
            **{
                "inferenceExtension.monitoring.prometheus": {"enabled": True, "extraLabels": {"release": "kps"}},
                "inferencePool.create": False,
            }
        )
    )
    sm = objs[("ServiceMonitor", "demo-epp")]
    assert sm["metadata"]["labels"]["release"] == "kps"
    assert sm["spec"]["endpoints"] == [{"port": "http-metrics", "path": "/metrics", "interval": "10s"}]
    assert not any(k == "InferencePool" for k, _ in objs)


def test_lint() -> None:
    for vals in (LABELS, values(**{"inferenceExtension.replicas": 3, "provider.name": "istio"})):
        report = helm_python.lint(CHART, vals, strict=True, kube_version=f"v{KUBE_VERSION}")
        assert report["errors"] == [], report
        assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


@pytest.mark.parametrize(
    ("vals", "names"),
    [
        ({}, ["inferencePool/modelServers/matchLabels"]),
        (values(**{"inferenceExtension.failureMode": "Open"}), ["inferenceExtension/failureMode"]),
        (values(**{"inferenceExtension.replicas": 0}), ["inferenceExtension/replicas"]),
        (values(**{"inferenceExtension.replicas": "2"}), ["inferenceExtension/replicas"]),
        (values(**{"provider.name": "aws"}), ["provider/name"]),
        (values(**{"inferencePool.modelServerType": "ollama"}), ["inferencePool/modelServerType"]),
        (values(**{"inferenceExtension.tracing.enabled": True}), ["inferenceExtension.tracing.enabled"]),
        (values(**{"inferenceExtension.pluginsConfigFile": "missing.yaml"}), ["inferenceExtension.pluginsConfigFile"]),
    ],
)
def test_bad_values_fail_naming_the_value(vals: dict[str, Any], names: list[str]) -> None:
    with pytest.raises(helm_python.HelmError) as err:
        render_chart(vals)
    for name in names:
        assert name in str(err.value)
