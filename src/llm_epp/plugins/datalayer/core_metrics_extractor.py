"""core-metrics-extractor

Scheduling intent:
    Keep every endpoint's `Metrics` current: turn each scraped /metrics page into a new frozen Metrics
    (waiting queue, running requests, KV-cache usage, LoRA adapters, KV-cache geometry) that queue,
    KV-cache, LoRA and saturation plugins read. The engine of an endpoint decides which metric names
    mean what.

Inputs consumed:
    A page from `metrics-data-source`, of which only the sample names of the endpoint's engine mapping
    are parsed; the endpoint label `engineLabelKey` (an unlabeled endpoint uses `EndpointMetadata.engine`
    when that is not the default "vllm", else `defaultEngine`; an unknown engine uses `defaultEngine`).

Configuration:
    engineLabelKey (default "inference.networking.k8s.io/engine-type"): endpoint label naming the engine.
    defaultEngine (default "vllm"): mapping for unlabeled endpoints and unknown engines.
    engineConfigs (list): mappings added to, or replacing by name, the built-in ones (vllm, sglang,
        trtllm-serve, triton-tensorrt-llm). Each has `name` (not empty, not "default") and the specs
        queuedRequestsSpec, runningRequestsSpec, kvUsageSpec, loraSpec, cacheInfoSpec,
        cacheBlockSizeSpec, cacheNumBlocksSpec, plus cacheBlockSizeLabelName / cacheNumBlocksLabelName
        (labels of the cacheInfoSpec series; default block_size / num_gpu_blocks), and customMetrics
        ({attributeKey, metricSpec} list): each a scalar published as a numeric endpoint attribute, under
        `attributeKey` (llm-d-router v0.10's key) and `<attributeKey>/core-metrics-extractor` (the later
        key), for `endpoint-attribute-filter` / `-scorer`. A spec is a PromQL
        instant selector `name{label="value"}` (quotes optional, only `=` matchers); "" or an omitted
        spec disables that signal.

    Per spec the series matching the labels with the largest sample timestamp is used (the first one
    when no sample has a timestamp); for loraSpec the one with the largest value (vLLM sets it to the
    current time). LoRA labels: running_lora_adapters and waiting_lora_adapters (comma lists), max_lora.
    Every signal found updates its field; missing or malformed ones are reported and keep their previous
    value. If any signal was found the result is stamped `update_time = now`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from pydantic import Field, model_validator

from llm_epp.framework import EndpointMetadata, Handle, Metrics, PluginParams, TypedName
from llm_epp.framework.datalayer import Extraction, Sample, ScrapedPage

TYPE = "core-metrics-extractor"
DEFAULT_ENGINE_LABEL = "inference.networking.k8s.io/engine-type"
DEFAULT_ENGINE = "vllm"
RESERVED_ENGINE = "default"

LORA_RUNNING = "running_lora_adapters"
LORA_WAITING = "waiting_lora_adapters"
LORA_MAX = "max_lora"
CACHE_BLOCK_SIZE_LABEL = "block_size"
CACHE_NUM_BLOCKS_LABEL = "num_gpu_blocks"


class CustomMetric(PluginParams):
    """One `customMetrics` entry: a scalar metric published as a numeric endpoint attribute."""

    attribute_key: str = Field(alias="attributeKey", min_length=1)
    metric_spec: str = Field(alias="metricSpec", min_length=1)


class EngineConfig(PluginParams):
    name: str
    queued_requests_spec: str = Field("", alias="queuedRequestsSpec")
    running_requests_spec: str = Field("", alias="runningRequestsSpec")
    kv_usage_spec: str = Field("", alias="kvUsageSpec")
    lora_spec: str = Field("", alias="loraSpec")
    cache_info_spec: str = Field("", alias="cacheInfoSpec")
    cache_block_size_label_name: str = Field("", alias="cacheBlockSizeLabelName")
    cache_num_blocks_label_name: str = Field("", alias="cacheNumBlocksLabelName")
    cache_block_size_spec: str = Field("", alias="cacheBlockSizeSpec")
    cache_num_blocks_spec: str = Field("", alias="cacheNumBlocksSpec")
    custom_metrics: tuple[CustomMetric, ...] = Field((), alias="customMetrics")


BUILTIN_ENGINES: tuple[EngineConfig, ...] = (
    EngineConfig.model_validate(
        {
            "name": "vllm",
            "queuedRequestsSpec": "vllm:num_requests_waiting",
            "runningRequestsSpec": "vllm:num_requests_running",
            "kvUsageSpec": "vllm:kv_cache_usage_perc",
            "loraSpec": "vllm:lora_requests_info",
            "cacheInfoSpec": "vllm:cache_config_info",
        }
    ),
    EngineConfig.model_validate(
        {
            "name": "sglang",
            "queuedRequestsSpec": "sglang:num_queue_reqs",
            "runningRequestsSpec": "sglang:num_running_reqs",
            "kvUsageSpec": "sglang:token_usage",
            "cacheInfoSpec": "sglang:cache_config_info",
            "cacheBlockSizeLabelName": "page_size",
            "cacheNumBlocksLabelName": "num_pages",
        }
    ),
    EngineConfig.model_validate(
        {
            "name": "trtllm-serve",
            "queuedRequestsSpec": "trtllm_num_requests_waiting",
            "runningRequestsSpec": "trtllm_num_requests_running",
            "kvUsageSpec": "trtllm_kv_cache_utilization",
            "cacheBlockSizeSpec": "trtllm_kv_cache_tokens_per_block",
            "cacheNumBlocksSpec": "trtllm_kv_cache_max_blocks",
        }
    ),
    EngineConfig.model_validate(
        {
            "name": "triton-tensorrt-llm",
            "queuedRequestsSpec": "nv_trt_llm_request_metrics{request_type=waiting}",
            "runningRequestsSpec": "nv_trt_llm_request_metrics{request_type=scheduled}",
            "kvUsageSpec": "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}",
            "cacheBlockSizeSpec": "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=tokens_per}",
            "cacheNumBlocksSpec": "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max}",
        }
    ),
)

_SPEC_FIELDS = (
    ("queued_requests_spec", "queuedRequestsSpec"),
    ("running_requests_spec", "runningRequestsSpec"),
    ("kv_usage_spec", "kvUsageSpec"),
    ("lora_spec", "loraSpec"),
    ("cache_info_spec", "cacheInfoSpec"),
    ("cache_block_size_spec", "cacheBlockSizeSpec"),
    ("cache_num_blocks_spec", "cacheNumBlocksSpec"),
)


class Params(PluginParams):
    engine_label_key: str = Field(DEFAULT_ENGINE_LABEL, alias="engineLabelKey")
    default_engine: str = Field(DEFAULT_ENGINE, alias="defaultEngine")
    engine_configs: tuple[EngineConfig, ...] = Field((), alias="engineConfigs")

    @model_validator(mode="after")
    def _check(self) -> Params:
        problems: list[str] = []
        seen: set[str] = set()
        for i, cfg in enumerate(self.engine_configs):
            where = f"engineConfigs[{i}]"
            if not cfg.name:
                problems.append(f"{where}.name: must not be empty")
            elif cfg.name == RESERVED_ENGINE:
                problems.append(f"{where}.name: {RESERVED_ENGINE!r} is reserved")
            elif cfg.name in seen:
                problems.append(f"{where}.name: engine {cfg.name!r} is configured twice")
            seen.add(cfg.name)
            for attr, alias in _SPEC_FIELDS:
                try:
                    parse_spec(getattr(cfg, attr))
                except ValueError as e:
                    problems.append(f"{where}.{alias}: {e}")
            for j, custom in enumerate(cfg.custom_metrics):
                try:
                    parse_spec(custom.metric_spec)
                except ValueError as e:
                    problems.append(f"{where}.customMetrics[{j}].metricSpec: {e}")
            keys = [c.attribute_key for c in cfg.custom_metrics]
            if len(set(keys)) != len(keys):
                problems.append(f"{where}.customMetrics: an attributeKey is listed twice")
        default = self.default_engine or DEFAULT_ENGINE
        if default not in seen and default not in {e.name for e in BUILTIN_ENGINES}:
            problems.append(f"defaultEngine: {default!r} is neither a built-in engine nor in engineConfigs")
        if problems:
            raise ValueError("; ".join(problems))
        return self


@dataclass(frozen=True, slots=True)
class Spec:
    """A PromQL instant selector with equality matchers only: `name{label="value",...}`."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        inner = ",".join(f'{k}="{v}"' for k, v in self.labels)
        return f"{self.name}{{{inner}}}" if inner else self.name


