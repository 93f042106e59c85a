"""The prefill/decode example (deploy/examples/pd-disaggregation): its EndpointPickerConfig loads (also with
`llm-epp config check`) and is the disaggregation setup, it fits the EPP manifest it goes with, the pods
carry the roles the filters read, and the decode pods' sidecar command line is accepted by
`llm-epp pd-sidecar` and points at the local vLLM."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from llm_epp.config import load_config
from llm_epp.framework import NullRecorder
from llm_epp.pdsidecar import cli as sidecar_cli
from llm_epp.plugins import builtin_registry
from tests.deploy.conftest import load_yaml_docs, validate_object
from tests.deploy.render_assets import DEPLOY

EXAMPLE = DEPLOY / "examples" / "pd-disaggregation"
ROLE = "llm-d.ai/role"


def docs() -> list[dict[str, Any]]:
    return [d for path in sorted(EXAMPLE.glob("*.yaml")) for d in load_yaml_docs(path)]


def one(kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def epp_manifest() -> tuple[dict[str, Any], dict[str, Any]]:
    manifest = load_yaml_docs(DEPLOY / "manifests" / "epp.yaml")
    deployment = next(d for d in manifest if d["kind"] == "Deployment")
    pool = next(d for d in manifest if d["kind"] == "InferencePool")
    return deployment, pool


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    assert len(found) == 1, name
    return found[0]


def test_every_object_validates() -> None:
    assert {(d["kind"], d["metadata"]["name"]) for d in docs()} == {
        ("ConfigMap", "my-pool-epp"),
        ("Deployment", "vllm-prefill"),
        ("Deployment", "vllm-decode"),
    }
    assert all(validate_object(d) for d in docs())


def test_the_config_replaces_the_manifests_config_and_loads_as_pd(tmp_path: Path) -> None:
    epp, _ = epp_manifest()
    args = container(epp, "epp")["args"]
    config_file = next(a.split("=", 1)[1] for a in args if a.startswith("--config-file="))
    mount = next(m for m in container(epp, "epp")["volumeMounts"] if config_file.startswith(m["mountPath"] + "/"))
    volume = next(v for v in epp["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    cm = one("ConfigMap", volume["configMap"]["name"])
    text = cm["data"][Path(config_file).name]

    path = tmp_path / "pd.yaml"
    path.write_text(text)
    loaded = load_config(path, builtin_registry(), NullRecorder())
    assert {p.name for p in loaded.profiles} == {"decode", "prefill"}
    assert loaded.plugin_types[loaded.handler_name] == "disagg-profile-handler"
    assert loaded.data_sources  # the default metrics source is added
    assert loaded.warnings == []
    raw = yaml.safe_load(text)
    types = {p["type"] for p in raw["plugins"]}
    assert {"disagg-profile-handler", "prefix-based-pd-decider", "prefill-filter", "decode-filter"} <= types
    handler = next(p for p in raw["plugins"] if p["type"] == "disagg-profile-handler")
    assert handler["parameters"]["deciders"]["prefill"] == "prefix-based-pd-decider"
    decider = next(p for p in raw["plugins"] if p["type"] == "prefix-based-pd-decider")
    assert decider["parameters"]["nonCachedTokens"] > 0  # 0 would never disaggregate
    refs = {p["name"]: [r["pluginRef"] for r in p["plugins"]] for p in raw["schedulingProfiles"]}
    assert "decode-filter" in refs["decode"] and "prefill-filter" in refs["prefill"]

    check = subprocess.run(
        [str(Path(sys.executable).parent / "llm-epp"), "config", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"{path}: valid\n" in check.stdout


def test_the_pool_selects_both_roles_on_its_target_port() -> None:
    _, pool = epp_manifest()
    selector = pool["spec"]["selector"]["matchLabels"]
    (target,) = [p["number"] for p in pool["spec"]["targetPorts"]]
    roles = {}
    for name in ("vllm-prefill", "vllm-decode"):
        d = one("Deployment", name)
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), name
        assert d["spec"]["selector"]["matchLabels"].items() <= labels.items()
        roles[name] = labels[ROLE]
        ports = {p["containerPort"] for c in d["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        assert target in ports, name
    assert roles == {"vllm-prefill": "prefill", "vllm-decode": "decode"}
    assert "--port=8000" in container(one("Deployment", "vllm-prefill"), "vllm")["args"]


def test_the_decode_sidecar_listens_on_the_target_port_in_front_of_vllm() -> None:
    decode = one("Deployment", "vllm-decode")
    sidecar = container(decode, "pd-sidecar")
    assert sidecar["args"][0] == "pd-sidecar"
    parser = argparse.ArgumentParser()
    sidecar_cli.add_arguments(parser)
    args = parser.parse_args(sidecar["args"][1:])
    config, problems = sidecar_cli.config_from_args(args)
    assert problems == []
    _, pool = epp_manifest()
    assert args.port == pool["spec"]["targetPorts"][0]["number"] == 8000
    vllm = container(decode, "vllm")
    vllm_port = next(int(a.split("=", 1)[1]) for a in vllm["args"] if a.startswith("--port="))
    assert vllm_port == 8001
    assert config.decoder_url == f"http://127.0.0.1:{vllm_port}"
    assert config.kv_connector == "nixlv2"
    for d in (decode, one("Deployment", "vllm-prefill")):
        (kv,) = [a for a in container(d, "vllm")["args"] if a.startswith("--kv-transfer-config=")]
        assert yaml.safe_load(kv.split("=", 1)[1])["kv_connector"] == "NixlConnector"
