"""Tests for llm_epp.config.loader: the default configuration, reference-style YAML, resolution rules
(default weight, picker and profile handler), and error reporting with YAML paths."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from llm_epp.config import ConfigError, LoadedConfig, load_config, load_config_text
from llm_epp.plugins import builtin_registry
from tests.unit.builders import FakeRecorder, endpoint, names, request

HEAD = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"

REFERENCE_STYLE = HEAD + textwrap.dedent(
    """\
    featureGates: [dataLayer]
    plugins:
    - type: queue-scorer
    - name: kv
      type: kv-cache-utilization-scorer
      parameters: {}
    - name: conformance
      type: header-based-testing-filter
    - name: top2
      type: max-score-picker
      parameters:
        maxNumOfEndpoints: 2
    - type: single-profile-handler
    schedulingProfiles:
    - name: default
      plugins:
      - pluginRef: conformance
      - pluginRef: queue-scorer
        weight: 2
      - pluginRef: kv
        weight: 3.5
      - pluginRef: top2
    parser:
      pluginRef: openai-parser
    """
)


def _load(text: str | None, recorder: FakeRecorder | None = None, strict: bool = False) -> LoadedConfig:
    return load_config_text(text, builtin_registry(), recorder or FakeRecorder(), strict=strict)


def _problems(text: str, strict: bool = True) -> list[str]:
    with pytest.raises(ConfigError) as info:
        _load(text, strict=strict)
    assert info.value.problems, "a ConfigError must list its problems"
    return info.value.problems


def _yaml(body: str) -> str:
    return HEAD + textwrap.dedent(body)


# ------------------------------------------------------------------------------------ default config


@pytest.mark.parametrize("text", [None, "", "  \n\t\n"], ids=["none", "empty", "blank"])
def test_default_config(text: str | None) -> None:
    loaded = _load(text)
    assert len(loaded.profiles) == 1
    profile = loaded.profiles[0]
    assert profile.name == "default"
    assert profile.filters == []
    assert profile.scorers == [
        ("queue-scorer", 2.0),
        ("kv-cache-utilization-scorer", 2.0),
        ("prefix-cache-scorer", 3.0),
    ]
    assert profile.picker == "max-score-picker"
    assert loaded.handler_name == "single-profile-handler"
    assert loaded.plugin_types == {
        "queue-scorer": "queue-scorer",
        "kv-cache-utilization-scorer": "kv-cache-utilization-scorer",
        "prefix-cache-scorer": "prefix-cache-scorer",
        "approx-prefix-cache-producer": "approx-prefix-cache-producer",
        "metrics-data-source": "metrics-data-source",
        "core-metrics-extractor": "core-metrics-extractor",
        "max-score-picker": "max-score-picker",
        "single-profile-handler": "single-profile-handler",
        "utilization-detector": "utilization-detector",
    }
    assert loaded.saturation is not None and loaded.saturation.typed_name.type == "utilization-detector"
    assert loaded.data_source is not None and loaded.extractor is not None
    assert [p.typed_name.type for p in loaded.pre_request] == ["approx-prefix-cache-producer"]


def test_a_prefix_scorer_alone_gets_a_producer_with_its_parameters() -> None:
    loaded = _load("plugins:\n- type: prefix-cache-scorer\n  parameters: {blockSizeTokens: 32}\n")
    assert loaded.plugin_types["approx-prefix-cache-producer"] == "approx-prefix-cache-producer"
    assert loaded.plugin_params["approx-prefix-cache-producer"] == {"blockSizeTokens": 32}
    assert [p.typed_name.name for p in loaded.prepare_data] == ["approx-prefix-cache-producer"]


@pytest.mark.parametrize("consumer", ["prefix-cache-affinity-filter", "no-hit-lru-scorer"])
def test_other_prefix_consumers_alone_get_a_default_producer(consumer: str) -> None:
    loaded = _load(f"plugins:\n- type: {consumer}\n- type: queue-scorer\n")
    assert loaded.plugin_types["approx-prefix-cache-producer"] == "approx-prefix-cache-producer"
    assert loaded.plugin_params["approx-prefix-cache-producer"] == {}
    assert [p.typed_name.name for p in loaded.prepare_data] == ["approx-prefix-cache-producer"]


def test_no_producer_is_added_without_a_prefix_consumer() -> None:
    loaded = _load("plugins:\n- type: queue-scorer\n")
    assert "approx-prefix-cache-producer" not in loaded.plugin_types
    assert not loaded.prepare_data


def test_an_empty_data_layer_section_turns_collection_off() -> None:
    loaded = _load("plugins:\n- type: queue-scorer\ndataLayer: {sources: []}\n")
    assert loaded.data_source is None and loaded.extractor is None


def test_default_config_prefers_short_queues_and_free_cache() -> None:
    loaded = _load(None)
    eps = [
        endpoint("busy", queue=9, kv=0.9, address="10.0.0.1"),
        endpoint("idle", queue=0, kv=0.1, address="10.0.0.2"),
        endpoint("mid", queue=4, kv=0.5, address="10.0.0.3"),
    ]
    result = loaded.scheduler.schedule(request(), eps)
    assert result.primary is not None
    assert names(result.primary.target_endpoints) == ["idle"]
    idle = result.primary.scores[eps[1].key]
    # no prefix data was prepared for this request: the prefix scorer adds 0
    assert idle == pytest.approx(
        {"queue-scorer": 2.0, "kv-cache-utilization-scorer": 1.8, "prefix-cache-scorer": 0.0, "total": 3.8}
    )


# ---------------------------------------------------------------------------------- reference style


def test_reference_style_config_loads() -> None:
    loaded = _load(REFERENCE_STYLE)
    assert loaded.spec.feature_gates == ["dataLayer"]
    assert loaded.plugin_types == {
        "queue-scorer": "queue-scorer",
        "kv": "kv-cache-utilization-scorer",
        "conformance": "header-based-testing-filter",
        "top2": "max-score-picker",
        "single-profile-handler": "single-profile-handler",
        # created as the reference does: the parser it names, the default saturation detector and metrics
        # source/extractor
        "openai-parser": "openai-parser",
        "utilization-detector": "utilization-detector",
        "metrics-data-source": "metrics-data-source",
        "core-metrics-extractor": "core-metrics-extractor",
    }
    assert loaded.warnings == ["featureGates[0]: the dataLayer feature gate is deprecated; the data layer is always on"]
    assert loaded.plugin_params["top2"] == {"maxNumOfEndpoints": 2}
    [profile] = loaded.profiles
    assert profile.filters == ["conformance"]
    assert profile.scorers == [("queue-scorer", 2.0), ("kv", 3.5)]
    assert profile.picker == "top2"
    assert loaded.handler_name == "single-profile-handler"


def test_reference_style_config_schedules_with_its_plugins_and_recorder() -> None:
    recorder = FakeRecorder()
    loaded = _load(REFERENCE_STYLE, recorder)
    eps = [
        endpoint("a", queue=0, address="10.0.0.1"),
        endpoint("b", queue=5, address="10.0.0.2"),
        endpoint("c", queue=9, address="10.0.0.3"),
    ]
    headers = {"test-epp-endpoint-selection": "10.0.0.2,10.0.0.3"}
    result = loaded.scheduler.schedule(request(headers=headers), eps)
    assert result.primary is not None
    assert names(result.primary.target_endpoints) == ["b", "c"]
    assert recorder.durations_for("Filter") == ["conformance"]
    assert recorder.durations_for("Scorer") == ["queue-scorer", "kv"]
    assert recorder.durations_for("Picker") == ["top2"]


def test_llm_d_api_version_is_accepted() -> None:
    text = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n"
    assert _load(text).profiles[0].scorers == [("queue-scorer", 1.0)]


def test_api_version_and_kind_may_be_omitted() -> None:
    assert _load("plugins:\n- type: queue-scorer\n").profiles[0].name == "default"


def test_feature_gates_resolve_to_their_values() -> None:
    loaded = _load(_yaml("featureGates: [dataLayer, flowControl=false, haPopulateNonLeaderDatastore=TRUE]\n"))
    assert loaded.feature_gates == {
        "dataLayer": True,
        "enableLegacyMetrics": False,
        "flowControl": False,
        "haPopulateNonLeaderDatastore": True,
    }


def test_load_config_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text(REFERENCE_STYLE)
    loaded = load_config(path, builtin_registry(), FakeRecorder())
    assert loaded.profiles[0].picker == "top2"


def test_load_config_reports_an_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(path, builtin_registry(), FakeRecorder())
    assert info.value.source == str(path)
    assert len(info.value.problems) == 1
    assert "cannot read the file" in info.value.problems[0]


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text(_yaml("featureGates: [nope]\n"))
    with pytest.raises(ConfigError) as info:
        load_config(path, builtin_registry(), FakeRecorder())
    assert info.value.source == str(path)
    assert str(path) in str(info.value)


# -------------------------------------------------------------------------------- resolution rules


def test_weight_defaults_to_one() -> None:
    loaded = _load(
        _yaml(
            """\
            plugins:
            - type: queue-scorer
            - type: kv-cache-utilization-scorer
            schedulingProfiles:
            - name: p
              plugins:
              - pluginRef: queue-scorer
              - pluginRef: kv-cache-utilization-scorer
                weight: 0
            """
        )
    )
    assert loaded.profiles[0].scorers == [("queue-scorer", 1.0), ("kv-cache-utilization-scorer", 0.0)]


def test_a_profile_without_picker_gets_the_defined_picker() -> None:
    loaded = _load(
        _yaml(
            """\
            plugins:
            - type: queue-scorer
            - name: rand
              type: random-picker
            schedulingProfiles:
            - name: p
              plugins:
              - pluginRef: queue-scorer
            """
        )
    )
    assert loaded.profiles[0].picker == "rand"
    assert "max-score-picker" not in loaded.plugin_types


def test_a_profile_without_any_picker_gets_a_max_score_picker() -> None:
    loaded = _load(
        _yaml(
            """\
            plugins:
            - type: queue-scorer
            schedulingProfiles:
            - name: p
              plugins:
              - pluginRef: queue-scorer
            """
        )
    )
    assert loaded.profiles[0].picker == "max-score-picker"
    assert loaded.plugin_types["max-score-picker"] == "max-score-picker"
    assert loaded.handler_name == "single-profile-handler"


def test_empty_scheduling_profiles_synthesise_default_with_every_filter_scorer_and_picker() -> None:
    loaded = _load(
        _yaml(
            """\
            plugins:
            - type: header-based-testing-filter
            - type: queue-scorer
            - name: kv
              type: kv-cache-utilization-scorer
            - name: top3
              type: max-score-picker
              parameters: {maxNumOfEndpoints: 3}
            - type: single-profile-handler
            schedulingProfiles: []
            """
        )
    )
    [profile] = loaded.profiles
    assert profile.name == "default"
    assert profile.filters == ["header-based-testing-filter"]
    assert profile.scorers == [("queue-scorer", 1.0), ("kv", 1.0)]
    assert profile.picker == "top3"
    assert loaded.handler_name == "single-profile-handler"


def test_no_plugins_at_all_gives_a_default_profile_with_a_picker() -> None:
    loaded = _load(HEAD)
    [profile] = loaded.profiles
    assert (profile.name, profile.filters, profile.scorers, profile.picker) == (
        "default",
        [],
        [],
        "max-score-picker",
    )


def test_an_explicit_profile_handler_is_used() -> None:
    loaded = _load(
        _yaml(
            """\
            plugins:
            - name: handler
              type: single-profile-handler
            - type: queue-scorer
            """
        )
    )
    assert loaded.handler_name == "handler"
    assert "single-profile-handler" not in loaded.plugin_types


def test_describe_mentions_profiles_weights_and_parameters() -> None:
    text = _load(REFERENCE_STYLE).describe()
    assert "profile handler: single-profile-handler (single-profile-handler)" in text
    assert "top2 (max-score-picker): maxNumOfEndpoints=2" in text
    assert "kv (kv-cache-utilization-scorer)" in text
    assert "profile default:" in text
    assert "filter conformance" in text
    assert "scorer queue-scorer weight 2" in text
    assert "scorer kv weight 3.5" in text
    assert "picker top2" in text


# ------------------------------------------------------------------------------------------ errors


ERROR_CASES = [
    pytest.param(
        _yaml("plugins:\n- type: queue-scorer\n- type: no-such-scorer\n"),
        ["plugins[1].type: unknown plugin type 'no-such-scorer'; known types: ", "queue-scorer"],
        id="unknown-plugin-type",
    ),
    pytest.param(
        _yaml("plugins:\n- type: queue-scorer\n- type: max-score-picker\n  parameters: {maxNumOfEndpoint: 2}\n"),
        ["plugins[1].parameters.maxNumOfEndpoint: unknown parameter"],
        id="unknown-parameter",
    ),
    pytest.param(
        _yaml("plugins:\n- type: max-score-picker\n  parameters: {maxNumOfEndpoints: 0}\n"),
        ["plugins[0].parameters.maxNumOfEndpoints:", "greater than or equal to 1"],
        id="parameter-out-of-range",
    ),
    pytest.param(
        _yaml("plugins:\n- type: queue-scorer\n  parameters: {threshold: 4}\n"),
        ["plugins[0].parameters.threshold: unknown parameter"],
        id="parameter-for-a-plugin-without-parameters",
    ),
    pytest.param(
        _yaml("plugins:\n- type: max-score-picker\n  parameters: [2]\n"),
        ["plugins[0].parameters:", "dictionary"],
        id="parameters-not-a-mapping",
    ),
    pytest.param(
        _yaml(
            """\
            plugins:
            - type: queue-scorer
            schedulingProfiles:
            - name: default
              plugins:
              - pluginRef: queue-scorer
                weigth: 2
            """
        ),
        ["schedulingProfiles[0].plugins[0].weigth: unknown field", "did you mean 'weight'"],
        id="misspelt-weight",
    ),
    pytest.param(
        _yaml("plugin:\n- type: queue-scorer\n"),
        ["plugin: unknown field", "did you mean 'plugins'"],
        id="misspelt-top-level-key",
    ),
    pytest.param(
        _yaml(
            """\
            plugins:
            - type: queue-scorer
            schedulingProfiles:
            - name: default
              plugins:
              - pluginRef: queue-scorer
                weight: -1
            """
        ),
        ["schedulingProfiles[0].plugins[0].weight:", "greater than or equal to 0"],
        id="negative-weight",
    ),
    pytest.param(
        _yaml("plugins:\n- type: queue-scorer\n   name: q\n"),
        ["not valid YAML at line 5, column 8"],
        id="bad-yaml",
    ),
    pytest.param(
        _yaml("plugins: [\n  {type: queue-scorer}\n"),
        ["not valid YAML at line"],
        id="unclosed-flow-sequence",
    ),
    pytest.param(
        "- type: queue-scorer\n",
        ["the document must be a mapping with apiVersion, kind and plugins"],
        id="document-is-a-list",
    ),
    pytest.param(
        "queue-scorer\n",
        ["the document must be a mapping"],
        id="document-is-a-scalar",
    ),
    pytest.param("- a\n- b\n", ["the document must be a mapping"], id="document-is-a-list"),
    pytest.param(
        _yaml("plugins:\n- name: a\n  type: queue-scorer\n- name: a\n  type: kv-cache-utilization-scorer\n"),
        ["plugins[1].name: plugin name 'a' is used twice; give each a unique name"],
        id="duplicate-plugin-names",
    ),
    pytest.param(
        _yaml("plugins:\n- type: queue-scorer\n- type: queue-scorer\n"),
        ["plugins[1].name: plugin name 'queue-scorer' is used twice"],
        id="duplicate-default-plugin-names",
    ),
    pytest.param(
        _yaml(
            """\
            plugins:
            - type: queue-scorer
            - type: single-profile-handler
            schedulingProfiles:
            - name: p
              plugins: [{pluginRef: queue-scorer}]
            - name: p
              plugins: [{pluginRef: queue-scorer}]
            """
        ),
        ["schedulingProfiles[1].name: profile name 'p' is used twice"],
        id="duplicate-profile-names",
    ),
    pytest.param(
        _yaml(
            """\
            plugins:
            - type: queue-scorer
            schedulingProfiles:
            - name: p
              plugins:
              - pluginRef: queue-scorer
              - pluginRef: kv
            """
        ),
        ["schedulingProfiles[0].plugins[1].pluginRef: no plugin named 'kv' is defined under plugins"],
        id="undefined-plugin-ref",
    ),
    pytest.param(
        _yaml(
            """\
            plugins:
            - type: max-score-picker
            - type: random-picker
            schedulingProfiles:
            - name: p
              plugins:
              - pluginRef: max-score-picker
              - pluginRef: random-picker
            """
        ),
        ["schedulingProfiles[0].plugins: a profile may have only one picker, found max-score-picker, random-picker"],
        id="two-pickers-in-a-profile",
    ),
    pytest.param(
        _yaml("plugins:\n- type: max-score-picker\n- type: random-picker\n"),
        ["schedulingProfiles[0].plugins: a profile may have only one picker"],
        id="two-pickers-in-the-synthesised-profile",
    ),
    pytest.param(
        _yaml(
            """\
            plugins:
            - type: queue-scorer
            - type: single-profile-handler
            schedulingProfiles:
            - name: a
              plugins: [{pluginRef: queue-scorer}]
            - name: b
              plugins: [{pluginRef: queue-scorer}]
            """
        ),
        ["schedulingProfiles: single-profile-handler runs exactly 1 profile, but 2 are configured"],
        id="two-profiles-with-single-profile-handler",
    ),
    pytest.param(
        _yaml(
            """\
            plugins:
            - type: queue-scorer
            schedulingProfiles:
            - name: a
              plugins: [{pluginRef: queue-scorer}]
            - name: b
              plugins: [{pluginRef: queue-scorer}]
            """
        ),
        ["schedulingProfiles: 2 profiles need a profile handler plugin that can run them"],
        id="two-profiles-without-handler",
    ),
    pytest.param(
        _yaml(
            """\
            plugins:
            - name: h1
              type: single-profile-handler
            - name: h2
              type: single-profile-handler
            """
        ),
        ["plugins: only one profile handler may be configured, found h1, h2"],
        id="two-profile-handlers",
    ),
    pytest.param(
        _yaml("featureGates: [dataLayer, fastPath]\n"),
        ["featureGates[1]: unknown feature gate 'fastPath'; known: dataLayer, enableLegacyMetrics, flowControl"],
        id="unknown-feature-gate",
    ),
    pytest.param(
        "apiVersion: inference.networking.k8s.io/v1\nkind: EndpointPickerConfig\n",
        ["apiVersion:", "inference.networking.x-k8s.io/v1alpha1"],
        id="bad-api-version",
    ),
    pytest.param(
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: InferencePool\n",
        ["kind:", "EndpointPickerConfig"],
        id="bad-kind",
    ),
    pytest.param(
        _yaml(
            """\
            plugins:
            - type: queue-scorer
            data:
              sources: []
            """
        ),
        ["data: unknown field", "called dataLayer"],
        id="data-instead-of-dataLayer",
    ),
    pytest.param(
        _yaml("parser:\n  pluginRef: grpc-parser\n"),
        ["parser.pluginRef: no plugin named 'grpc-parser' is defined and it is not a parser type"],
        id="unknown-parser",
    ),
    pytest.param(
        _yaml("saturationDetector:\n  pluginRef: sat\n"),
        ["saturationDetector.pluginRef: no plugin named 'sat' is defined"],
        id="undefined-saturation-detector",
    ),
    pytest.param(
        _yaml(
            """\
            dataLayer:
              sources:
              - pluginRef: metrics
                extractors: [{pluginRef: core}]
            """
        ),
        [
            "dataLayer.sources[0].pluginRef: no plugin named 'metrics' is defined",
            "dataLayer.sources[0].extractors[0].pluginRef: no plugin named 'core' is defined",
        ],
        id="undefined-data-layer-plugins",
    ),
    pytest.param(
        _yaml("schedulingProfiles:\n- plugins: []\n"),
        ["schedulingProfiles[0].name:", "required"],
        id="profile-without-name",
    ),
    pytest.param(
        _yaml("plugins:\n- name: q\n"),
        ["plugins[0].type:", "required"],
        id="plugin-without-type",
    ),
]


@pytest.mark.parametrize(("text", "expected"), ERROR_CASES)
def test_errors_name_the_yaml_path_and_what_to_do(text: str, expected: list[str]) -> None:
    problems = _problems(text)
    for fragment in expected:
        assert any(fragment in p for p in problems), f"{fragment!r} not in {problems}"


def test_unknown_plugin_type_lists_every_known_type() -> None:
    [problem] = _problems(_yaml("plugins:\n- type: nope\n"))
    for known in builtin_registry().types():
        assert known in problem


def test_bad_yaml_reports_line_and_column() -> None:
    [problem] = _problems("plugins:\n- type: queue-scorer\n  parameters: {a: 1\n")
    assert problem.startswith("not valid YAML at line ")
    assert ", column " in problem


def test_config_error_message_lists_source_and_every_problem() -> None:
    with pytest.raises(ConfigError) as info:
        _load(_yaml("featureGates: [a, b]\n"))
    err = info.value
    assert err.source == "--config-text"
    assert isinstance(err, ValueError)
    assert len(err.problems) == 2
    message = str(err)
    assert message.startswith("invalid EndpointPickerConfig in --config-text:")
    for p in err.problems:
        assert f"  - {p}" in message


def test_several_problems_are_reported_together() -> None:
    problems = _problems(
        _yaml(
            """\
            featureGates: [turbo]
            plugins:
            - type: queue-scorer
            - type: no-such-scorer
            - name: top
              type: max-score-picker
              parameters: {maxNumOfEndpoint: 2}
            - type: random-picker
            - name: q2
              type: queue-scorer
              parameters: {bogus: 1}
            schedulingProfiles:
            - name: default
              plugins:
              - pluginRef: queue-scorer
              - pluginRef: missing
              - pluginRef: random-picker
              - pluginRef: random-picker
            parser: {pluginRef: passthrough}
            """
        )
    )
    expected = [
        "featureGates[0]: unknown feature gate 'turbo'",
        "plugins[1].type: unknown plugin type 'no-such-scorer'",
        "plugins[2].parameters.maxNumOfEndpoint: unknown parameter",
        "plugins[4].parameters.bogus: unknown parameter",
        "schedulingProfiles[0].plugins[1].pluginRef: no plugin named 'missing'",
        "schedulingProfiles[0].plugins: a profile may have only one picker",
        "parser.pluginRef: no plugin named 'passthrough' is defined",
    ]
    for fragment in expected:
        assert any(fragment in p for p in problems), f"{fragment!r} not in {problems}"
    assert len(problems) == len(expected)


def test_a_ref_to_a_plugin_that_failed_to_build_is_not_reported_again() -> None:
    problems = _problems(
        _yaml(
            """\
            plugins:
            - name: top
              type: max-score-picker
              parameters: {maxNumOfEndpoints: 0}
            schedulingProfiles:
            - name: default
              plugins: [{pluginRef: top}]
            """
        )
    )
    assert len(problems) == 1
    assert problems[0].startswith("plugins[0].parameters.maxNumOfEndpoints:")


def test_schema_problems_are_reported_together() -> None:
    problems = _problems(
        "apiVersion: v1\nkind: Config\nplugins:\n- type: queue-scorer\n  nmae: q\n"
        "schedulingProfiles:\n- name: p\n  plugins: [{pluginRef: q, weigth: 1}]\n"
    )
    assert [p.split(":")[0] for p in problems] == [
        "apiVersion",
        "kind",
        "plugins[0].nmae",
        "schedulingProfiles[0].plugins[0].weigth",
    ]


def test_a_duplicate_of_a_plugin_that_failed_to_build_is_reported() -> None:
    problems = _problems(_yaml("plugins:\n- name: a\n  type: no-such-scorer\n- name: a\n  type: queue-scorer\n"))
    assert any(p.startswith("plugins[1].name: plugin name 'a' is used twice") for p in problems), problems


def test_an_infinite_weight_is_rejected() -> None:
    problems = _problems(
        _yaml(
            """\
            plugins:
            - type: queue-scorer
            schedulingProfiles:
            - name: default
              plugins:
              - pluginRef: queue-scorer
                weight: .inf
            """
        )
    )
    assert any(p.startswith("schedulingProfiles[0].plugins[0].weight:") for p in problems), problems


def test_an_auto_created_picker_does_not_replace_a_user_plugin_of_the_same_name() -> None:
    text = _yaml("plugins:\n- name: max-score-picker\n  type: queue-scorer\n")
    try:
        loaded = _load(text)
    except ConfigError:
        return  # refusing the name clash would be a fix too
    assert loaded.plugin_types["max-score-picker"] == "queue-scorer"


@pytest.mark.parametrize("text", ["---\n", "# only a comment\n", ""], ids=["null-document", "comment-only", "empty"])
def test_a_config_without_content_means_the_default(text: str) -> None:
    loaded = _load(text)
    assert [(p.name, p.scorers) for p in loaded.profiles] == [
        ("default", [("queue-scorer", 2.0), ("kv-cache-utilization-scorer", 2.0), ("prefix-cache-scorer", 3.0)])
    ]


def test_snake_case_keys_are_rejected_as_in_the_reference() -> None:
    problems = _problems("scheduling_profiles: []\n")
    assert any(p.startswith("scheduling_profiles: unknown field") for p in problems), problems


def test_a_plugin_may_not_be_named_total() -> None:
    problems = _problems("plugins:\n- name: total\n  type: queue-scorer\n")
    assert any("reserved" in p for p in problems), problems


def test_a_plugin_of_another_kind_in_a_profile_is_skipped_with_a_warning() -> None:
    # both reference EPPs skip it: the plugin keeps its own role (here: the profile handler)
    loaded = _load(
        """\
        plugins:
        - type: single-profile-handler
        - type: random-picker
        schedulingProfiles:
        - name: p
          plugins: [{pluginRef: single-profile-handler}, {pluginRef: random-picker}]
        """
    )
    [profile] = loaded.profiles
    assert profile.filters == [] and profile.scorers == [] and profile.picker == "random-picker"
    assert loaded.warnings == [
        "schedulingProfiles[0].plugins[0].pluginRef: 'single-profile-handler' (single-profile-handler) is not a "
        "filter, scorer or picker; it does nothing in a profile (as in the reference EPPs): remove it from the profile"
    ]