_SPEC = re.compile(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*\Z", re.DOTALL)
_MATCHER = re.compile(
    r"""\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!=|!~|=)\s*"""
    r"""(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)'|([^\s"',}=!~]+))\s*(,|\Z)""",
    re.DOTALL,
)


def parse_spec(text: str) -> Spec | None:
    """`""` → None (disabled). Raises ValueError for anything but `name` or `name{l="v", l2=v2}`."""
    if not text.strip():
        return None
    m = _SPEC.match(text)
    if m is None:
        raise ValueError(f'{text!r} is not a metric selector like name{{label="value"}}')
    name, body = m.group(1), m.group(2)
    labels: list[tuple[str, str]] = []
    pos = 0
    body = (body or "").strip()
    while pos < len(body):
        lm = _MATCHER.match(body, pos)
        if lm is None:
            raise ValueError(f"{text!r}: cannot parse the label matchers")
        if lm.group(2) != "=":
            raise ValueError(f'{text!r}: only equality matchers (label="value") are supported')
        value = next(g for g in (lm.group(3), lm.group(4), lm.group(5)) if g is not None)
        labels.append((lm.group(1), re.sub(r"\\(.)", r"\1", value)))
        pos = lm.end()
    return Spec(name, tuple(labels))


@dataclass(frozen=True, slots=True)
class _Mapping:
    engine: str
    queued: Spec | None
    running: Spec | None
    kv_usage: Spec | None
    lora: Spec | None
    cache_info: Spec | None
    cache_block_size_label: str
    cache_num_blocks_label: str
    cache_block_size: Spec | None
    cache_num_blocks: Spec | None
    custom: tuple[tuple[str, Spec], ...]
    families: frozenset[str]

    @classmethod
    def build(cls, cfg: EngineConfig) -> _Mapping:
        specs = {attr: parse_spec(getattr(cfg, attr)) for attr, _ in _SPEC_FIELDS}
        custom = [(c.attribute_key, spec) for c in cfg.custom_metrics if (spec := parse_spec(c.metric_spec))]
        return cls(
            engine=cfg.name,
            queued=specs["queued_requests_spec"],
            running=specs["running_requests_spec"],
            kv_usage=specs["kv_usage_spec"],
            lora=specs["lora_spec"],
            cache_info=specs["cache_info_spec"],
            cache_block_size_label=cfg.cache_block_size_label_name or CACHE_BLOCK_SIZE_LABEL,
            cache_num_blocks_label=cfg.cache_num_blocks_label_name or CACHE_NUM_BLOCKS_LABEL,
            cache_block_size=specs["cache_block_size_spec"],
            cache_num_blocks=specs["cache_num_blocks_spec"],
            custom=tuple(custom),
            families=frozenset(s.name for s in (*specs.values(), *(c for _, c in custom)) if s is not None),
        )


def _matching(spec: Spec, page: ScrapedPage, problems: list[str]) -> list[Sample]:
    samples = page.samples.get(spec.name)
    if not samples:
        problems.append(f"metric family {spec.name!r} not found")
        return []
    if not spec.labels:
        return list(samples)
    found = [s for s in samples if all(s.labels.get(k) == v for k, v in spec.labels)]
    if not found:
        problems.append(f"no {spec.name!r} series matches {spec}")
    return found


def _latest(spec: Spec, page: ScrapedPage, problems: list[str]) -> Sample | None:
    """The matching series with the largest timestamp; the first one if none has a timestamp."""
    best: Sample | None = None
    best_ts = -math.inf
    for s in _matching(spec, page, problems):
        ts = s.timestamp_ms if s.timestamp_ms is not None else 0
        if ts > best_ts:
            best, best_ts = s, ts
    return best


def _newest_by_value(spec: Spec, page: ScrapedPage, problems: list[str]) -> Sample | None:
    """The matching series with the largest value (vLLM's LoRA info gauge holds its update time)."""
    matching = _matching(spec, page, problems)
    best: Sample | None = None
    for s in matching:
        if not math.isnan(s.value) and (best is None or s.value > best.value):
            best = s
    if matching and best is None:
        problems.append(f"{spec.name!r} has no series with a numeric value")
    return best


def _value(spec: Spec, page: ScrapedPage, problems: list[str]) -> float | None:
    """The finite value of the selected series, or None (with the reason in `problems`)."""
    sample = _latest(spec, page, problems)
    if sample is None:
        return None
    if math.isfinite(sample.value):
        return sample.value
    problems.append(f"{spec.name!r} value {sample.value} is not a finite number")
    return None


def _label_int(sample: Sample, label: str, problems: list[str]) -> int | None:
    raw = sample.labels.get(label, "")
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        problems.append(f"{sample.name!r} label {label}={raw!r} is not an integer")
        return None


def _adapters(csv: str) -> frozenset[str]:
    return frozenset(name for part in csv.split(",") if (name := part.strip()))


class CoreMetricsExtractor:
    def __init__(
        self,
        name: str = TYPE,
        engine_label_key: str = DEFAULT_ENGINE_LABEL,
        default_engine: str = DEFAULT_ENGINE,
        engine_configs: tuple[EngineConfig, ...] = (),
    ) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.engine_label_key = engine_label_key or DEFAULT_ENGINE_LABEL
        user = {c.name: c for c in engine_configs}
        merged = [*engine_configs, *(c for c in BUILTIN_ENGINES if c.name not in user)]
        self._mappings: dict[str, _Mapping] = {c.name: _Mapping.build(c) for c in merged}
        default_name = default_engine or DEFAULT_ENGINE
        if default_name not in self._mappings:
            raise ValueError(f"defaultEngine {default_name!r} is not configured")
        self.default_engine = default_name
        self._default = self._mappings[default_name]

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    @property
    def engines(self) -> tuple[str, ...]:
        return tuple(self._mappings)

    def engine_of(self, endpoint: EndpointMetadata) -> str:
        """The mapping used for `endpoint` (see the module docstring for the rules)."""
        return self._mapping(endpoint).engine

    def _mapping(self, endpoint: EndpointMetadata) -> _Mapping:
        engine = endpoint.labels.get(self.engine_label_key) or (
            endpoint.engine if endpoint.engine != DEFAULT_ENGINE else ""
        )
        return self._mappings.get(engine, self._default) if engine else self._default

    def families(self, endpoint: EndpointMetadata) -> frozenset[str]:
        return self._mapping(endpoint).families

    def extract(self, page: ScrapedPage, endpoint: EndpointMetadata, current: Metrics, now: float) -> Extraction:
        m = self._mapping(endpoint)
        problems: list[str] = []
        changes: dict[str, Any] = {}
        for spec, attr in ((m.queued, "waiting_queue_size"), (m.running, "running_requests")):
            if spec is not None and (value := _value(spec, page, problems)) is not None:
                changes[attr] = int(value)
        if m.kv_usage is not None and (value := _value(m.kv_usage, page, problems)) is not None:
            changes["kv_cache_usage"] = value
        if m.lora is not None and (sample := _newest_by_value(m.lora, page, problems)) is not None:
            changes["active_models"] = _adapters(sample.labels.get(LORA_RUNNING, ""))
            changes["waiting_models"] = _adapters(sample.labels.get(LORA_WAITING, ""))
            if (max_lora := _label_int(sample, LORA_MAX, problems)) is not None:
                changes["max_active_models"] = max_lora
        if m.cache_info is not None and (sample := _latest(m.cache_info, page, problems)) is not None:
            changes["cache_block_size"] = _label_int(sample, m.cache_block_size_label, problems) or 0
            if (blocks := _label_int(sample, m.cache_num_blocks_label, problems)) is not None:
                changes["cache_num_blocks"] = blocks
        for spec, attr in ((m.cache_block_size, "cache_block_size"), (m.cache_num_blocks, "cache_num_blocks")):
            if spec is not None and (value := _value(spec, page, problems)) is not None:
                changes[attr] = int(value)
        attributes: dict[str, object] = {}
        for key, spec in m.custom:
            custom_problems: list[str] = []
            if (value := _value(spec, page, custom_problems)) is not None:
                attributes[key] = value
                attributes[f"{key}/{TYPE}"] = value
            problems.extend(f"custom metric {key!r}: {p}" for p in custom_problems)
        if not changes and not attributes:
            return Extraction(None, tuple(problems))
        return Extraction(replace(current, update_time=now, **changes), tuple(problems), attributes)


def factory(name: str, params: Params, handle: Handle) -> CoreMetricsExtractor:
    return CoreMetricsExtractor(name, params.engine_label_key, params.default_engine, params.engine_configs)
