"""The Helm chart renders offline (helm-python-sdk), lints clean, rejects bad values by name, and every
rendered object validates against the Kubernetes schemas (or, for InferencePool, the v1 CRD schema)."""

from __future__ import annotations

import itertools
from typing import Any

import helm_python
import pytest
import yaml

from tests.deploy.conftest import KUBE_VERSION, parse_epp_args, validate_object
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
    for replicas in (1, 3):
        vals = values(
            **{"inferenceExtension.replicas": replicas, "inferenceExtension.flags": {"v": 4, "enable-explain": "true"}}
        )
        args = epp_container(objects(vals))["args"]
        ns = parse_epp_args(args)
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
    assert sm["spec"]["endpoints"] == [
        {
            "port": "http-metrics",
            "path": "/metrics",
            "interval": "10s",
            "authorization": {"credentials": {"name": "inference-gateway-sa-metrics-reader-secret", "key": "token"}},
        }
    ]
    assert not any(k == "InferencePool" for k, _ in objs)


def test_lint() -> None:
    for vals in (LABELS, values(**{"inferenceExtension.replicas": 3, "provider.name": "istio"})):
        report = helm_python.lint(CHART, vals, strict=True, kube_version=f"v{KUBE_VERSION}")
        assert report["errors"] == [], report
        assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


@pytest.mark.parametrize(
    ("vals", "names"),
    [
        ({}, ["inferencePool.modelServers.matchLabels is required"]),
        (values(**{"inferenceExtension.failureMode": "Open"}), ["inferenceExtension/failureMode"]),
        (values(**{"inferenceExtension.replicas": 0}), ["inferenceExtension/replicas"]),
        (values(**{"inferenceExtension.replicas": "2"}), ["inferenceExtension/replicas"]),
        (values(**{"provider.name": "aws"}), ["provider/name"]),
        (values(**{"inferencePool.modelServerType": "ollama"}), ["inferencePool/modelServerType"]),
        (values(**{"inferenceExtension.pluginsConfigFile": "missing.yaml"}), ["inferenceExtension.pluginsConfigFile"]),
    ],
)
def test_bad_values_fail_naming_the_value(vals: dict[str, Any], names: list[str]) -> None:
    with pytest.raises(helm_python.HelmError) as err:
        render_chart(vals)
    for name in names:
        assert name in str(err.value)


def test_default_render_starts_todays_llm_epp() -> None:
    """The default args parse with the real parser and pass its checks, with no flag left out."""
    args = epp_container(objects(LABELS))["args"]
    ns = parse_epp_args(args)  # strict: no flag of FLAGS_IN_FLIGHT tolerated here
    assert ns.command == "serve" and ns.pool_group == "inference.networking.k8s.io" and ns.verbosity == 1
    assert ns.config_file == "/config/default-plugins.yaml" and ns.metrics_port == 9090
    assert ns.tracing is False  # the reference chart passes --tracing=false unless tracing.enabled


@pytest.mark.parametrize(
    ("vals", "key"),
    [
        (values(**{"inferenceExtension.replicaz": 2}), "replicaz"),
        (values(**{"inferenceExtension.image.registy": "r"}), "registy"),
        (values(**{"inferenceExtension.monitoring.prometheus.auth.enable": False}), "enable"),
        (values(**{"inferenceExtension.tracing.sampling.samplerArgs": "0.2"}), "samplerArgs"),
        (values(**{"inferenceExtension.sidecar.imagePullPolcy": "Always"}), "imagePullPolcy"),
        (values(**{"inferenceExtension.endpointsServer.endpointSelecter": "a=b"}), "endpointSelecter"),
        (values(**{"inferenceExtension.metricsDataSource.schema": "https"}), "schema"),
        (values(**{"inferencePool.modelServerProtocl": "grpc"}), "modelServerProtocl"),
        (values(**{"experimentalHttpRoute.baseModle": "m"}), "baseModle"),
        (values(**{"provider.istio.destinationRule.hosts": "h"}), "hosts"),
        (values(inferenceExtention={"replicas": 2}), "inferenceExtention"),
    ],
)
def test_misspelt_keys_fail_naming_the_key(vals: dict[str, Any], key: str) -> None:
    with pytest.raises(helm_python.HelmError) as err:
        render_chart(vals)
    assert f"'{key}'" in str(err.value)


