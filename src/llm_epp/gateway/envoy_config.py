"""Envoy bootstrap for the ext_proc gateway in front of the EPP (``llm-epp envoy-config``).

Design: the bootstrap is assembled from small plain-dict builder functions, one per block (admin,
listener + HTTP connection manager, control-header stripping, ext_proc filter, ``epp`` cluster, ``pool``
cluster, ``pool-fallback`` cluster).  Plain dicts read like Envoy's documentation and are exactly what is
printed, so the output diffs cleanly against Envoy examples.  Before anything is printed, :func:`validate`
round-trips the dict through ``google.protobuf.json_format.ParseDict`` into the xds-protos ``Bootstrap``
message (every extension type used in a ``typed_config`` is imported below), which rejects misspelt
fields and enum names in milliseconds without an Envoy binary.  Envoy's own cross-field rules (for
example "FULL_DUPLEX_STREAMED needs trailer mode SEND") are enforced by ``envoy --mode validate``, which
the test suite runs over every variant.  envoy-data-plane is deliberately not used (slow import, large
dependency set, no extra checks that matter here).
"""

from __future__ import annotations

import argparse
import copy
import ipaddress
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# Every message that appears behind an ``@type`` must be registered in the default descriptor pool
# before ``ParseDict`` can resolve it; importing the generated modules does that.
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2  # noqa: F401
from envoy.extensions.filters.http.header_mutation.v3 import header_mutation_pb2 as _filter_header_mutation  # noqa: F401
from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401
from envoy.extensions.filters.network.http_connection_manager.v3 import (  # noqa: F401
    http_connection_manager_pb2,
)
from envoy.extensions.http.early_header_mutation.header_mutation.v3 import (  # noqa: F401
    header_mutation_pb2,
)
from envoy.extensions.resource_monitors.downstream_connections.v3 import (  # noqa: F401
    downstream_connections_pb2,
)
from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2  # noqa: F401
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2  # noqa: F401
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401
from google.protobuf import json_format

from llm_epp.options import Options, worker_ports

__all__ = [
    "DESTINATION_HEADER",
    "EPP_CLUSTER",
    "FALLBACK_CLUSTER",
    "LB_NAMESPACE",
    "POOL_CLUSTER",
    "SERVED_HEADER",
    "SUBSET_HINT_NAMESPACE",
    "EnvoyConfigOptions",
    "add_arguments",
    "build_bootstrap",
    "options_from_args",
    "parse_endpoint",
    "render",
    "run",
    "validate",
]

DESTINATION_HEADER = "x-gateway-destination-endpoint"
SERVED_HEADER = "x-gateway-destination-endpoint-served"
LB_NAMESPACE = "envoy.lb"
SUBSET_HINT_NAMESPACE = "envoy.lb.subset_hint"
EPP_CLUSTER = "epp"
POOL_CLUSTER = "pool"
FALLBACK_CLUSTER = "pool-fallback"

_TYPE = "type.googleapis.com/"
_HCM_TYPE = _TYPE + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_EXT_PROC_TYPE = _TYPE + "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
_EARLY_HEADER_MUTATION_TYPE = _TYPE + "envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation"
_HEADER_MUTATION_TYPE = _TYPE + "envoy.extensions.filters.http.header_mutation.v3.HeaderMutation"
_ROUTER_TYPE = _TYPE + "envoy.extensions.filters.http.router.v3.Router"
_HTTP_OPTIONS_KEY = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
_HTTP_OPTIONS_TYPE = _TYPE + _HTTP_OPTIONS_KEY
_UPSTREAM_TLS_TYPE = _TYPE + "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"
_PREVIOUS_HOSTS_TYPE = _TYPE + "envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
_DOWNSTREAM_CONNECTIONS_TYPE = (
    _TYPE + "envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig"
)

FAILURE_MODES = ("FailOpen", "FailClose")
REQUEST_BODY_MODES = ("FULL_DUPLEX_STREAMED", "BUFFERED")
RESPONSE_BODY_MODES = ("NONE", "FULL_DUPLEX_STREAMED")
RESPONSE_HEADER_MODES = ("SEND", "SKIP")
ROUTING_MODES = ("metadata", "header")
POOL_PROTOCOLS = ("http", "h2c")


