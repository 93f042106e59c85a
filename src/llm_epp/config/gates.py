"""`featureGates`: the gates both upstreams register, written `name` or `name=<bool>` (llm-d-router syntax).

GIE v1.5.0 registers `dataLayer` (deprecated: the data layer is always on), `enableLegacyMetrics` and
`flowControl`, all off by default (`flowControl` on: requests wait in the EPP's flow-control queues).
llm-d-router v0.10 registers `flowControl` (off) and `haPopulateNonLeaderDatastore` (on). Each gate
resolves to one of:
- its default: nothing changes;
- an accepted value with its effect (`dataLayer` on: the data layer, which is always on; a deprecation
  warning says so, as upstream's comment does);
- rejected: a setting llm-epp cannot honour yet, with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FLOW_CONTROL = "flowControl"
DATA_LAYER = "dataLayer"
LEGACY_METRICS = "enableLegacyMetrics"
HA_POPULATE_NON_LEADER = "haPopulateNonLeaderDatastore"

DEFAULTS: dict[str, bool] = {
    DATA_LAYER: False,
    LEGACY_METRICS: False,
    FLOW_CONTROL: False,
    HA_POPULATE_NON_LEADER: True,
}
"""Every gate either upstream registers, with its default."""

FLOW_CONTROL_WITHOUT_GATE = (
    "flowControl settings take effect only with the flowControl feature gate (as upstream): add "
    "`featureGates: [flowControl]` to queue requests in the EPP, or remove the settings"
)

_UNSUPPORTED: dict[tuple[str, bool], str] = {
    (LEGACY_METRICS, True): (
        "enableLegacyMetrics is not supported: llm-epp always collects metrics through the data layer "
        "(metrics-data-source and core-metrics-extractor, whose engineConfigs set the metric names); "
        "remove the gate"
    ),
    (HA_POPULATE_NON_LEADER, False): (
        "haPopulateNonLeaderDatastore=false is not supported yet: every llm-epp replica keeps its endpoint "
        "data up to date, leader or not; remove the gate"
    ),
}
_TRUE = ("1", "t", "true")
_FALSE = ("0", "f", "false")


@dataclass(frozen=True, slots=True)
class ResolvedGates:
    values: dict[str, bool]
    problems: list[str]
    warnings: list[str]


def _go_bool(text: str) -> bool | None:
    """Go's strconv.ParseBool after upstream lower-cases the value."""
    t = text.strip().lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    return None


def resolve_gates(entries: Sequence[str]) -> ResolvedGates:
    values = dict(DEFAULTS)
    problems: list[str] = []
    warnings: list[str] = []
    known = ", ".join(sorted(DEFAULTS))
    for i, entry in enumerate(entries):
        where = f"featureGates[{i}]"
        name, sep, raw = entry.partition("=")
        name = name.strip()
        if name not in DEFAULTS:
            problems.append(f"{where}: unknown feature gate {name!r}; known: {known}")
            continue
        value = True
        if sep:
            parsed = _go_bool(raw)
            if parsed is None:
                problems.append(f"{where}: {raw!r} is not a valid value for {name}; write {name}=true or {name}=false")
                continue
            value = parsed
        values[name] = value
        reason = _UNSUPPORTED.get((name, value))
        if reason is not None:
            problems.append(f"{where}: {reason}")
        elif name == DATA_LAYER and value:
            warnings.append(f"{where}: the dataLayer feature gate is deprecated; the data layer is always on")
    return ResolvedGates(values, problems, warnings)
