from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from llm_epp.datalayer.objectives import ObjectivesConfig, ObjectivesStore, RewriteRule
from llm_epp.framework.types import Endpoint, EndpointKey, EndpointMetadata, Metrics
from llm_epp.observability.known_models import ConfiguredAndServedModels
from llm_epp.observability.metrics import OTHER, PrometheusRecorder


def endpoint(name: str, active: set[str], waiting: frozenset[str] = frozenset()) -> Endpoint:
    meta = EndpointMetadata(EndpointKey("ns", name), "127.0.0.1", 8000)
    return Endpoint(meta, Metrics(active_models=frozenset(active), waiting_models=frozenset(waiting)))


def test_rewrite_rules_and_pod_adapters_are_known() -> None:
    store = ObjectivesStore(
        ObjectivesConfig(
            exact_rules={"chat": RewriteRule("canary", (("chat-v1", 90), ("chat-v2", 10)))},
            generic_rule=RewriteRule("fallback", (("base", 1),)),
        )
    )
    pods = [endpoint("a", {"lora-x"}), endpoint("b", set(), frozenset({"lora-y"}))]
    known = ConfiguredAndServedModels(store, lambda: pods)
    for name in ("chat", "chat-v1", "chat-v2", "base", "lora-x", "lora-y"):
        assert name in known, name
    for other in ("", "lora-z", "CHAT", 42):
        assert other not in known, other
    pods.append(endpoint("c", {"lora-z"}))  # live: a pod loading an adapter makes it known at once
    assert "lora-z" in known
    store.replace(ObjectivesConfig())
    assert "chat" not in known


def test_recorder_labels_through_the_live_source() -> None:
    store = ObjectivesStore(ObjectivesConfig(exact_rules={"chat": RewriteRule("r", (("chat-v1", 1),))}))
    rec = PrometheusRecorder(CollectorRegistry(), known_models=ConfiguredAndServedModels(store, lambda: ()))
    rec.request_scheduled("chat", "chat-v1", 0)
    rec.request_scheduled("attacker-name", "attacker-name", 0)
    get = rec.registry.get_sample_value
    assert (
        get(
            "inference_objective_request_total", {"model_name": "chat", "target_model_name": "chat-v1", "priority": "0"}
        )
        == 1
    )
    assert (
        get("inference_objective_request_total", {"model_name": OTHER, "target_model_name": OTHER, "priority": "0"})
        == 1
    )


def test_a_new_snapshot_or_new_rules_are_seen_at_once() -> None:
    store = ObjectivesStore(ObjectivesConfig())
    snapshot: list[tuple[Any, ...]] = [(endpoint("a", {"lora-x"}),)]
    known = ConfiguredAndServedModels(store, lambda: snapshot[0])
    assert "lora-x" in known and "lora-y" not in known
    assert "lora-y" not in known  # asked again against the same snapshot
    snapshot[0] = (endpoint("a", {"lora-x"}), endpoint("b", set(), frozenset({"lora-y"})))
    assert "lora-y" in known
    snapshot[0] = (endpoint("b", set()),)  # the adapter is gone
    assert "lora-x" not in known and "lora-y" not in known
    store.replace(ObjectivesConfig(generic_rule=RewriteRule("fallback", (("base", 1),))))
    assert "base" in known