def test_ports_env_volumes_and_metrics_source() -> None:
    objs = objects(
        values(
            **{
                "inferenceExtension.metricsPort": 9190,
                "inferenceExtension.env": {"FEATURE_X": "true", "LEVEL": 3},
                "inferenceExtension.extraContainerPorts": [{"name": "zmq", "containerPort": 5557, "protocol": "TCP"}],
                "inferenceExtension.extraServicePorts": [{"name": "zmq", "port": 5557, "targetPort": 5557}],
                "inferenceExtension.volumes": [{"name": "cache", "emptyDir": {}}],
                "inferenceExtension.volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
                "inferenceExtension.metricsDataSource": {"scheme": "https", "path": "/prometheus/metrics"},
                "inferencePool.modelServerType": "trtllm-serve",
            }
        )
    )
    for obj in objs.values():
        validate_object(obj)
    c = epp_container(objs)
    assert "--metrics-port=9190" in c["args"] and parse_epp_args(c["args"]).metrics_port == 9190
    assert {"name": "metrics", "containerPort": 9190, "protocol": "TCP"} in c["ports"]
    assert {"name": "FEATURE_X", "value": "true"} in c["env"] and {"name": "LEVEL", "value": "3"} in c["env"]
    assert {"name": "cache", "mountPath": "/cache"} in c["volumeMounts"]
    svc = {p["name"]: p for p in objs[("Service", "demo-epp")]["spec"]["ports"]}
    assert svc["http-metrics"]["port"] == 9190 and svc["zmq"]["port"] == 5557
    cfg = yaml.safe_load(objs[("ConfigMap", "demo-epp")]["data"]["default-plugins.yaml"])
    source = next(p for p in cfg["plugins"] if p["type"] == "metrics-data-source")
    assert source["parameters"] == {"scheme": "https", "path": "/prometheus/metrics", "insecureSkipVerify": True}
    assert next(p for p in cfg["plugins"] if p["type"] == "core-metrics-extractor")["parameters"] == {
        "defaultEngine": "trtllm-serve"
    }


def test_metrics_auth_off_passes_the_flag_and_drops_the_token() -> None:
    objs = objects(
        values(
            **{
                "inferenceExtension.monitoring.prometheus": {"enabled": True, "auth": {"enabled": False}},
            }
        )
    )
    c = epp_container(objs)
    assert "--metrics-endpoint-auth=false" in c["args"]
    parse_epp_args(c["args"], allow_in_flight=True)
    assert "authorization" not in objs[("ServiceMonitor", "demo-epp")]["spec"]["endpoints"][0]
    assert not any(k == "Secret" for k, _ in objs)
    # The EPP may still review tokens (the reference keeps the ClusterRole whenever monitoring is on).
    assert ("ClusterRole", "demo-llm-epp") in objs


def test_metrics_auth_on_creates_token_and_review_rights() -> None:
    objs = objects(values(**{"inferenceExtension.monitoring.prometheus.enabled": True}))
    assert not any(a.startswith("--metrics-endpoint-auth") for a in epp_container(objs)["args"])
    secret = objs[("Secret", "inference-gateway-sa-metrics-reader-secret")]
    assert secret["metadata"]["annotations"]["kubernetes.io/service-account.name"] == "demo-epp"
    rules = objs[("ClusterRole", "demo-llm-epp")]["rules"]
    assert {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]} in rules
    assert {"nonResourceURLs": ["/metrics"], "verbs": ["get"]} in rules
    binding = objs[("ClusterRoleBinding", "demo-llm-epp")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "demo-epp", "namespace": "llm"}]


def test_gke_monitoring_with_auth_as_the_reference() -> None:
    for autopilot, gmp in ((False, "gmp-system"), (True, "gke-gmp-system")):
        objs = objects(
            values(
                **{
                    "provider.name": "gke",
                    "provider.gke.autopilot": autopilot,
                    "inferenceExtension.monitoring.prometheus.enabled": True,
                }
            )
        )
        for obj in objs.values():
            validate_object(obj)
        pm = objs[("PodMonitoring", "demo-epp")]["spec"]["endpoints"][0]
        assert pm["authorization"]["credentials"]["secret"] == {"name": "demo-metrics-reader-secret", "key": "token"}
        assert objs[("Secret", "demo-metrics-reader-secret")]["metadata"]["annotations"] == {
            "kubernetes.io/service-account.name": "demo-metrics-reader-sa"
        }
        rb = objs[("RoleBinding", f"{gmp}:collector:llm-demo-metrics-reader-secret-read")]
        assert rb["subjects"] == [{"name": "collector", "namespace": gmp, "kind": "ServiceAccount"}]
        assert ("ServiceMonitor", "demo-epp") not in objs


