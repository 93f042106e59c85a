"""Kubernetes discovery: an InferencePool and its pods become datastore endpoints."""

from llm_epp.k8s.discovery import (
    ACTIVE_PORTS_ANNOTATION,
    DEFAULT_POOL_GROUP,
    POOL_PLURAL,
    POOL_VERSION,
    PoolSpec,
    endpoints_for,
    is_pod_ready,
    pool_spec,
)
from llm_epp.k8s.watcher import PoolWatcher, api_client_from_environment

__all__ = [
    "ACTIVE_PORTS_ANNOTATION",
    "DEFAULT_POOL_GROUP",
    "POOL_PLURAL",
    "POOL_VERSION",
    "PoolSpec",
    "PoolWatcher",
    "api_client_from_environment",
    "endpoints_for",
    "is_pod_ready",
    "pool_spec",
]
