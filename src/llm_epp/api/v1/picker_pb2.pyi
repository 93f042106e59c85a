from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EndpointSubset(_message.Message):
    __slots__ = ("endpoints",)
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    endpoints: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, endpoints: _Optional[_Iterable[str]] = ...) -> None: ...

class PickRequest(_message.Message):
    __slots__ = ("path", "body", "headers", "subset", "dry_run", "lease_ttl_seconds")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PATH_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    SUBSET_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    path: str
    body: bytes
    headers: _containers.ScalarMap[str, str]
    subset: EndpointSubset
    dry_run: bool
    lease_ttl_seconds: int
    def __init__(self, path: _Optional[str] = ..., body: _Optional[bytes] = ..., headers: _Optional[_Mapping[str, str]] = ..., subset: _Optional[_Union[EndpointSubset, _Mapping]] = ..., dry_run: _Optional[bool] = ..., lease_ttl_seconds: _Optional[int] = ...) -> None: ...

class EndpointScore(_message.Message):
    __slots__ = ("endpoint", "total", "plugins", "name")
    class PluginsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    PLUGINS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    endpoint: str
    total: float
    plugins: _containers.ScalarMap[str, float]
    name: str
    def __init__(self, endpoint: _Optional[str] = ..., total: _Optional[float] = ..., plugins: _Optional[_Mapping[str, float]] = ..., name: _Optional[str] = ...) -> None: ...

class PickResponse(_message.Message):
    __slots__ = ("request_id", "endpoint", "fallbacks", "target_model", "lease_id", "lease_expires_in_seconds", "scores", "rewritten_body")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODEL_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_IN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    REWRITTEN_BODY_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    endpoint: str
    fallbacks: _containers.RepeatedScalarFieldContainer[str]
    target_model: str
    lease_id: str
    lease_expires_in_seconds: int
    scores: _containers.RepeatedCompositeFieldContainer[EndpointScore]
    rewritten_body: bytes
    def __init__(self, request_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., fallbacks: _Optional[_Iterable[str]] = ..., target_model: _Optional[str] = ..., lease_id: _Optional[str] = ..., lease_expires_in_seconds: _Optional[int] = ..., scores: _Optional[_Iterable[_Union[EndpointScore, _Mapping]]] = ..., rewritten_body: _Optional[bytes] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("lease_id", "usage", "success")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    usage: Usage
    success: bool
    def __init__(self, lease_id: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., success: _Optional[bool] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class ListEndpointsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EndpointMetrics(_message.Message):
    __slots__ = ("waiting_queue_size", "running_requests", "kv_cache_usage", "active_lora_adapters", "waiting_lora_adapters", "max_loras", "cache_block_size", "cache_num_blocks")
    WAITING_QUEUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_LORA_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    WAITING_LORA_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    MAX_LORAS_FIELD_NUMBER: _ClassVar[int]
    CACHE_BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    CACHE_NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    waiting_queue_size: int
    running_requests: int
    kv_cache_usage: float
    active_lora_adapters: _containers.RepeatedScalarFieldContainer[str]
    waiting_lora_adapters: _containers.RepeatedScalarFieldContainer[str]
    max_loras: int
    cache_block_size: int
    cache_num_blocks: int
    def __init__(self, waiting_queue_size: _Optional[int] = ..., running_requests: _Optional[int] = ..., kv_cache_usage: _Optional[float] = ..., active_lora_adapters: _Optional[_Iterable[str]] = ..., waiting_lora_adapters: _Optional[_Iterable[str]] = ..., max_loras: _Optional[int] = ..., cache_block_size: _Optional[int] = ..., cache_num_blocks: _Optional[int] = ...) -> None: ...

class EndpointInfo(_message.Message):
    __slots__ = ("name", "namespace", "address", "port", "labels", "engine", "has_metrics", "metrics", "metrics_age_seconds", "in_flight_requests", "in_flight_tokens", "stats", "hostport")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class StatsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    HAS_METRICS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    METRICS_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    HOSTPORT_FIELD_NUMBER: _ClassVar[int]
    name: str
    namespace: str
    address: str
    port: int
    labels: _containers.ScalarMap[str, str]
    engine: str
    has_metrics: bool
    metrics: EndpointMetrics
    metrics_age_seconds: float
    in_flight_requests: int
    in_flight_tokens: int
    stats: _containers.ScalarMap[str, float]
    hostport: str
    def __init__(self, name: _Optional[str] = ..., namespace: _Optional[str] = ..., address: _Optional[str] = ..., port: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., engine: _Optional[str] = ..., has_metrics: _Optional[bool] = ..., metrics: _Optional[_Union[EndpointMetrics, _Mapping]] = ..., metrics_age_seconds: _Optional[float] = ..., in_flight_requests: _Optional[int] = ..., in_flight_tokens: _Optional[int] = ..., stats: _Optional[_Mapping[str, float]] = ..., hostport: _Optional[str] = ...) -> None: ...

class ListEndpointsResponse(_message.Message):
    __slots__ = ("endpoints",)
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    endpoints: _containers.RepeatedCompositeFieldContainer[EndpointInfo]
    def __init__(self, endpoints: _Optional[_Iterable[_Union[EndpointInfo, _Mapping]]] = ...) -> None: ...