# Envoy's default circuit breakers cap a cluster at 1024 concurrent requests; every in-flight LLM request
# holds one ext_proc stream and one upstream request, so lift the caps well above realistic concurrency.
def _circuit_breakers() -> dict[str, Any]:
    limit = 100000
    return {"thresholds": [{"max_connections": limit, "max_pending_requests": limit, "max_requests": limit}]}


_CONNECT_TIMEOUT = "1s"
_MAX_DOWNSTREAM_CONNECTIONS = 50000
_MAX_MESSAGE_TIMEOUT_S = 3600.0  # proto-validate limit on ExternalProcessor.message_timeout


@dataclass(frozen=True)
class EnvoyConfigOptions:
    """Inputs of :func:`build_bootstrap`; invalid values raise ``ValueError`` on construction."""

    listen_address: str = "127.0.0.1"
    listen_port: int = 8081
    admin_address: str = "127.0.0.1"
    admin_port: int = 19000
    epp_address: str = "127.0.0.1"
    epp_port: int = 9002
    epp_ports: tuple[int, ...] = ()  # every ext_proc port of the EPP (`serve --workers N`); () = epp_port alone
    epp_tls: bool = True
    failure_mode: str = "FailOpen"
    request_body_mode: str = "FULL_DUPLEX_STREAMED"
    response_body_mode: str = "NONE"
    response_header_mode: str = "SEND"
    routing: str = "metadata"
    pool_protocol: str = "http"
    fallback_endpoints: tuple[str, ...] = ()
    no_epp: bool = False
    message_timeout_s: float = 1000.0
    grpc_timeout_s: float = 10.0
    route_timeout_s: float = 86400.0
    max_request_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        _choice("failure_mode", self.failure_mode, FAILURE_MODES)
        _choice("request_body_mode", self.request_body_mode, REQUEST_BODY_MODES)
        _choice("response_body_mode", self.response_body_mode, RESPONSE_BODY_MODES)
        _choice("response_header_mode", self.response_header_mode, RESPONSE_HEADER_MODES)
        _choice("routing", self.routing, ROUTING_MODES)
        _choice("pool_protocol", self.pool_protocol, POOL_PROTOCOLS)
        for name in ("listen_port", "admin_port", "epp_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535:
                raise ValueError(f"{name} must be in 0..65535, got {port}")
        for name in ("listen_address", "admin_address", "epp_address"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")
        for endpoint in self.fallback_endpoints:
            parse_endpoint(endpoint)
        for port in self.epp_ports:
            if not 0 < port <= 65535:
                raise ValueError(f"EPP worker ports must be in 1..65535, got {port}")
        if self.no_epp and not self.fallback_endpoints:
            raise ValueError("no_epp (--no-epp) needs fallback endpoints (--endpoints ip:port,...)")
        if not 0 < self.message_timeout_s <= _MAX_MESSAGE_TIMEOUT_S:
            raise ValueError(f"message timeout must be in (0, 3600] seconds, got {self.message_timeout_s}")
        for name in ("grpc_timeout_s", "route_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if not 0 < self.max_request_bytes < 2**32:
            raise ValueError(f"max_request_bytes must be in 1..{2**32 - 1}")


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """Split ``"ip:port"``, ``"host:port"`` or ``"[v6]:port"``; raise ``ValueError`` if malformed."""
    text = endpoint.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"endpoint {endpoint!r} is not in the form ip:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not isinstance(_ip_or_none(host), ipaddress.IPv6Address):
            raise ValueError(f"endpoint {endpoint!r}: {host!r} is not an IPv6 address")
    elif ":" in host:
        raise ValueError(f"endpoint {endpoint!r}: write IPv6 addresses as [addr]:port")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f"endpoint {endpoint!r}: port must be in 1..65535")
    return host, port


def _ip_or_none(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _duration(seconds: float) -> str:
    """Proto3 JSON duration string: ``10s``, ``0.25s``."""
    text = f"{seconds:.9f}".rstrip("0").rstrip(".")
    return f"{text}s"


def _socket_address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _load_assignment(cluster_name: str, endpoints: list[tuple[str, int]]) -> dict[str, Any]:
    return {
        "cluster_name": cluster_name,
        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _socket_address(h, p)}} for h, p in endpoints]}],
    }


