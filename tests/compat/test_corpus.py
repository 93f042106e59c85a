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
from llm_epp.framework import NullRecorder
from llm_epp.plugins import builtin_registry

CONFIGS = Path(__file__).parent / "configs"

GIE = "GIE v1.5.0"
ROUTER = "llm-d-router v0.10"
GUIDES = "llm-d guides"

NOT_YET: dict[str, tuple[str, frozenset[str]]] = {}
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