def test_grpc_model_servers_on_gke() -> None:
    objs = objects(values(**{"provider.name": "gke", "inferencePool.modelServerType": "sglang",
                             "inferencePool.modelServerProtocol": "grpc"}))  # fmt: skip
    assert objs[("InferencePool", "demo")]["spec"]["appProtocol"] == "kubernetes.io/h2c"
    assert "config" not in objs[("HealthCheckPolicy", "demo")]["spec"]["default"]  # only vLLM has a gRPC check
    cfg = yaml.safe_load(objs[("ConfigMap", "demo-epp")]["data"]["default-plugins.yaml"])
    assert "parser" not in cfg


def test_parsers_the_chart_renders_are_the_ones_llm_epp_loads(tmp_path: Any) -> None:
    """For each parser the reference chart can select, the chart renders it exactly when llm-epp's loader
    accepts it, and the rendered config then loads."""
    from llm_epp.config import ConfigError, load_config
    from llm_epp.framework import NullRecorder
    from llm_epp.plugins import builtin_registry

    for parser in ("openai-parser", "passthrough-parser", "vllmgrpc-parser"):
        probe = tmp_path / f"{parser}.yaml"
        probe.write_text(
            "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
            f"plugins:\n- type: queue-scorer\nparser:\n  pluginRef: {parser}\n"
        )
        try:
            load_config(probe, builtin_registry(), NullRecorder())
            loads = True
        except ConfigError:
            loads = False
        vals = values(**{"inferencePool.parser": parser})
        if not loads:
            with pytest.raises(helm_python.HelmError, match="not supported yet"):
                render_chart(vals)
            continue
        text = objects(vals)[("ConfigMap", "demo-epp")]["data"]["default-plugins.yaml"]
        assert yaml.safe_load(text)["parser"] == {"pluginRef": parser}
        probe.write_text(text)
        load_config(probe, builtin_registry(), NullRecorder())


def test_http_route() -> None:
    objs = objects(
        values(
            **{
                "experimentalHttpRoute": {"enabled": True, "baseModel": "Qwen/Qwen3-32B", "requestTimeout": "600s"},
                "inferencePool.name": "pool-a",
            }
        )
    )
    route = objs[("HTTPRoute", "demo")]["spec"]
    gateway = {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway"}
    assert route["parentRefs"] == [gateway]
    rule = route["rules"][0]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "pool-a"}]
    assert rule["matches"][0]["headers"] == [
        {"type": "Exact", "name": "X-Gateway-Base-Model-Name", "value": "Qwen/Qwen3-32B"}
    ]
    assert rule["timeouts"] == {"request": "600s"}
    gke = objects(values(**{"experimentalHttpRoute.enabled": True, "provider.name": "gke"}))
    gke_rule = gke[("HTTPRoute", "demo")]["spec"]["rules"][0]
    assert "timeouts" not in gke_rule and "headers" not in gke_rule["matches"][0]


@pytest.mark.parametrize(
    ("flags", "grace"),
    [({}, 130), ({"drain-timeout": "30s"}, 130), ({"drain-timeout": "90s"}, 190), ({"drain-timeout": "3m"}, 370)],
)
def test_termination_grace_covers_the_drain(flags: dict[str, str], grace: int) -> None:
    objs = objects(values(**{"inferenceExtension.flags": {"v": 1, **flags}}))
    assert objs[("Deployment", "demo-epp")]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == grace
    parse_epp_args(epp_container(objs)["args"], allow_in_flight=True)


def test_legacy_target_port_number() -> None:
    objs = objects(values(**{"inferencePool.targetPorts": None, "inferencePool.targetPortNumber": 8080}))
    assert objs[("InferencePool", "demo")]["spec"]["targetPorts"] == [{"number": 8080}]


@pytest.mark.parametrize(
    ("vals", "message"),
    [
        (values(**{"inferenceExtension.monitoring.gke.enabled": True}), "inferenceExtension.monitoring.gke.enabled"),
        (values(**{"inferenceExtension.sidecar.enabled": True}), "inferenceExtension.sidecar: name and image"),
        (values(**{"inferenceExtension.apiVersion": "inference.networking.x-k8s.io"}), "inferenceExtension.apiVersion"),
        (values(**{"inferenceExtension.flags": [{"value": "1"}]}), "missing property 'name'"),
        (values(**{"inferencePool.targetPorts": []}), "inferencePool.targetPorts: at least one"),
        (
            {"inferenceExtension": {"endpointsServer": {"createInferencePool": False}}},
            "inferenceExtension.endpointsServer.endpointSelector is required",
        ),
    ],
)
def test_render_checks_name_the_value(vals: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmError) as err:
        render_chart(vals)
    assert message in str(err.value)