def _static_or_dns(hosts: list[str]) -> dict[str, Any]:
    if all(_ip_or_none(h) is not None for h in hosts):
        return {"type": "STATIC"}
    return {"type": "STRICT_DNS", "dns_lookup_family": "V4_PREFERRED"}


# ---------------------------------------------------------------------------------------------- blocks


def admin_block(opts: EnvoyConfigOptions) -> dict[str, Any]:
    return {"address": _socket_address(opts.admin_address, opts.admin_port)}


def overload_manager_block() -> dict[str, Any]:
    """A global downstream connection cap (Envoy warns at startup when none is configured)."""
    return {
        "resource_monitors": [
            {
                "name": "envoy.resource_monitors.global_downstream_max_connections",
                "typed_config": {
                    "@type": _DOWNSTREAM_CONNECTIONS_TYPE,
                    "max_active_downstream_connections": _MAX_DOWNSTREAM_CONNECTIONS,
                },
            }
        ]
    }


def strip_control_headers() -> dict[str, Any]:
    """HCM early header mutation that removes client-sent routing headers.

    Early header mutations run before route selection and before any HTTP filter, so a client can
    never steer a request: not through the ORIGINAL_DST header, and not by making the "EPP decided"
    route match while the EPP is down (FailOpen).  The ``envoy.filters.http.header_mutation`` HTTP
    filter is not enough for the latter: the route is resolved (and cached) when the first filter asks
    for its per-route config, i.e. before the filter removes the header.
    """
    return {
        "name": "envoy.http.early_header_mutation.header_mutation",
        "typed_config": {
            "@type": _EARLY_HEADER_MUTATION_TYPE,
            "mutations": [{"remove": DESTINATION_HEADER}, {"remove": SERVED_HEADER}],
        },
    }


def strip_served_header() -> dict[str, Any]:
    """HTTP filter that removes the served-endpoint header from responses to clients.

    The route adds the header for the EPP. Listed before ext_proc, this filter sees responses after ext_proc
    (response filters run in reverse order), so the EPP still reads the header, and a pod address never
    reaches a client, also when the EPP is down (FailOpen) or skips response headers."""
    return {
        "name": "envoy.filters.http.header_mutation",
        "typed_config": {
            "@type": _HEADER_MUTATION_TYPE,
            "mutations": {"response_mutations": [{"remove": SERVED_HEADER}]},
        },
    }


def ext_proc_filter(opts: EnvoyConfigOptions) -> dict[str, Any]:
    return {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": _EXT_PROC_TYPE,
            "grpc_service": {
                "envoy_grpc": {"cluster_name": EPP_CLUSTER},
                "timeout": _duration(opts.grpc_timeout_s),
            },
            "failure_mode_allow": opts.failure_mode == "FailOpen",
            "message_timeout": _duration(opts.message_timeout_s),
            "processing_mode": {
                "request_header_mode": "SEND",
                "request_body_mode": opts.request_body_mode,
                # Envoy rejects FULL_DUPLEX_STREAMED unless the matching trailer mode is SEND.
                "request_trailer_mode": "SEND",
                "response_header_mode": opts.response_header_mode,
                "response_body_mode": opts.response_body_mode,
                # SEND is required with FULL_DUPLEX_STREAMED, and with body NONE it keeps the ext_proc stream
                # open until the response ends (SKIP closes it right after response headers), so the EPP
                # learns when the request really completed.
                "response_trailer_mode": "SEND",
            },
            "metadata_options": {
                # Without receiving_namespaces Envoy drops the EPP's envoy.lb dynamic metadata.
                "receiving_namespaces": {"untyped": [LB_NAMESPACE]},
                "forwarding_namespaces": {"untyped": [LB_NAMESPACE, SUBSET_HINT_NAMESPACE]},
            },
        },
    }


def router_filter() -> dict[str, Any]:
    return {"name": "envoy.filters.http.router", "typed_config": {"@type": _ROUTER_TYPE}}


