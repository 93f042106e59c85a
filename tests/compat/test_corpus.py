"""One config per shape of EndpointPickerConfig that the upstreams publish (`configs/`, written after
GIE v1.5.0's chart, docs and loader tests, llm-d-router v0.10's deploy configs, docs and tests, and the
llm-d guides). Each loads as `llm-epp config check` loads it, or fails only for what `NOT_YET` lists:
plugin types not implemented yet and features rejected as not supported yet. When a plugin type lands,
the configs needing it fail here until their entry shrinks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llm_epp.config import ConfigError, load_config
from llm_epp.config.gates import FLOW_CONTROL_UNSUPPORTED
from llm_epp.framework import NullRecorder
from llm_epp.plugins import builtin_registry

CONFIGS = Path(__file__).parent / "configs"
FLOW_CONTROL = "flow control"

GIE = "GIE v1.5.0"
ROUTER = "llm-d-router v0.10"
GUIDES = "llm-d guides"

NOT_YET: dict[str, tuple[str, frozenset[str]]] = {
    "gie-chart-grpc-parser.yaml": (
        f"{GIE} config/charts/epplib/templates/_config.yaml (modelServerProtocol grpc)",
        frozenset({"vllmgrpc-parser"}),
    ),
    "gie-flow-control.yaml": (
        f"{GIE} pkg/epp/config/loader/testdata_test.go, site-src/guides/flow-control.md",
        frozenset({FLOW_CONTROL, "fcfs-ordering-policy", "round-robin-fairness-policy"}),
    ),
    "router-decode-filter.yaml": (
        f"{ROUTER} deploy/config/epp-config.yaml, sim-epp-config.yaml, epp-estimate-prefix-cache-config.yaml",
        frozenset({"decode-filter"}),
    ),
    "router-pd-disaggregation.yaml": (
        f"{ROUTER} deploy/config/pd-epp-config.yaml, docs/disaggregation.md",
        frozenset({"decode-filter", "prefill-filter", "disagg-profile-handler", "prefix-based-pd-decider"}),
    ),
    "router-label-selector-pd.yaml": (
        f"{ROUTER} docs/disaggregation.md",
        frozenset({"disagg-profile-handler", "always-disagg-pd-decider"}),
    ),
    "router-encode-prefill-decode.yaml": (
        f"{ROUTER} deploy/config/sim-e-p-d-epp-config.yaml",
        frozenset(
            {
                "encode-filter",
                "prefill-filter",
                "decode-filter",
                "disagg-profile-handler",
                "always-disagg-multimodal-decider",
                "prefix-based-pd-decider",
            }
        ),
    ),
    "router-data-parallel.yaml": (
        f"{ROUTER} deploy/config/dp-epp-config.yaml",
        frozenset({"decode-filter", "data-parallel-profile-handler"}),
    ),
    "router-precise-prefix.yaml": (
        f"{ROUTER} deploy/config/epp-precise-prefix-cache-config.yaml, "
        "test/perf/config/router-configs/precise-prefix.yaml",
        frozenset({"token-producer", "endpoint-notification-source", "precise-prefix-cache-producer"}),
    ),
    "router-gpu-attributes.yaml": (
        f"{ROUTER} deploy/config/sim-epp-gpu-config.yaml",
        frozenset({"dcgm-data-source", "dcgm-extractor", "endpoint-attribute-filter", "endpoint-attribute-scorer"}),
    ),
    "router-probabilistic-admitter.yaml": (
        f"{ROUTER} deploy/config/probabilistic-admitter-epp-config.yaml",
        frozenset({"probabilistic-admitter"}),
    ),
    "router-flow-control-usage-limit.yaml": (
        f"{ROUTER} deploy/config/soft-reflective-ceiling-epp-config.yaml, sim-program-aware-config.yaml",
        frozenset({FLOW_CONTROL, "soft-reflective-ceiling-policy", "program-aware-fairness"}),
    ),
    "guide-agentic-serving.yaml": (
        f"{GUIDES} agentic-serving/router/agentic-serving.values.yaml",
        frozenset({FLOW_CONTROL, "program-aware-fairness"}),
    ),
    "guide-async-flow-control.yaml": (
        f"{GUIDES} batch-serving/asynchronous-processing/multitenant/values/router/flow-control.yaml",
        frozenset({FLOW_CONTROL, "round-robin-fairness-policy", "fcfs-ordering-policy"}),
    ),
    "guide-context-length-pd.yaml": (
        f"{GUIDES} context-length-aware-pd/router.values.yaml",
        frozenset(
            {
                "disagg-headers-handler",
                "always-disagg-pd-decider",
                "disagg-profile-handler",
                "prefill-filter",
                "decode-filter",
                "token-producer",
                "context-length-aware",
            }
        ),
    ),
    "guide-precise-scheduler.yaml": (
        f"{GUIDES} precise-prefix-cache-aware/scheduler/precise-prefix-cache-aware.values.yaml",
        frozenset({"tokenizer", "decode-filter", "precise-prefix-cache-scorer"}),
    ),
}
"""Config -> (the upstream files it mirrors, what it needs that llm-epp does not have yet)."""

_UNKNOWN = re.compile(
    r"^plugins\[\d+\]\.type: (?:unknown plugin type '([^']+)'|plugin type '([^']+)' is not supported yet by llm-epp)"
)
FILES = sorted(p.name for p in CONFIGS.glob("*.yaml"))


_UNSUPPORTED_REF = re.compile(r"ProducerName '([^']+)' is not supported yet")


def _blockers(problems: list[str]) -> tuple[set[str], list[str]]:
    """What the problems say is missing, and the problems that are not about anything missing."""
    missing: set[str] = set()
    other = []
    for p in problems:
        m = _UNKNOWN.match(p)
        if m:
            missing.add(m.group(1) or m.group(2))
        elif m := _UNSUPPORTED_REF.search(p):
            missing.add(m.group(1))  # a parameter naming a producer that does not exist yet
        elif FLOW_CONTROL_UNSUPPORTED in p:
            missing.add(FLOW_CONTROL)
        else:
            other.append(p)
    return missing, other


def test_the_corpus_is_there() -> None:
    assert len(FILES) >= 25
    assert set(NOT_YET) <= set(FILES), "NOT_YET names configs that do not exist"


@pytest.mark.parametrize("name", FILES)
def test_config_loads_or_waits_only_for_what_is_not_yet_there(name: str) -> None:
    try:
        loaded = load_config(CONFIGS / name, builtin_registry(), NullRecorder())
    except ConfigError as e:
        assert name in NOT_YET, f"{name} must load:\n{e}"
        missing, other = _blockers(e.problems)
        assert not other, f"{name} fails for more than what is not implemented yet: {other}"
        assert missing == set(NOT_YET[name][1]), f"{name}: update NOT_YET to {sorted(missing)}"
        return
    assert name not in NOT_YET, f"{name} loads now: remove it from NOT_YET"
    assert loaded.profiles, name
