"""Composition: which parsers the director gets."""

from __future__ import annotations

from llm_epp.composition import configured_parsers
from llm_epp.config import load_config_text
from llm_epp.framework import NullRecorder
from llm_epp.plugins import builtin_registry

ONLY_PASSTHROUGH = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: passthrough-parser
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer}
  - {pluginRef: max-score-picker}
requestHandler:
  parsers:
  - pluginRef: passthrough-parser
"""

GIE_PARSER_SECTION = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
parser:
  pluginRef: openai-parser
"""


def test_without_configured_parsers_the_default_list_is_used() -> None:
    config = load_config_text(None, builtin_registry(), NullRecorder())
    assert [p.typed_name.type for p in configured_parsers(config)] == [
        "openai-parser",
        "anthropic-parser",
        "vllmhttp-parser",
        "passthrough-parser",
    ]


def test_configured_parsers_replace_the_default_list() -> None:
    config = load_config_text(ONLY_PASSTHROUGH, builtin_registry(), NullRecorder())
    assert [p.typed_name.type for p in configured_parsers(config)] == ["passthrough-parser"]


def test_gie_parser_section_names_the_one_parser() -> None:
    config = load_config_text(GIE_PARSER_SECTION, builtin_registry(), NullRecorder())
    assert [p.typed_name.type for p in configured_parsers(config)] == ["openai-parser"]