# Retries of a request whose bytes never reached a model server (connect failure, refused stream, reset
# before the request was sent), each on another host. Envoy retries inside the router filter: the ext_proc
# filter does not run again, so a retry cannot re-ask the EPP, and on the `pool` cluster (ORIGINAL_DST, the
# host comes from the EPP's decision) it would hit the same dead pod. They are therefore set only on routes
# to a round-robin cluster (the fallback list, and --no-epp), together with outlier detection there.
_RETRY_ON = "connect-failure,refused-stream,reset-before-request"


def retry_policy() -> dict[str, Any]:
    return {
        "retry_on": _RETRY_ON,
        "num_retries": 2,
        "retry_host_predicate": [
            {"name": "envoy.retry_host_predicates.previous_hosts", "typed_config": {"@type": _PREVIOUS_HOSTS_TYPE}}
        ],
        "host_selection_retry_max_attempts": 5,
    }


def outlier_detection() -> dict[str, Any]:
    """Ejects a round-robin host at its first connect failure (local origin), for 5 s doubling up to 60 s,
    so a dead pod on the fallback list stops getting traffic; 5xx answers eject nothing."""
    return {
        "split_external_local_origin_errors": True,
        "consecutive_local_origin_failure": 1,
        "enforcing_consecutive_local_origin_failure": 100,
        "consecutive_5xx": 1000000,
        "enforcing_consecutive_5xx": 0,
        "enforcing_consecutive_gateway_failure": 0,
        "enforcing_success_rate": 0,
        "enforcing_local_origin_success_rate": 0,
        "interval": "1s",
        "base_ejection_time": "5s",
        "max_ejection_time": "60s",
        "max_ejection_percent": 50,
    }


def _route(name: str, match: dict[str, Any], cluster: str, opts: EnvoyConfigOptions) -> dict[str, Any]:
    action: dict[str, Any] = {
        "cluster": cluster,
        "timeout": _duration(opts.route_timeout_s),
        "idle_timeout": _duration(opts.route_timeout_s),
    }
    if cluster != POOL_CLUSTER or opts.no_epp:
        action["retry_policy"] = retry_policy()
    return {
        "name": name,
        "match": match,
        "route": action,
        # Tells the EPP (on response_headers) which endpoint actually served the request.
        "response_headers_to_add": [
            {
                "header": {"key": SERVED_HEADER, "value": "%UPSTREAM_HOST%"},
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
            }
        ],
    }


def _picked_match(opts: EnvoyConfigOptions) -> dict[str, Any]:
    """Match only requests for which the EPP named an endpoint."""
    if opts.routing == "metadata":
        return {
            "prefix": "/",
            "dynamic_metadata": [
                {
                    "filter": LB_NAMESPACE,
                    "path": [{"key": DESTINATION_HEADER}],
                    "value": {"present_match": True},
                }
            ],
        }
    return {"prefix": "/", "headers": [{"name": DESTINATION_HEADER, "present_match": True}]}


def routes_block(opts: EnvoyConfigOptions) -> list[dict[str, Any]]:
    if opts.no_epp:
        return [_route("round-robin", {"prefix": "/"}, POOL_CLUSTER, opts)]
    if not opts.fallback_endpoints:
        return [_route("epp-picked", {"prefix": "/"}, POOL_CLUSTER, opts)]
    # The EPP answers with clear_route_cache: true, so routes are matched again after its decision.
    return [
        _route("epp-picked", _picked_match(opts), POOL_CLUSTER, opts),
        _route("fallback", {"prefix": "/"}, FALLBACK_CLUSTER, opts),
    ]


def http_connection_manager(opts: EnvoyConfigOptions) -> dict[str, Any]:
    hcm: dict[str, Any] = {"@type": _HCM_TYPE, "stat_prefix": "gateway", "codec_type": "AUTO"}
    if opts.no_epp:
        http_filters = [strip_served_header(), router_filter()]
    else:
        hcm["early_header_mutation_extensions"] = [strip_control_headers()]
        http_filters = [strip_served_header(), ext_proc_filter(opts), router_filter()]
    return {
        **hcm,
        "route_config": {
            "name": "gateway",
            "virtual_hosts": [{"name": "inference-pool", "domains": ["*"], "routes": routes_block(opts)}],
        },
        "http_filters": http_filters,
    }


