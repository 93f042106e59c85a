"""Prometheus metrics (reference names), gRPC health and logging setup. Implements framework protocols;
only the app wires it in."""

from llm_epp.observability.health import HealthState, add_health_service, start_health_server
from llm_epp.observability.logging import TRACE, VERBOSE, bind_request, clear_request, configure_logging
from llm_epp.observability.metrics import MetricsServer, PrometheusRecorder

__all__ = [
    "TRACE",
    "VERBOSE",
    "HealthState",
    "MetricsServer",
    "PrometheusRecorder",
    "add_health_service",
    "bind_request",
    "clear_request",
    "configure_logging",
    "start_health_server",
]
