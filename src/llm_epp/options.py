"""Options of `llm-epp serve`, with the reference EPP's flag names and defaults."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_GRPC_MAX_MSG_BYTES = 64 << 20  # ext_proc messages carry whole bodies; 0 in the flags means this


@dataclass(frozen=True)
class Options:
    grpc_port: int = 9002
    grpc_health_port: int = 9003
    metrics_port: int = 9090
    bind_address: str = "0.0.0.0"
    secure_serving: bool = True
    cert_path: str = ""
    enable_cert_reload: bool = False
    health_checking: bool = False
    config_file: str = ""
    config_text: str = ""
    endpoints: str = ""
    endpoints_file: str = ""
    pool_name: str = ""
    pool_namespace: str = ""
    pool_group: str = "inference.networking.k8s.io"
    ha_enable_leader_election: bool = False
    endpoint_selector: str = ""
    endpoint_target_ports: str = ""  # comma list, validated by check_options
    max_request_body_bytes: int = 16 << 20
    max_held_request_bytes: int = 256 << 20  # request body bytes held across all streams at once
    emit_endpoint_scores: bool = False
    disable_endpoint_subset_filter: bool = False
    # logging: -v and the controller-runtime zap flags ("" = not given)
    verbosity: int = 2
    json_logs: bool = False
    zap_log_level: str = ""
    zap_stacktrace_level: str = ""
    zap_time_encoding: str = ""
    ports_file: str = ""
    enable_explain: bool = False
    refresh_metrics_interval: float = 0.05
    refresh_prometheus_metrics_interval: float = 5.0
    metrics_staleness_threshold: float = 2.0
    metrics_name_filter: bool = True  # ask model servers for only the samples the extractor reads (name[])
    objectives_file: str = ""
    # deprecated metrics-data-source flags (None = not given; when given they replace the plugin's defaults)
    model_server_metrics_scheme: str | None = None
    model_server_metrics_path: str | None = None
    model_server_metrics_port: int = 0
    model_server_metrics_https_insecure_skip_verify: bool | None = None
    # diagnostics
    tracing: bool = True
    enable_pprof: bool = True
    metrics_endpoint_auth: bool = True
    metrics_cert_dir: str = ""
    metrics_client_ca_file: str = ""
    # gRPC server and TLS
    grpc_max_recv_msg_size: int = 0  # 0: DEFAULT_GRPC_MAX_MSG_BYTES
    grpc_max_send_msg_size: int = 0
    grpc_max_connections: int | None = None  # None: DEFAULT_MAX_CONNECTIONS on asyncio; grpcio has no limit
    grpc_max_streams: int | None = None  # None: DEFAULT_MAX_STREAMS on asyncio (across connections)
    enable_grpc_stream_metrics: bool = False
    tls_min_version: str = ""
    tls_cipher_suites: tuple[str, ...] = ()
    allow_experimental_plugins: bool = False
    # --- direct-routing API access and graceful shutdown ---
    enable_pick_api: bool = False
    pick_api_port: int = 0  # 0: on the ext_proc port (token authentication only)
    pick_api_client_ca_file: str = ""
    pick_api_token_review: bool = False
    pick_api_token_audiences: str = ""  # comma list
    pick_api_allowed_service_accounts: str = ""  # comma list of namespace/name or namespace/*
    pick_api_max_leases: int = 10_000
    pick_api_max_leases_per_caller: int = 1_000
    pick_api_lease_ttl: float = 60.0
    pick_api_max_lease_ttl: float = 600.0
    drain_timeout: float = 30.0
    # ext_proc worker processes over one scheduling state (1 = served by this process)
    workers: int = 1
    # what serves the ext_proc, health and direct-routing API ports: asyncio (HTTP/2 in the event loop) or
    # grpcio; auto = asyncio
    grpc_transport: str = "auto"

    def ext_proc_transport(self) -> str:
        """`asyncio` or `grpcio`: what `grpc_transport` resolves to."""
        return "asyncio" if self.grpc_transport == "auto" else self.grpc_transport

    def other_ports(self) -> tuple[tuple[str, int], ...]:
        """The EPP's listening ports besides ext_proc, with their flags (0 = any free port: none to avoid)."""
        named = (
            ("--grpc-health-port", self.grpc_health_port),
            ("--metrics-port", self.metrics_port),
            ("--pick-api-port", self.pick_api_port),
        )
        return tuple((flag, port) for flag, port in named if port)

    def worker_ports(self) -> tuple[int, ...]:
        """The ext_proc port of each worker process (all 0, any free port, when `grpc_port` is 0). Raises
        ValueError when the range runs past 65535."""
        if not self.grpc_port:
            return (0,) * self.workers
        return worker_ports(self.grpc_port, self.workers, (port for _, port in self.other_ports()))


def worker_ports(first: int, count: int, skip: Iterable[int] = ()) -> tuple[int, ...]:
    """The ext_proc ports of `count` worker processes: `first`, then the next numbers above it that are not in
    `skip` (the EPP's other ports: health, metrics, Pick API). `first` itself is never skipped. `serve --workers`
    and `envoy-config --epp-workers` both use this, so they agree. Raises ValueError past port 65535."""
    avoid = set(skip)
    ports = [first]
    port = first
    while len(ports) < count:
        port += 1
        if port > 65535:
            raise ValueError(f"{count} ports from {first} (skipping {sorted(avoid)}) run past port 65535")
        if port not in avoid:
            ports.append(port)
    return tuple(ports)