def listener_block(opts: EnvoyConfigOptions) -> dict[str, Any]:
    listener: dict[str, Any] = {
        "name": "gateway",
        "address": _socket_address(opts.listen_address, opts.listen_port),
    }
    if not opts.no_epp and opts.request_body_mode == "BUFFERED":
        # BUFFERED bodies above the 1 MiB default would be answered with 413.
        listener["per_connection_buffer_limit_bytes"] = opts.max_request_bytes
    listener["filter_chains"] = [
        {
            "filters": [
                {
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": http_connection_manager(opts),
                }
            ]
        }
    ]
    return listener


def epp_cluster(opts: EnvoyConfigOptions) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": EPP_CLUSTER,
        **_static_or_dns([opts.epp_address]),
        "connect_timeout": _CONNECT_TIMEOUT,
        "circuit_breakers": _circuit_breakers(),
        # gRPC needs HTTP/2 to the upstream.
        "typed_extension_protocol_options": {
            _HTTP_OPTIONS_KEY: {
                "@type": _HTTP_OPTIONS_TYPE,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        },
        # One endpoint per EPP worker process: Envoy opens a connection to each from every worker thread and
        # round-robins the ext_proc streams over them, so the processes share the load evenly.
        "load_assignment": _load_assignment(
            EPP_CLUSTER, [(opts.epp_address, port) for port in (opts.epp_ports or (opts.epp_port,))]
        ),
    }
    if opts.failure_mode == "FailOpen":
        cluster.update(_epp_fail_open_health())
    if opts.epp_tls:
        tls: dict[str, Any] = {
            "@type": _UPSTREAM_TLS_TYPE,
            # Empty validation context: the EPP's self-signed certificate is accepted.
            "common_tls_context": {"alpn_protocols": ["h2"], "validation_context": {}},
        }
        if _ip_or_none(opts.epp_address) is None:
            tls["sni"] = opts.epp_address
        cluster["transport_socket"] = {"name": "envoy.transport_sockets.tls", "typed_config": tls}
    return cluster


def _epp_fail_open_health() -> dict[str, Any]:
    """Make an unreachable EPP fail fast so that FailOpen really fails open.

    With a FULL_DUPLEX_STREAMED request body Envoy can fail open only until the first body chunk is
    handed to the ext_proc stream.  Connecting to the EPP is asynchronous, so with a dead EPP the
    "connection refused" usually arrives after that point and the request gets a 500 despite
    ``failure_mode_allow``.  A TCP health check (plus outlier ejection on connect failures) marks
    the EPP unhealthy, and with a zero panic threshold Envoy then fails the ext_proc stream at once,
    before any body is sent, so the request continues without an EPP decision.
    """
    return {
        "health_checks": [
            {
                "timeout": "1s",
                "interval": "1s",
                "no_traffic_interval": "1s",
                "unhealthy_threshold": 1,
                "healthy_threshold": 1,
                "tcp_health_check": {},
            }
        ],
        "common_lb_config": {"healthy_panic_threshold": {"value": 0}},
        "outlier_detection": {
            "split_external_local_origin_errors": True,
            "consecutive_local_origin_failure": 1,
            "enforcing_consecutive_local_origin_failure": 100,
            "enforcing_consecutive_5xx": 0,
            "enforcing_consecutive_gateway_failure": 0,
            "enforcing_success_rate": 0,
            "enforcing_local_origin_success_rate": 0,
            "interval": "1s",
            "base_ejection_time": "1s",
            "max_ejection_time": "5s",
            "max_ejection_percent": 100,
        },
    }


def pool_cluster(opts: EnvoyConfigOptions) -> dict[str, Any]:
    """ORIGINAL_DST cluster: connects to whichever ip:port the EPP named."""
    if opts.routing == "metadata":
        lb_config: dict[str, Any] = {
            "metadata_key": {"key": LB_NAMESPACE, "path": [{"key": DESTINATION_HEADER}]},
        }
    else:
        lb_config = {"use_http_header": True, "http_header_name": DESTINATION_HEADER}
    cluster: dict[str, Any] = {
        "name": POOL_CLUSTER,
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": _CONNECT_TIMEOUT,
        "circuit_breakers": _circuit_breakers(),
        "original_dst_lb_config": lb_config,
    }
    return _with_pool_protocol(cluster, opts)


