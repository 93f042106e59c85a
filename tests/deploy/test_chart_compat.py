"""Values written for the reference chart (GIE v1.5.0 `config/charts/inferencepool`) and for the llm-d guides
render with charts/llm-epp, or fail with a message that names the value and says it is not supported
(yet). The values files under tests/deploy/values/ are modelled on the upstream files named in their first
comment; the `--set` sets below are the ones the reference chart's README and site guides document."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from llm_epp.config import ConfigError, load_config
from llm_epp.framework import NullRecorder
from llm_epp.latency.predictor import settings_from_env
from llm_epp.plugins import builtin_registry
from tests.deploy.conftest import KUBE_VERSION, parse_epp_args, validate_object
from tests.deploy.render_assets import CHART, chart_objects, render_chart

VALUES = Path(__file__).parent / "values"
APP = {"inferencePool": {"modelServers": {"matchLabels": {"app": "vllm-qwen3-32b"}}}}


def with_sets(*sets: str) -> dict[str, Any]:
    """Values as `helm --set a.b=c` builds them (values are YAML scalars, as Helm parses them)."""
    out: dict[str, Any] = {}
    for item in sets:
        dotted, raw = item.split("=", 1)
        node = out
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = yaml.safe_load(raw) if raw else ""
    return out


def render(vals: dict[str, Any]) -> dict[tuple[str, str], Any]:
    return {(o["kind"], o["metadata"]["name"]): o for o in chart_objects(render_chart(vals, "demo", "llm"))}


def check_rendered(objs: dict[tuple[str, str], Any], *, in_flight: bool = False) -> dict[str, Any]:
    """Every object validates; the EPP container's args start llm-epp; the selected EndpointPickerConfig
    loads, or is refused only for naming a plugin type or feature llm-epp does not have."""
    for obj in objs.values():
        validate_object(obj)
    deploy = objs[("Deployment", "demo-epp")]
    epp: dict[str, Any] = next(c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == "epp")
    parse_epp_args(epp["args"], allow_in_flight=in_flight)
    config_file = next(a.split("=", 1)[1] for a in epp["args"] if a.startswith("--config-file="))
    text = objs[("ConfigMap", "demo-epp")]["data"][Path(config_file).name]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(text)
        try:
            load_config(path, builtin_registry(), NullRecorder())
        except ConfigError as e:
            assert "unknown plugin type" in str(e) or "not supported" in str(e), str(e)
    return epp


# --- the reference chart's own values and documented --set combinations ---------------------------------


def test_reference_values_file_renders_and_starts() -> None:
    vals = yaml.safe_load((VALUES / "gie-inferencepool-defaults.yaml").read_text())
    objs = render(vals)
    epp = check_rendered(objs)
    assert epp["image"] == "registry.example.com/llm-epp:v0.1.0"
    pool = objs[("InferencePool", "demo")]
    assert pool["spec"]["appProtocol"] == "http"
    assert not any(k == "HTTPRoute" for k, _ in objs)


DOCUMENTED_SETS = [
    # config/charts/inferencepool/README.md@v1.5.0
    (),
    ("provider.name=none",),
    ("provider.name=gke",),
    ("provider.name=istio",),
    ("inferenceExtension.flags.v=3",),
    ("inferencePool.modelServerType=triton-tensorrt-llm", "provider.name=gke"),
    ("inferencePool.modelServerType=trtllm-serve", "provider.name=istio"),
    ("inferencePool.modelServerType=sglang",),
    ("inferenceExtension.replicas=3", "provider.name=gke"),
    ("inferenceExtension.monitoring.prometheus.enabled=true",),
    ("inferenceExtension.monitoring.prometheus.enabled=true", "provider.name=gke", "provider.gke.autopilot=true"),
    # site-src/guides/serving-multiple-inference-pools-latest.md@v1.5.0
    ("experimentalHttpRoute.enabled=true", "experimentalHttpRoute.baseModel=Qwen/Qwen3-32B"),
    ("experimentalHttpRoute.enabled=true", "experimentalHttpRoute.baseModel=deepseek/DeepSeek-r1", "provider.name=gke"),
    # site-src/guides/ga-migration.md@v1.5.0
    ("provider.name=istio", "inferenceExtension.failureMode=FailClose"),
]


@pytest.mark.parametrize("sets", DOCUMENTED_SETS, ids=lambda s: " ".join(s) or "defaults")
def test_documented_sets_render_and_start(sets: tuple[str, ...]) -> None:
    vals = with_sets("inferencePool.modelServers.matchLabels.app=vllm-qwen3-32b", *sets)
    objs = render(vals)
    check_rendered(objs)


def test_standalone_mode_from_the_standalone_guide() -> None:
    """site-src/guides/standalone.md@v1.5.0: endpointSelector plus createInferencePool=false."""
    vals = with_sets(
        "inferenceExtension.endpointsServer.endpointSelector=app=vllm-qwen3-32b",
        "inferenceExtension.endpointsServer.createInferencePool=false",
        "inferenceExtension.endpointsServer.targetPorts=8000",
    )
    objs = render(vals)
    epp = check_rendered(objs)
    assert "--endpoint-selector=app=vllm-qwen3-32b" in epp["args"]
    assert "--endpoint-target-ports=8000" in epp["args"]
    assert not any(a.startswith("--pool-name") for a in epp["args"])
    assert not any(k == "InferencePool" for k, _ in objs)
    ns = parse_epp_args(epp["args"])
    assert ns.endpoint_selector == "app=vllm-qwen3-32b" and ns.pool_name == ""


def test_passthrough_parser_guide_renders_a_config_that_loads(tmp_path: Any) -> None:
    """site-src/guides/getting-started-latest.md@v1.5.0: passthrough for non-OpenAI servers."""
    objs = render(
        with_sets("inferencePool.modelServers.matchLabels.app=vllm", "inferencePool.parser=passthrough-parser")
    )
    [text] = [
        o["data"]["default-plugins.yaml"]
        for (kind, _), o in objs.items()
        if kind == "ConfigMap" and "data" in o and "default-plugins.yaml" in o["data"]
    ]
    (tmp_path / "c.yaml").write_text(text)
    loaded = load_config(tmp_path / "c.yaml", builtin_registry(), NullRecorder())
    assert [p.typed_name.type for p in loaded.parsers] == ["passthrough-parser"]


def test_grpc_model_servers_render_the_vllm_grpc_parser_and_an_h2c_pool(tmp_path: Any) -> None:
    """config/charts/inferencepool/values.yaml@v1.5.0: modelServerProtocol grpc (vLLM)."""
    objs = render(
        with_sets("inferencePool.modelServers.matchLabels.app=vllm", "inferencePool.modelServerProtocol=grpc")
    )
    [text] = [
        o["data"]["default-plugins.yaml"]
        for (kind, _), o in objs.items()
        if kind == "ConfigMap" and "data" in o and "default-plugins.yaml" in o["data"]
    ]
    (tmp_path / "c.yaml").write_text(text)
    loaded = load_config(tmp_path / "c.yaml", builtin_registry(), NullRecorder())
    assert [p.typed_name.type for p in loaded.parsers] == ["vllmgrpc-parser"]
    [pool] = [o for (kind, _), o in objs.items() if kind == "InferencePool"]
    assert "kubernetes.io/h2c" in str(pool)


def test_tracing_renders_the_reference_flag_and_environment() -> None:
    """site-src/guides/trace.md@v1.5.0: tracing.enabled=true."""
    vals = with_sets(
        "inferencePool.modelServers.matchLabels.app=vllm-qwen3-32b",
        "inferenceExtension.tracing.enabled=true",
        "inferenceExtension.tracing.otelExporterEndpoint=http://otel-collector.observability:4317",
        "inferenceExtension.tracing.sampling.samplerArg=0.5",
    )
    epp = check_rendered(render(vals), in_flight=True)
    assert "--tracing=true" in epp["args"]
    assert "--tracing=false" not in epp["args"]
    env = {e["name"]: e.get("value") for e in epp["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4317"
    assert env["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio"
    assert env["OTEL_TRACES_SAMPLER_ARG"] == "0.5"
    assert env["OTEL_TRACES_EXPORTER"] == "otlp"
    assert "k8s.pod.name=$(OTEL_RESOURCE_ATTRIBUTES_POD_NAME)" in env["OTEL_RESOURCE_ATTRIBUTES"]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        # config/charts/inferencepool/values.yaml@v1.5.0: inferencePool.apiVersion takes the experimental group too
        (
            ("inferencePool.apiVersion=inference.networking.x-k8s.io/v1alpha2",),
            "llm-epp serves InferencePools of inference.networking.k8s.io/v1",
        ),
    ],
)
def test_documented_features_llm_epp_lacks_fail_clearly(sets: tuple[str, ...], message: str) -> None:
    with pytest.raises(helm_python.HelmError) as err:
        render(with_sets("inferencePool.modelServers.matchLabels.app=vllm-qwen3-32b", *sets))
    assert message in str(err.value)


def _epp_config(objs: dict[tuple[str, str], Any], epp: dict[str, Any]) -> str:
    config_file = next(a.split("=", 1)[1] for a in epp["args"] if a.startswith("--config-file="))
    text: str = objs[("ConfigMap", "demo-epp")]["data"][Path(config_file).name]
    return text


def test_latency_predictor_renders_the_slo_profile_in_process() -> None:
    """site-src/guides/latency-based-predictor.md@v1.5.0: `--set latencyPredictor.enabled=true` gives the
    reference's plugins, the predictor settings as EPP environment, and no server containers."""
    lp = "inferenceExtension.latencyPredictor"
    objs = render(
        with_sets(
            "inferencePool.modelServers.matchLabels.app=vllm-qwen3-32b",
            "provider.name=gke",
            f"{lp}.enabled=true",
            f"{lp}.trainingServer.config.LATENCY_RETRAINING_INTERVAL_SEC=3",
            f"{lp}.trainingServer.config.LATENCY_OBJECTIVE_TYPE=quantile",
        )
    )
    epp = check_rendered(objs)
    pod = objs[("Deployment", "demo-epp")]["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["epp"]
    assert not any("latency-predictor" in name for _, name in objs)
    env = {e["name"]: e.get("value") for e in epp["env"]}
    assert env["LATENCY_RETRAINING_INTERVAL_SEC"] == "3" and env["LATENCY_MAX_SAMPLE_SIZE"] == "10000"
    assert "PREDICTION_SERVER_URL" not in env and "TRAINING_SERVER_URL" not in env
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(_epp_config(objs, epp))
        loaded = load_config(path, builtin_registry(), NullRecorder())
    profile = loaded.scheduler.profiles["default"]
    assert [f.typed_name.name for f in profile.filters] == [
        "strict-affinity-filter", "slo-headroom-tier-filter", "loose-affinity-filter",
    ]  # fmt: skip
    assert [s.scorer.typed_name.type for s in profile.scorers] == ["latency-scorer"]
    assert profile.picker.typed_name.type == "weighted-random-picker"
    assert [a.typed_name.type for a in loaded.admission] == ["latency-slo-admitter"]
    # the rendered environment configures the in-process predictor
    settings, notes = settings_from_env({k: v for k, v in env.items() if v is not None})
    assert settings.min_interval_s == 3 and settings.quantile == 0.9 and settings.window == 500
    assert settings.queue_size == 10000
    assert any(n.startswith("LATENCY_MIN_SAMPLES_FOR_RETRAIN has no effect") for n in notes)
    assert any(n.startswith("LATENCY_MODEL_TYPE=xgboost") for n in notes)
    off = render(with_sets("inferencePool.modelServers.matchLabels.app=vllm-qwen3-32b"))
    off_epp = next(c for c in off[("Deployment", "demo-epp")]["spec"]["template"]["spec"]["containers"])
    assert not any(e["name"].startswith("LATENCY_") for e in off_epp["env"])
    assert "latency-scorer" not in _epp_config(off, off_epp)


# --- llm-d guide values files -----------------------------------------------------------------------------

# fixture -> None (renders, the EPP starts) or the text(s) the render failure must contain.
GUIDES: dict[str, str | tuple[str, ...] | None] = {
    "llmd-scheduler-base.yaml": None,  # guides/recipes/scheduler/base.values.yaml
    "llmd-optimized-baseline.yaml": None,  # guides/optimized-baseline/scheduler/optimized-baseline.values.yaml
    # guides/precise-prefix-cache-aware/scheduler/precise-prefix-cache-aware.values.yaml (renders; its config
    # names plugin types llm-epp does not have, which the EPP reports at start)
    "llmd-precise-prefix-cache.yaml": None,
    "llmd-active-active.yaml": None,  # guides/precise-prefix-cache-aware/scheduler/features/active-active.values.yaml
    # guides/inference-scheduling/standalone-inference-scheduling/values.yaml
    "llmd-standalone-envoy-sidecar.yaml": None,
    "llmd-pd-disaggregation.yaml": None,  # guides/pd-disaggregation/scheduler/pd-disaggregation.values.yaml
    # guides/predicted-latency-based-scheduling/scheduler/predicted-latency.values.yaml
    "llmd-predicted-latency.yaml": None,
    # guides/wide-ep-lws/manifests/inferencepool.values.yaml, and the same legacy metric flag in
    # guides/inference-scheduling/gaie-inference-scheduling/values.yaml and guides/pd-disaggregation/gaie-pd/values.yaml
    "llmd-wide-ep-inferencepool.yaml": None,
    # guides/inference-scheduling/scheduler/inference-scheduling.values.yaml: keys in the wrong section
    "llmd-inference-scheduling-misplaced.yaml": (
        "at '/inferencePool': additional properties",
        "'pluginsConfigFile'",
        "'pluginsCustomConfig'",
    ),
    # guides/recipes/inferencepool/inferencepool-pd.values.yaml
    "llmd-inferencepool-pd.yaml": 'inferencePool.apiVersion: "inference.networking.x-k8s.io/v1alpha2" is not '
    "supported yet",
    # guides/inference-scheduling/gaie-inference-scheduling/values-slo.yaml
    "llmd-slo-sidecars.yaml": "inferenceExtension.sidecars.predictionServers.enabled: the latency-predictor "
    "sidecars are not supported yet",
    # guides/inference-scheduling/gaie-inference-scheduling/values_sglang.yaml
    "llmd-sglang-scheduling.yaml": None,
    # guides/tiered-prefix-cache/cpu/manifests/inferencepool/values.yaml: its misspelt
    # monitoring.prometheus.enable is named (the reference chart ignores it)
    "llmd-tiered-prefix-cache.yaml": ("at '/inferenceExtension/monitoring/prometheus'", "'enable'"),
    # guides/recipes/router/base.values.yaml (and every guides/**/router/*.values.yaml built on it)
    "llmd-router-base.yaml": "router: the llm-d-router chart layout (router.epp, router.modelServers, ...) is not "
    "supported yet",
    # config/charts/epplib/values.yaml@v1.5.0 latencyPredictor block, enabled
    "gie-latency-predictor-subchart.yaml": None,
}


def test_every_fixture_is_listed() -> None:
    listed = set(GUIDES) | {"gie-inferencepool-defaults.yaml"}
    assert {p.name for p in VALUES.glob("*.yaml")} == listed


@pytest.mark.parametrize(("name", "failure"), list(GUIDES.items()), ids=list(GUIDES))
def test_guide_values_render_or_fail_clearly(name: str, failure: str | tuple[str, ...] | None) -> None:
    vals = yaml.safe_load((VALUES / name).read_text())
    if failure is not None:
        with pytest.raises(helm_python.HelmError) as err:
            render(vals)
        for text in (failure,) if isinstance(failure, str) else failure:
            assert text in str(err.value)
        return
    check_rendered(render(vals))
    report = helm_python.lint(CHART, vals, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == [], report


def test_guide_layouts_have_their_upstream_effect() -> None:
    precise = render(yaml.safe_load((VALUES / "llmd-precise-prefix-cache.yaml").read_text()))
    pod = precise[("Deployment", "demo-epp")]["spec"]["template"]["spec"]
    epp, tokenizer = pod["containers"]
    assert epp["image"] == "ghcr.io/example/llm-epp:v0.1.0" and tokenizer["name"] == "tokenizer"
    assert {"name": "zmq", "containerPort": 5557, "protocol": "TCP"} in epp["ports"]
    assert {"mountPath": "/tmp/tokenizer", "name": "tokenizer-socket"} in epp["volumeMounts"]
    assert {"tokenizers", "tokenizer-socket"} <= {v["name"] for v in pod["volumes"]}
    assert any(e["name"] == "HF_TOKEN" and "secretKeyRef" in e["valueFrom"] for e in epp["env"])
    assert precise[("ConfigMap", "tokenizer-config")]["data"] == {"placeholder": ""}
    svc_ports = {p["name"]: p["port"] for p in precise[("Service", "demo-epp")]["spec"]["ports"]}
    assert svc_ports["zmq"] == 5557

    active = render(yaml.safe_load((VALUES / "llmd-active-active.yaml").read_text()))
    args = active[("Deployment", "demo-epp")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args.index("--ha-enable-leader-election") < args.index("--ha-enable-leader-election=false")
    assert parse_epp_args(args).ha_enable_leader_election is False

    envoy = render(yaml.safe_load((VALUES / "llmd-standalone-envoy-sidecar.yaml").read_text()))
    sm = envoy[("ServiceMonitor", "demo-epp")]
    # The older monitoring.secret.name names the token secret the ServiceMonitor sends.
    assert sm["spec"]["endpoints"][0]["authorization"]["credentials"] == {
        "name": "scheduling-metrics-reader-secret",
        "key": "token",
    }
    assert envoy[("Secret", "scheduling-metrics-reader-secret")]["type"] == "kubernetes.io/service-account-token"
    side = envoy[("Deployment", "demo-epp")]["spec"]["template"]["spec"]["containers"][1]
    assert side["command"] == ["envoy"] and side["args"][-1] == "/etc/envoy/envoy.yaml"

    flags_list = render({**APP, "inferenceExtension": {"flags": [{"name": "v", "value": "4"}]}})
    args = flags_list[("Deployment", "demo-epp")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert parse_epp_args(args).verbosity == 4


def test_legacy_metric_flags_set_engine_configs() -> None:
    """The older EPPs' engine-metric flags (still in llm-d guide values) become core-metrics-extractor
    engineConfigs of the generated config, the built-in engine's other specs kept; they are not passed."""
    from llm_epp.plugins.datalayer.core_metrics_extractor import BUILTIN_ENGINES

    flags = {
        "v": 1,
        "kv-cache-usage-percentage-metric": "vllm:kv_cache_usage_perc",
        "lora-info-metric": "",
        "total-queued-requests-metric": "my_queue{kind=waiting}",
    }
    for builtin in BUILTIN_ENGINES:
        vals = {**APP, "inferenceExtension": {"flags": flags}}
        vals["inferencePool"] = {**APP["inferencePool"], "modelServerType": builtin.name}
        objs = render(vals)
        epp = check_rendered(objs)
        assert not any("metric=" in a for a in epp["args"])
        cfg = yaml.safe_load(objs[("ConfigMap", "demo-epp")]["data"]["default-plugins.yaml"])
        params = next(p for p in cfg["plugins"] if p["type"] == "core-metrics-extractor")["parameters"]
        (engine,) = params["engineConfigs"]
        expected = {k: v for k, v in builtin.model_dump(by_alias=True).items() if v}
        expected.update(
            kvUsageSpec="vllm:kv_cache_usage_perc", loraSpec="", queuedRequestsSpec="my_queue{kind=waiting}"
        )
        assert engine == expected


def test_legacy_metric_flags_with_a_custom_config_fail() -> None:
    vals = yaml.safe_load((VALUES / "llmd-optimized-baseline.yaml").read_text())
    vals["inferenceExtension"]["flags"] = {"kv-cache-usage-percentage-metric": "vllm:gpu_cache_usage_perc"}
    with pytest.raises(helm_python.HelmError) as err:
        render(vals)
    assert "inferenceExtension.flags.kv-cache-usage-percentage-metric: the legacy engine-metric flags only set" in str(
        err.value
    )


def test_every_key_the_reference_templates_read_is_accepted() -> None:
    """Keys the reference chart's templates (and its epplib subchart) read but its values.yaml does not set."""
    vals: dict[str, Any] = {
        "inferenceExtension": {
            "apiVersion": "inference.networking.k8s.io",
            "metricsPort": 9090,
            "sidecar": {
                "enabled": True,
                "name": "proxy",
                "image": "example.com/proxy:v1",
                "imagePullPolicy": "IfNotPresent",
                "command": "proxy",
                "args": ["--port", "8081"],
                "env": [{"name": "A", "value": "1"}],
                "ports": [{"name": "http", "containerPort": 8081}],
                "livenessProbe": {"httpGet": {"path": "/live", "port": 8081}},
                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8081}},
                "resources": {"requests": {"cpu": "100m"}},
                "volumeMounts": [{"name": "proxy-config", "mountPath": "/etc/proxy"}],
                "volumes": [{"name": "proxy-config", "configMap": {"name": "{{ .Release.Name }}-proxy"}}],
                "configMap": {"name": "demo-proxy", "data": {"proxy.yaml": "listen: 8081\n"}},
            },
            "latencyPredictor": {
                "enabled": False,
                "eppEnv": {"LATENCY_MAX_SAMPLE_SIZE": "10000"},
                "trainingServer": {"port": 8000, "config": {"LATENCY_MODEL_TYPE": "xgboost"}},
                "predictionServers": {"count": 1, "startPort": 8001},
            },
            "endpointsServer": {"createInferencePool": True, "targetPorts": 8000, "modelServerType": "vllm"},
        },
        "inferencePool": {
            "modelServers": {"matchLabels": {"app": "vllm"}},
            "targetPortNumber": 8000,
            "apiVersion": "inference.networking.k8s.io/v1",
        },
        "experimentalHttpRoute": {
            "enabled": True,
            "baseModel": "Qwen/Qwen3-32B",
            "inferenceGatewayName": "gw",
            "requestTimeout": "120s",
        },
    }
    objs = render(vals)
    check_rendered(objs)
    pod = objs[("Deployment", "demo-epp")]["spec"]["template"]["spec"]
    proxy = next(c for c in pod["containers"] if c["name"] == "proxy")
    assert proxy["command"] == ["proxy"] and proxy["args"] == ["--port", "8081"]
    assert {"name": "proxy-config", "configMap": {"name": "demo-proxy"}} in pod["volumes"]  # templated
    assert objs[("ConfigMap", "demo-proxy")]["data"] == {"proxy.yaml": "listen: 8081\n"}
    assert objs[("HTTPRoute", "demo")]["spec"]["parentRefs"][0]["name"] == "gw"
    assert ("InferencePool", "demo") in objs  # createInferencePool: true keeps the pool


def test_a_legacy_metric_flag_naming_the_built_in_metric_is_fine_with_a_custom_config() -> None:
    """guides/tiered-prefix-cache/cpu/manifests/inferencepool/values.yaml, with its misspelt key fixed."""
    vals = yaml.safe_load((VALUES / "llmd-tiered-prefix-cache.yaml").read_text())
    vals["inferenceExtension"]["monitoring"]["prometheus"] = {"enabled": False}
    epp = check_rendered(render(vals))
    assert not any(a.split("=")[0].endswith("-metric") for a in epp["args"])
    vals["inferenceExtension"]["flags"] = {"kv-cache-usage-percentage-metric": "vllm:gpu_cache_usage_perc"}
    with pytest.raises(helm_python.HelmError, match="with pluginsConfigFile"):
        render(vals)
