"""Kubernetes discovery (an InferencePool and its pods become datastore endpoints) and leader election."""

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
from llm_epp.k8s.leader import LeaderElector, default_identity, default_lease_name
from llm_epp.k8s.watcher import PoolWatcher, api_client_from_environment

__all__ = [
    "ACTIVE_PORTS_ANNOTATION",
    "DEFAULT_POOL_GROUP",
    "POOL_PLURAL",
    "POOL_VERSION",
    "LeaderElector",
    "PoolSpec",
    "PoolWatcher",
    "api_client_from_environment",
    "default_identity",
    "default_lease_name",
    "endpoints_for",
    "is_pod_ready",
    "pool_spec",
]