def _with_pool_protocol(cluster: dict[str, Any], opts: EnvoyConfigOptions) -> dict[str, Any]:
    """HTTP/2 cleartext to the model servers when they speak gRPC (InferencePool appProtocol
    kubernetes.io/h2c); Envoy's default, HTTP/1.1, otherwise."""
    if opts.pool_protocol == "h2c":
        cluster["typed_extension_protocol_options"] = {
            _HTTP_OPTIONS_KEY: {"@type": _HTTP_OPTIONS_TYPE, "explicit_http_config": {"http2_protocol_options": {}}}
        }
    return cluster


def round_robin_cluster(name: str, endpoints: tuple[str, ...]) -> dict[str, Any]:
    parsed = [parse_endpoint(e) for e in endpoints]
    return {
        "name": name,
        **_static_or_dns([h for h, _ in parsed]),
        "lb_policy": "ROUND_ROBIN",
        "connect_timeout": _CONNECT_TIMEOUT,
        "circuit_breakers": _circuit_breakers(),
        "outlier_detection": outlier_detection(),
        "load_assignment": _load_assignment(name, parsed),
    }


def build_bootstrap(opts: EnvoyConfigOptions) -> dict[str, Any]:
    """The whole Envoy bootstrap as a plain dict (snake_case field names, durations as strings)."""
    if opts.no_epp:
        clusters = [_with_pool_protocol(round_robin_cluster(POOL_CLUSTER, opts.fallback_endpoints), opts)]
    else:
        clusters = [epp_cluster(opts), pool_cluster(opts)]
        if opts.fallback_endpoints:
            clusters.append(_with_pool_protocol(round_robin_cluster(FALLBACK_CLUSTER, opts.fallback_endpoints), opts))
    return {
        "admin": admin_block(opts),
        "static_resources": {"listeners": [listener_block(opts)], "clusters": clusters},
        "overload_manager": overload_manager_block(),
    }


def validate(doc: dict[str, Any]) -> None:
    """Parse ``doc`` into the xds-protos ``Bootstrap``; ``ValueError`` names the offending field."""
    try:
        # ParseDict re-inserts "@type" keys at the end of Any dicts; keep the caller's dict untouched.
        json_format.ParseDict(copy.deepcopy(doc), bootstrap_pb2.Bootstrap())
    except json_format.ParseError as exc:
        # Keep the field path; drop protobuf's long "Available Fields" listing.
        message = str(exc).split("\n Available Fields", 1)[0].rstrip(".")
        message = re.sub(r"^(Failed to parse \w+ field: )+", "", message)
        raise ValueError(f"invalid Envoy bootstrap: {message}") from exc


class _NoAliasDumper(yaml.SafeDumper):
    """SafeDumper that writes repeated sub-dicts out in full instead of as YAML anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(doc: dict[str, Any], fmt: str = "yaml") -> str:
    if fmt == "yaml":
        return yaml.dump(doc, Dumper=_NoAliasDumper, sort_keys=False)
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    raise ValueError(f"unknown format {fmt!r} (yaml or json)")


# ------------------------------------------------------------------------------------------------- CLI

_DEFAULTS = EnvoyConfigOptions()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of the ``llm-epp envoy-config`` subcommand."""
    d = _DEFAULTS
    g = parser.add_argument_group("listener and admin")
    g.add_argument("--listen-address", default=d.listen_address, help="gateway listener address")
    g.add_argument("--listen-port", type=int, default=d.listen_port, help="gateway listener port")
    g.add_argument("--admin-address", default=d.admin_address, help="Envoy admin address")
    g.add_argument("--admin-port", type=int, default=d.admin_port, help="Envoy admin port")
    g = parser.add_argument_group("EPP (ext_proc)")
    g.add_argument("--epp-address", default=d.epp_address, help="EPP gRPC address (IP or DNS name)")
    g.add_argument("--epp-port", type=int, default=d.epp_port, help="EPP gRPC port")
    g.add_argument(
        "--epp-workers",
        type=int,
        default=1,
        metavar="N",
        help="the EPP runs with --workers N: its ext_proc ports are --epp-port and the next ports above it "
        "that are not the EPP's health, metrics or Pick API port, as serve chooses them (default 1)",
    )
    epp = Options()
    for flag, default, what in (
        ("--epp-grpc-health-port", epp.grpc_health_port, "--grpc-health-port"),
        ("--epp-metrics-port", epp.metrics_port, "--metrics-port"),
        ("--epp-pick-api-port", epp.pick_api_port, "--pick-api-port"),
    ):
        g.add_argument(
            flag,
            type=int,
            default=default,
            metavar="PORT",
            help=f"with --epp-workers: the EPP's {what}, which its worker ports skip (default %(default)s)",
        )
    g.add_argument(
        "--epp-tls",
        action=argparse.BooleanOptionalAction,
        default=d.epp_tls,
        help="connect to the EPP over TLS without verifying its certificate",
    )
    g.add_argument(
        "--failure-mode",
        choices=FAILURE_MODES,
        default=d.failure_mode,
        help="FailOpen: route without the EPP when it is unreachable; FailClose: answer 500",
    )
    g.add_argument(
        "--request-body-mode",
        choices=REQUEST_BODY_MODES,
        default=d.request_body_mode,
        help="how Envoy sends request bodies to the EPP (default %(default)s)",
    )
    g.add_argument(
        "--response-body-mode",
        choices=RESPONSE_BODY_MODES,
        default=d.response_body_mode,
        help="NONE: fewer round trips, no usage tokens; FULL_DUPLEX_STREAMED: the EPP reads usage tokens",
    )
    g.add_argument(
        "--response-header-mode",
        choices=RESPONSE_HEADER_MODES,
        default=d.response_header_mode,
        help="whether the EPP sees response headers (default %(default)s)",
    )
    g.add_argument(
        "--message-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"ext_proc per-message timeout; it must cover EPP queueing time (default {d.message_timeout_s:g}, "
        "raised to cover the flow-control TTLs of --epp-config)",
    )
    g.add_argument(
        "--epp-config",
        metavar="FILE",
        help="the EPP's EndpointPickerConfig: with the flowControl gate on, the message timeout is set to cover "
        "the longest time a request may wait in its queues",
    )
    g.add_argument(
        "--max-request-bytes",
        type=int,
        default=d.max_request_bytes,
        help="largest request body with --request-body-mode BUFFERED",
    )
    g = parser.add_argument_group("upstream routing")
    g.add_argument(
        "--routing",
        choices=ROUTING_MODES,
        default=d.routing,
        help="how Envoy reads the EPP's choice: envoy.lb dynamic metadata or the request header",
    )
    g.add_argument(
        "--pool-protocol",
        choices=POOL_PROTOCOLS,
        default=d.pool_protocol,
        help="protocol to the model servers: http (HTTP/1.1) or h2c (HTTP/2 cleartext, for gRPC model servers "
        "such as vLLM's gRPC API; the InferencePool appProtocol kubernetes.io/h2c)",
    )
    g.add_argument(
        "--endpoints",
        default="",
        metavar="IP:PORT,...",
        help="fallback endpoints (round robin) used when the EPP made no decision",
    )
    g.add_argument(
        "--no-epp",
        action="store_true",
        help="plain round robin over --endpoints without ext_proc (baseline)",
    )
    g = parser.add_argument_group("output")
    g.add_argument("--format", choices=("yaml", "json"), default="yaml")
    g.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of stdout")


def options_from_args(args: argparse.Namespace) -> EnvoyConfigOptions:
    endpoints = tuple(e.strip() for e in (args.endpoints or "").split(",") if e.strip())
    values = {
        "listen_address": args.listen_address,
        "listen_port": args.listen_port,
        "admin_address": args.admin_address,
        "admin_port": args.admin_port,
        "epp_address": args.epp_address,
        "epp_port": args.epp_port,
        "epp_ports": _worker_ports(
            args.epp_port,
            args.epp_workers,
            (args.epp_grpc_health_port, args.epp_metrics_port, args.epp_pick_api_port),
        ),
        "epp_tls": args.epp_tls,
        "failure_mode": args.failure_mode,
        "request_body_mode": args.request_body_mode,
        "response_body_mode": args.response_body_mode,
        "response_header_mode": args.response_header_mode,
        "routing": args.routing,
        "pool_protocol": args.pool_protocol,
        "fallback_endpoints": endpoints,
        "no_epp": args.no_epp,
        "message_timeout_s": message_timeout_for(args.message_timeout, args.epp_config),
        "max_request_bytes": args.max_request_bytes,
    }
    return EnvoyConfigOptions(**values)


def _worker_ports(port: int, workers: int, other_ports: tuple[int, ...]) -> tuple[int, ...]:
    """The ports `serve --workers` listens on (the same rule: `llm_epp.options.worker_ports`)."""
    if workers < 1:
        raise ValueError(f"--epp-workers must be at least 1, got {workers}")
    if workers == 1:
        return ()  # --epp-port alone (checked with the other options)
    try:
        return worker_ports(port, workers, other_ports)
    except ValueError:
        raise ValueError(f"--epp-port {port} + --epp-workers {workers} runs past port 65535") from None


QUEUE_MARGIN_S = 10.0
"""Time beyond a request's queueing TTL for the EPP to expire or schedule it and answer."""


def message_timeout_for(explicit: float | None, epp_config: str | None) -> float:
    """The ext_proc message timeout: `explicit` (--message-timeout) or the default, checked against (or,
    when not given, raised to) the longest flow-control queueing time of the EPP config. ValueError when
    they cannot agree; a warning on stderr when queueing has no time limit."""
    default = EnvoyConfigOptions.message_timeout_s
    if not epp_config:
        return default if explicit is None else explicit
    from llm_epp.config import ConfigError, load_config
    from llm_epp.framework import NullRecorder
    from llm_epp.plugins import builtin_registry

    try:
        loaded = load_config(epp_config, builtin_registry(), NullRecorder())
    except ConfigError as e:
        raise ValueError(f"--epp-config: {e}") from None
    fc = loaded.flow_control
    if fc is None:
        return default if explicit is None else explicit
    longest = fc.longest_wait()
    if longest is None:
        timeout = explicit if explicit is not None else _MAX_MESSAGE_TIMEOUT_S
        print(
            f"llm-epp envoy-config: warning: {epp_config} lets requests wait in flow control without a time limit "
            f"(defaultRequestTTL / noEndpointRequestTTL unset or 0s); Envoy's message timeout ({timeout:g}s) ends "
            "them instead; set defaultRequestTTL to answer them with 503 first",
            file=sys.stderr,
        )
        return timeout
    needed = longest + QUEUE_MARGIN_S
    if needed > _MAX_MESSAGE_TIMEOUT_S:
        raise ValueError(
            f"--epp-config: flow-control requests may wait {longest:g}s, longer than Envoy's message timeout can "
            f"be ({_MAX_MESSAGE_TIMEOUT_S:g}s with {QUEUE_MARGIN_S:g}s margin); lower defaultRequestTTL / "
            "noEndpointRequestTTL"
        )
    if explicit is None:
        return max(default, needed)
    if explicit < needed:
        raise ValueError(
            f"--message-timeout {explicit:g}s is shorter than the longest flow-control wait of {epp_config} "
            f"({longest:g}s, plus {QUEUE_MARGIN_S:g}s margin): Envoy would end queued requests before the EPP "
            f"answers them; use at least {needed:g}"
        )
    return explicit


def run(args: argparse.Namespace) -> int:
    """Build, validate and print (or write) the bootstrap. 0 = ok, 1 = I/O or internal error, 2 = usage."""
    try:
        opts = options_from_args(args)
    except ValueError as exc:
        print(f"llm-epp envoy-config: error: {exc}", file=sys.stderr)
        return 2
    doc = build_bootstrap(opts)
    try:
        validate(doc)
    except ValueError as exc:  # a bug in the builders, not a user error
        print(f"llm-epp envoy-config: internal error: {exc}", file=sys.stderr)
        return 1
    text = render(doc, args.format)
    if args.format == "yaml":
        text = "# Envoy bootstrap generated by `llm-epp envoy-config`\n" + text
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as exc:
            print(f"llm-epp envoy-config: error: cannot write {args.output}: {exc}", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0
