"""Composition root: builds the datastore, discovery, config, scheduler, director and servers, runs them
in one asyncio TaskGroup, and stops gracefully on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import signal
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest

from llm_epp.composition import build_request_path
from llm_epp.config import ConfigError, LoadedConfig
from llm_epp.datalayer import Datastore
from llm_epp.datalayer.discovery import DiscoveryError, DiscoveryFileWatcher
from llm_epp.datalayer.objectives import ObjectivesFileWatcher, ObjectivesStore
from llm_epp.datalayer.runtime import DataLayer, MetricsRuntime, ReachabilityProbe, build_data_layer
from llm_epp.datalayer.static import EndpointsFileWatcher, EndpointSourceError, parse_endpoint_list
from llm_epp.extproc.held import HeldBytes
from llm_epp.extproc.http2_server import DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_STREAMS, ExtProcServer, UnaryMethod
from llm_epp.extproc.servicer import ExtProcServicer
from llm_epp.framework.kvindex import install_kv_index_service
from llm_epp.framework.tracing import NULL_TRACER, Tracer
from llm_epp.kvcache.service import InMemoryKVIndexService
from llm_epp.legacy_flags import apply_legacy_metrics_flags
from llm_epp.observability import (
    HealthState,
    PrometheusRecorder,
    add_health_service,
    configure_logging,
    start_health_server,
)
from llm_epp.observability.encoder_cache_metrics import encoder_cache_sources, register_encoder_cache_metrics
from llm_epp.observability.flowcontrol_metrics import FlowControlMetrics
from llm_epp.observability.known_models import ConfiguredAndServedModels
from llm_epp.observability.kvcache_metrics import register_kv_index_metrics
from llm_epp.observability.logging import level_for_flags, stacktrace_level
from llm_epp.observability.metrics_auth import KubernetesAuthorizer
from llm_epp.observability.metrics_http import CertDirWatch, MetricsHttpServer, server_tls_context
from llm_epp.observability.stream_metrics import StreamMetrics
from llm_epp.observability.tracing import TracingSetupError, build_tracer, shutdown_tracer, with_plugin_spans
from llm_epp.options import DEFAULT_GRPC_MAX_MSG_BYTES, Options
from llm_epp.pickapi import LeaseTable, PickServicer
from llm_epp.pickapi.auth import SERVICE as PICK_SERVICE
from llm_epp.pickapi.auth import Authenticator, AuthSettings, PickApiGuard, TokenReviewer
from llm_epp.pickapi.servicer import LeaseFinisher
from llm_epp.requestcontrol.director import Director
from llm_epp.security.cert_reload import CertReloader, check_pair
from llm_epp.security.server_ssl import ReloadingContext, server_context
from llm_epp.security.tls import CertificateError, load_cert_dir, self_signed
from llm_epp.security.tls_policy import cipher_suites_in_effect, grpc_cipher_list
from llm_epp.stability import experimental_plugin_problem

log = logging.getLogger("llm_epp")

GRPC_SERVER_OPTIONS = (
    ("grpc.so_reuseport", 0),
    ("grpc.max_receive_message_length", DEFAULT_GRPC_MAX_MSG_BYTES),
    ("grpc.max_send_message_length", DEFAULT_GRPC_MAX_MSG_BYTES),
)


def grpc_server_options(opts: Options) -> tuple[tuple[str, int], ...]:
    """`GRPC_SERVER_OPTIONS` with `--grpc-max-recv-msg-size` / `--grpc-max-send-msg-size` when given."""
    given = {
        "grpc.max_receive_message_length": opts.grpc_max_recv_msg_size,
        "grpc.max_send_message_length": opts.grpc_max_send_msg_size,
    }
    return tuple((name, given.get(name) or value) for name, value in GRPC_SERVER_OPTIONS)


DISCOVERY_POOL_NAME = "epp"  # the pool's name with a discovery plugin and no --pool-name, as upstream


class StartupError(Exception):
    """A problem that stops the EPP from starting; the message says how to fix it."""


@dataclass
class Components:
    datastore: Datastore
    recorder: PrometheusRecorder
    config: LoadedConfig
    director: Director
    servicer: ExtProcServicer
    health: HealthState
    file_watcher: EndpointsFileWatcher | None
    pick: PickServicer
    objectives_watcher: ObjectivesFileWatcher | None
    metrics_runtime: MetricsRuntime | None
    objectives: ObjectivesStore
    tracer: Tracer = NULL_TRACER
    data_layer: DataLayer | None = None  # every configured source; metrics_runtime is its metrics part
    discovery: DiscoveryFileWatcher | None = None  # dataLayer.discovery: the endpoints come from its file
    kv_index: InMemoryKVIndexService | None = None
    """The precise prefix-cache indexes the configuration opened (their subscribers run while serving)."""


def build(opts: Options) -> Components:
    """Everything that does not listen on a port. Raises StartupError."""
    datastore = Datastore(pool_name=opts.pool_name or ("standalone" if opts.endpoint_selector else "static"))
    objectives = ObjectivesStore()
    # Model names become metric labels only when a rewrite rule or a pod names them (or once served).
    recorder = PrometheusRecorder(known_models=ConfiguredAndServedModels(objectives, datastore.snapshot))
    try:
        tracer = build_tracer(opts.tracing)
    except TracingSetupError as e:
        raise StartupError(f"--tracing: {e}") from None
    plugin_recorder = with_plugin_spans(recorder, tracer)  # plugin timings also as spans when tracing
    kv_index = InMemoryKVIndexService()  # precise prefix-cache plugins open their indexes here
    install_kv_index_service(kv_index)
    try:
        path = build_request_path(
            recorder=plugin_recorder,
            config_text=opts.config_text,
            config_file=opts.config_file,
            datastore=datastore,
            objectives=objectives,
            disable_subset_filter=opts.disable_endpoint_subset_filter,
            tracer=tracer,
            flow_observer=FlowControlMetrics(recorder.registry, opts.pool_name),
            metrics_lag=opts.refresh_metrics_interval + opts.metrics_staleness_threshold,
        )
    except ConfigError as e:
        raise StartupError(str(e)) from None
    config, director = path.config, path.director
    if problem := experimental_plugin_problem(config.plugin_types, opts.allow_experimental_plugins):
        raise StartupError(problem)
    apply_legacy_metrics_flags(config, opts)
    watcher: EndpointsFileWatcher | None = None
    discovery = _discovery(config, opts, datastore)
    try:
        if discovery is not None:
            log.debug("endpoints from %s", discovery.path)
        elif opts.endpoints:
            datastore.replace_all(parse_endpoint_list(opts.endpoints))
        elif opts.endpoints_file:
            watcher = EndpointsFileWatcher(opts.endpoints_file, datastore)
            watcher.load()
    except EndpointSourceError as e:
        raise StartupError(str(e)) from None
    objectives_watcher: ObjectivesFileWatcher | None = None
    if opts.objectives_file:
        objectives_watcher = ObjectivesFileWatcher(opts.objectives_file, objectives)
        try:
            objectives_watcher.load()
        except ValueError as e:
            raise StartupError(str(e)) from None
    servicer = ExtProcServicer(
        director,
        opts.max_request_body_bytes,
        enable_explain=opts.enable_explain,
        max_held_request_bytes=opts.max_held_request_bytes,
        emit_endpoint_scores=opts.emit_endpoint_scores,
    )
    health = HealthState(synced=datastore.synced, leader_election=opts.ha_enable_leader_election)
    pick = PickServicer(
        director,
        datastore.snapshot,
        plugins=config.plugins.values(),
        leases=LeaseTable(
            LeaseFinisher(director),
            default_ttl_s=opts.pick_api_lease_ttl,
            max_ttl_s=opts.pick_api_max_lease_ttl,
            max_leases=opts.pick_api_max_leases,
            max_leases_per_caller=opts.pick_api_max_leases_per_caller,
        ),
        max_request_body_bytes=opts.max_request_body_bytes,
    )
    try:
        data_layer = build_data_layer(
            datastore,
            [(b.source, b.extractors) for b in config.data_sources],
            refresh_interval=opts.refresh_metrics_interval,
            staleness=opts.metrics_staleness_threshold,
            recorder=recorder,
            errors=recorder,
            refresh_prometheus_interval=opts.refresh_prometheus_metrics_interval,
            name_filter=opts.metrics_name_filter,
        )
    except (TypeError, ValueError) as e:
        raise StartupError(f"dataLayer: {e}") from None
    runtime = data_layer.metrics
    if data_layer.object_events and (discovery is not None or not (opts.pool_name or opts.endpoint_selector)):
        declared = [o for o in data_layer.object_events if o.source.typed_name.name in config.plugins]
        if declared:
            names = ", ".join(str(o.source.typed_name) for o in declared)
            raise StartupError(
                f"dataLayer.sources: {names} watches Kubernetes objects, which needs Kubernetes discovery "
                "(--pool-name or --endpoint-selector, and no dataLayer.discovery plugin); remove the source or run "
                "in a cluster"
            )
        for o in data_layer.object_events:  # added by a plugin for an optional signal (topology-extractor)
            log.info("k8s_notification_source_inactive source=%s: no Kubernetes discovery", o.source.typed_name)
        data_layer.object_events = []
    if kv_index.indexes():
        enabled = any(index.settings.enable_metrics for index in kv_index.indexes())
        register_kv_index_metrics(recorder.registry, kv_index.stats, index_metrics=enabled)
    if encoders := encoder_cache_sources(config.plugins.values()):
        register_encoder_cache_metrics(recorder.registry, encoders)
    return Components(
        datastore,
        recorder,
        config,
        director,
        servicer,
        health,
        watcher,
        pick,
        objectives_watcher,
        runtime,
        objectives,
        tracer,
        data_layer,
        discovery,
        kv_index if kv_index.indexes() else None,
    )


def _discovery(config: LoadedConfig, opts: Options, datastore: Datastore) -> DiscoveryFileWatcher | None:
    """`dataLayer.discovery`: the endpoints come from the plugin's file and Kubernetes discovery does not
    run (as upstream); `--pool-name` / `--pool-namespace` only name the pool. Without one, an endpoint
    source flag is required."""
    flags = [
        flag
        for flag, given in (
            ("--endpoints", opts.endpoints),
            ("--endpoints-file", opts.endpoints_file),
            ("--endpoint-selector", opts.endpoint_selector),
            ("--ha-enable-leader-election", opts.ha_enable_leader_election),
        )
        if given
    ]
    if config.discovery is None:
        if not (flags or opts.pool_name):
            raise StartupError(
                "no endpoint source: give --pool-name NAME or --endpoint-selector k=v (Kubernetes), --endpoints "
                "host:port,..., --endpoints-file FILE, or a dataLayer.discovery plugin (file-discovery) in the "
                "configuration"
            )
        return None
    if flags:
        raise StartupError(
            f"dataLayer.discovery ({config.discovery.typed_name}) supplies the endpoints; remove {', '.join(flags)} "
            "(a discovery plugin runs without Kubernetes discovery or leader election)"
        )
    datastore.pool_name = opts.pool_name or DISCOVERY_POOL_NAME
    watcher = DiscoveryFileWatcher(config.discovery, datastore)
    try:
        watcher.load()
    except DiscoveryError as e:
        raise StartupError(f"dataLayer.discovery: {e}") from None
    log.info(
        "discovery mode: endpoints from %s; Kubernetes-only features (InferencePool, InferenceObjective and "
        "rewrite watches, leader election) are inactive",
        config.discovery.typed_name,
    )
    return watcher


def _tls_pair(opts: Options) -> tuple[bytes, bytes] | None:
    """The ext_proc key pair (PEM certificate, key), or None when ext_proc is served without TLS. Warns about
    TLS flags that have no effect and refuses a pair that does not load or match."""
    if not opts.secure_serving:
        for flag, given in (
            ("--enable-cert-reload", opts.enable_cert_reload),
            ("--tls-min-version", opts.tls_min_version),
            ("--tls-cipher-suites", opts.tls_cipher_suites),
        ):
            if given:
                log.warning("%s has no effect: ext_proc is served without TLS (--secure-serving=false)", flag)
        return None
    if opts.tls_cipher_suites:
        log.info("ext_proc_tls_cipher_suites %s", ",".join(opts.tls_cipher_suites))
    if opts.enable_cert_reload and not opts.cert_path:
        log.warning("--enable-cert-reload has no effect without --cert-path: the certificate is self-signed")
    try:
        cert, key = load_cert_dir(opts.cert_path) if opts.cert_path else self_signed()
        if opts.cert_path:
            check_pair(cert, key)
    except CertificateError as e:
        raise StartupError(str(e)) from None
    return cert, key


def _credentials(opts: Options) -> grpc.ServerCredentials | None:
    """TLS of the ext_proc port served by grpcio."""
    pair = _tls_pair(opts)
    if pair is None:
        return None
    if not cipher_suites_in_effect(opts.tls_cipher_suites):
        raise StartupError(
            "--tls-cipher-suites must be exported (GRPC_SSL_CIPHER_SUITES) before grpc is imported; start the EPP "
            "with the llm-epp command, or call llm_epp.security.tls_policy.apply_cipher_suites first"
        )
    if opts.cert_path and opts.enable_cert_reload:
        try:
            return CertReloader(opts.cert_path).credentials()
        except CertificateError as e:
            raise StartupError(str(e)) from None
    cert, key = pair
    return grpc.ssl_server_credentials([(key, cert)])


def _ssl_context(opts: Options, client_ca: bytes | None = None) -> ssl.SSLContext | None:
    """TLS of a port served in the event loop (`--grpc-transport asyncio`): the same pair and policy as
    `_credentials`, reloaded with `--enable-cert-reload`. With `client_ca` (the direct-routing API's own port)
    TLS is on whatever `--secure-serving` says, and only clients that CA certified complete the handshake."""
    pair = _tls_pair(opts) if client_ca is None else _cert_and_key(opts)
    if pair is None:
        return None
    ciphers = grpc_cipher_list(opts.tls_cipher_suites)
    try:
        if opts.cert_path and opts.enable_cert_reload:
            return ReloadingContext(opts.cert_path, ciphers, client_ca=client_ca).context
        return server_context(*pair, ciphers, client_ca=client_ca)
    except CertificateError as e:
        raise StartupError(str(e)) from None


def ext_proc_server(
    opts: Options,
    process: Any,
    health: HealthState | None,
    stream_metrics: StreamMetrics | None = None,
    *,
    max_held: int,
    unary: Mapping[str, UnaryMethod] | None = None,
) -> ExtProcServer:
    """The event loop's server of the ext_proc port (and of gRPC health on it with `health`), not yet bound.
    What has arrived and is not read yet is bounded by `max_held` (`--max-held-request-bytes`, this process's
    share), apart from the request bodies the servicer keeps."""
    return ExtProcServer(
        process,
        ProcessingRequest.FromString,
        max_recv=opts.grpc_max_recv_msg_size or DEFAULT_GRPC_MAX_MSG_BYTES,
        max_send=opts.grpc_max_send_msg_size or DEFAULT_GRPC_MAX_MSG_BYTES,
        health=health,
        stream_metrics=stream_metrics,
        ssl_context=_ssl_context(opts),
        held=HeldBytes(max_held),
        max_connections=_max_connections(opts),
        max_open_streams=DEFAULT_MAX_STREAMS if opts.grpc_max_streams is None else opts.grpc_max_streams,
        unary=unary,
    )


def _max_connections(opts: Options) -> int:
    return DEFAULT_MAX_CONNECTIONS if opts.grpc_max_connections is None else opts.grpc_max_connections


async def _start_health_server(opts: Options, transport: str, health: HealthState) -> tuple[Any, int]:
    """The plaintext gRPC health port, served by what serves the ext_proc port (`--grpc-transport`): on asyncio
    the process needs no grpcio server and no grpcio threads."""
    if transport != "asyncio":
        return await start_health_server(opts.bind_address, opts.grpc_health_port, health)
    server = ExtProcServer(None, bytes, max_recv=0, max_send=0, health=health, max_connections=_max_connections(opts))
    port = server.bind(opts.bind_address, opts.grpc_health_port)
    await server.start()
    return server, port


def _cert_and_key(opts: Options) -> tuple[bytes, bytes]:
    try:
        return load_cert_dir(opts.cert_path) if opts.cert_path else self_signed()
    except CertificateError as e:
        raise StartupError(str(e)) from None


def _in_cluster_client() -> Any:
    """An ApiClient from the pod's service account, None outside a cluster (the process-wide kubernetes
    configuration is left alone)."""
    from kubernetes import client, config

    cfg = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        return None
    return client.ApiClient(cfg)


def _metrics_server(opts: Options, c: Components, api: Any) -> tuple[MetricsHttpServer, Any]:
    """The metrics port as the flags say (not started), and the ApiClient it made for itself (None if it
    uses discovery's or none). Without a cluster to ask, `--metrics-endpoint-auth` cannot be enforced: the
    port is served unauthenticated with a warning, as the reference does when it runs without Kubernetes."""
    authorizer, own = None, None
    if opts.metrics_endpoint_auth:
        client = api
        if client is None:
            client = own = _in_cluster_client()
        if client is None:
            log.warning(
                "metrics_endpoint_unauthenticated: no Kubernetes API to review tokens with (not in a cluster and "
                "no --pool-name/--endpoint-selector), so /metrics%s is served to anyone who can reach port %d; "
                "pass --metrics-endpoint-auth=false to silence this",
                " and /debug/pprof" if opts.enable_pprof else "",
                opts.metrics_port,
            )
        else:
            authorizer = KubernetesAuthorizer(client)
    tls, watch = None, None
    if opts.metrics_cert_dir:
        try:
            tls = server_tls_context(opts.metrics_cert_dir, opts.metrics_client_ca_file)
        except (OSError, ValueError) as e:
            raise StartupError(f"--metrics-cert-dir {opts.metrics_cert_dir}: cannot use its key pair: {e}") from None
        watch = CertDirWatch(tls, opts.metrics_cert_dir)
    server = MetricsHttpServer(
        c.recorder.registry,
        opts.bind_address,
        opts.metrics_port,
        authorizer=authorizer,
        enable_pprof=opts.enable_pprof,
        tls=tls,
        cert_watch=watch,
    )
    return server, own


def _kubernetes_client(opts: Options) -> Any:
    if not opts.pool_name and not opts.endpoint_selector and not (opts.enable_pick_api and opts.pick_api_token_review):
        return None
    from llm_epp.k8s import api_client_from_environment

    try:
        return api_client_from_environment()
    except Exception as e:  # any credentials problem is a startup error with its reason
        flag = (
            "--pool-name"
            if opts.pool_name
            else "--endpoint-selector"
            if opts.endpoint_selector
            else "--pick-api-token-review"
        )
        raise StartupError(f"{flag} needs Kubernetes credentials (in-cluster or kubeconfig): {e}") from None


def _pick_api_guard(opts: Options, api: Any, leases: LeaseTable) -> PickApiGuard:
    reviewer: TokenReviewer | None = None
    if opts.pick_api_token_review:
        from llm_epp.k8s.tokenreview import KubernetesTokenReviewer

        audiences = [a.strip() for a in opts.pick_api_token_audiences.split(",") if a.strip()]
        reviewer = KubernetesTokenReviewer(api, audiences)
    accounts = tuple(a.strip() for a in opts.pick_api_allowed_service_accounts.split(",") if a.strip())
    try:
        settings = AuthSettings(
            require_client_cert=bool(opts.pick_api_client_ca_file),
            token_reviewer=reviewer,
            allowed_service_accounts=accounts,
        )
    except ValueError as e:
        raise StartupError(str(e)) from None
    return PickApiGuard(Authenticator(settings), leases)


def _pick_api_client_ca(opts: Options) -> bytes:
    try:
        ca = Path(opts.pick_api_client_ca_file).read_bytes()
    except OSError as e:
        raise StartupError(
            f"cannot read --pick-api-client-ca-file {opts.pick_api_client_ca_file}: {e.strerror}"
        ) from None
    if b"-----BEGIN CERTIFICATE-----" not in ca:
        raise StartupError(f"--pick-api-client-ca-file {opts.pick_api_client_ca_file} holds no PEM certificate")
    return ca


def _pick_api_credentials(opts: Options) -> grpc.ServerCredentials | None:
    """The API's own port on grpcio: mTLS when a client CA is given, else the ext_proc port's TLS setting."""
    if not opts.pick_api_client_ca_file:
        return _credentials(opts)
    ca = _pick_api_client_ca(opts)
    cert, key = _cert_and_key(opts)
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)


def _bind(server: ExtProcServer, host: str, port: int, what: str) -> int:
    try:
        return server.bind(host, port)
    except OSError as e:
        raise StartupError(f"cannot listen on {host}:{port} for {what}: {e}") from None


def _pick_api_server(opts: Options, pick: PickServicer, guard: PickApiGuard, transport: str) -> tuple[Any, int]:
    """The direct-routing API's own port (`--pick-api-port`), not yet started, and the port it is bound to."""
    if transport == "asyncio":
        server = ExtProcServer(
            None,
            bytes,
            max_recv=opts.grpc_max_recv_msg_size or DEFAULT_GRPC_MAX_MSG_BYTES,
            max_send=opts.grpc_max_send_msg_size or DEFAULT_GRPC_MAX_MSG_BYTES,
            ssl_context=_ssl_context(opts, _pick_api_client_ca(opts) if opts.pick_api_client_ca_file else None),
            max_connections=_max_connections(opts),
            unary=pick_api_methods(pick, guard),
        )
        return server, _bind(server, opts.bind_address, opts.pick_api_port, "the direct-routing API")
    address = f"{opts.bind_address}:{opts.pick_api_port}"
    grpc_server = grpc.aio.server(options=grpc_server_options(opts), interceptors=(guard,))
    grpc_server.add_generic_rpc_handlers((pick.handler(),))
    creds = _pick_api_credentials(opts)
    try:
        port = grpc_server.add_secure_port(address, creds) if creds else grpc_server.add_insecure_port(address)
    except RuntimeError as e:
        raise StartupError(f"cannot listen on {address} for the direct-routing API: {e}") from None
    return grpc_server, port


def pick_api_methods(pick: PickServicer, guard: PickApiGuard) -> dict[str, UnaryMethod]:
    """The direct-routing API's methods behind its guard, for the asyncio server."""
    return {
        f"/{PICK_SERVICE}/{name}": UnaryMethod(deserialize, guard.guard(name, fn), serialize)
        for name, (deserialize, fn, serialize) in pick.methods().items()
    }


class _Signals:
    """First SIGTERM/SIGINT starts the drain (`stop`); a second one cuts it short (`force`)."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop
        self.force = asyncio.Event()

    def __call__(self) -> None:
        if self.stop.is_set():
            log.info("second stop signal: ending the drain now")
            self.force.set()
        else:
            self.stop.set()


async def _drain(servers: list[Any], health: HealthState, drain_timeout: float, force: asyncio.Event) -> None:
    """The reference's graceful shutdown: report not ready at once (liveness stays serving) and keep
    serving new and in-flight streams for `drain_timeout`, so the gateway moves to another replica
    while nothing is refused; then stop accepting and give in-flight streams up to `drain_timeout`
    more to finish. A second signal ends either phase at once."""
    health.draining = True
    log.info("draining drain_timeout=%.1fs (not ready; still serving)", drain_timeout)
    if drain_timeout > 0 and not force.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(force.wait(), drain_timeout)
    if force.is_set():  # one shutdown only: grpc's core can crash when a second one races the first
        log.info("drain cut short: refusing new streams and ending in-flight streams now")
        await asyncio.gather(*(s.stop(None) for s in servers))
        log.info("stopped")
        return
    grace = drain_timeout
    log.info("drain window over: refusing new streams, in-flight streams get up to %.1fs", grace)
    stopping: asyncio.Future[Any] = asyncio.gather(*(s.stop(grace) for s in servers))
    forced: asyncio.Future[Any] = asyncio.ensure_future(force.wait())
    try:
        await asyncio.wait((stopping, forced), return_when=asyncio.FIRST_COMPLETED)
        if not stopping.done():
            await asyncio.gather(*(s.stop(None) for s in servers))
        await stopping
    finally:
        forced.cancel()
    log.info("stopped")


async def serve(opts: Options, stop: asyncio.Event | None = None) -> None:
    c = build(opts)
    if c.discovery is not None:  # the discovery plugin supplies the endpoints; --pool-name only names the pool
        opts = dataclasses.replace(opts, pool_name="")
    api = _kubernetes_client(opts)  # before any listener starts, so a credentials error leaks nothing
    metrics, metrics_api = _metrics_server(opts, c, api)  # may refuse to start: before any listener too
    stop = stop or asyncio.Event()
    signals = _Signals(stop)
    guard = _pick_api_guard(opts, api, c.pick.leases) if opts.enable_pick_api else None
    shared_guard = guard is not None and not opts.pick_api_port
    interceptors: list[Any] = []
    stream_metrics = StreamMetrics(c.recorder.registry) if opts.enable_grpc_stream_metrics else None
    if stream_metrics is not None:
        interceptors.append(stream_metrics.interceptor())
    if shared_guard:
        interceptors.append(guard)
    address = f"{opts.bind_address}:{opts.grpc_port}"
    transport = opts.ext_proc_transport()
    servers: list[Any] = []  # grpc.aio.Server, ExtProcServer, or the worker pool (same start/stop)
    port = 0
    if opts.workers > 1:  # the workers serve; a TLS setup that cannot load stops the start here, before them
        if transport == "asyncio":
            _ssl_context(opts)
        else:
            _credentials(opts)
    elif transport == "asyncio":
        loop_server = ext_proc_server(
            opts,
            c.servicer.process,
            c.health if opts.health_checking else None,
            stream_metrics,
            max_held=opts.max_held_request_bytes,
            unary=pick_api_methods(c.pick, guard) if shared_guard and guard is not None else None,
        )
        port = _bind(loop_server, opts.bind_address, opts.grpc_port, "ext_proc")
        servers.append(loop_server)
    else:
        creds = _credentials(opts)
        server = grpc.aio.server(options=grpc_server_options(opts), interceptors=interceptors)
        handlers: list[grpc.GenericRpcHandler] = [c.servicer.handler()]
        if shared_guard:
            handlers.append(c.pick.handler())
        server.add_generic_rpc_handlers(tuple(handlers))
        if opts.health_checking:
            add_health_service(server, c.health)
        try:
            port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
        except RuntimeError as e:
            raise StartupError(f"cannot listen on {address} for ext_proc: {e}") from None
        servers.append(server)
    pick_port = port if shared_guard else 0
    if guard is not None and opts.pick_api_port:
        pick_server, pick_port = _pick_api_server(opts, c.pick, guard, transport)
        servers.append(pick_server)
    if guard is not None and opts.pick_api_token_review and not (pick_port != port and opts.pick_api_client_ca_file):
        if not opts.secure_serving:
            log.warning("pick_api_tokens_over_plaintext: bearer tokens travel unencrypted; use --secure-serving")
    try:
        health_server, health_port = await _start_health_server(opts, transport, c.health)
    except (OSError, RuntimeError) as e:
        raise StartupError(f"cannot listen on port {opts.grpc_health_port} for health: {e}") from None
    try:
        metrics.start()
    except OSError as e:
        await health_server.stop(None)
        raise StartupError(f"cannot listen on port {opts.metrics_port} for metrics: {e.strerror}") from None
    for s in servers:
        await s.start()
    pool, fatal = None, list[str]()
    if opts.workers > 1:  # ext_proc is served by worker processes over this process's director
        from llm_epp.workers.pool import WorkerPool, WorkerStartError

        def workers_failed(why: str) -> None:
            fatal.append(why)
            stop.set()

        pool = WorkerPool(opts, c.director, c.health, on_fatal=workers_failed)
        try:
            worker_ports = await pool.start()
        except WorkerStartError as e:
            metrics.stop()
            await health_server.stop(None)
            await asyncio.gather(*(s.stop(None) for s in servers))
            raise StartupError(str(e)) from None
        port = worker_ports[0]
        servers.append(pool)
    # Everything startup built (modules, configuration, plugins, clients) lives as long as the process: keep it
    # out of the collector's full passes, which otherwise walk it all and stall the event loop (tens of ms).
    gc.freeze()
    c.health.synced = c.datastore.synced
    log.info(
        "serving grpc_port=%s transport=%s health_port=%d metrics_port=%d tls=%s endpoints=%d pick_api=%s",
        ",".join(map(str, pool.ports)) if pool is not None else port,
        transport,
        health_port,
        metrics.port,
        opts.secure_serving,
        len(c.datastore),
        f"port {pick_port}" if guard is not None else "off",
    )
    if opts.ports_file:
        ports: dict[str, Any] = {"grpc": port, "health": health_port, "metrics": metrics.port}
        if guard is not None:
            ports["pick"] = pick_port
        if pool is not None:
            ports["grpc_workers"], ports["worker_pids"] = pool.ports, pool.pids
        await asyncio.to_thread(_write_ports, opts.ports_file, ports)
    loop = asyncio.get_running_loop()
    discovery = _KubernetesDiscovery(api, opts, c, loop) if opts.pool_name or opts.endpoint_selector else None
    if discovery is not None:
        discovery.start()
    watchers = _object_watchers(api, opts, c, loop)
    if c.data_layer is not None:
        c.data_layer.start_events()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, signals)
    try:
        async with asyncio.TaskGroup() as tg:
            background = [tg.create_task(c.pick.leases.run())]
            if c.file_watcher is not None:
                background.append(tg.create_task(c.file_watcher.run()))
            if c.discovery is not None:
                background.append(tg.create_task(c.discovery.run()))
            if c.metrics_runtime is not None:
                background.append(tg.create_task(c.metrics_runtime.run()))
            else:  # no metrics scraped: a dead endpoint is still taken out of the candidate set
                background.append(tg.create_task(ReachabilityProbe(c.datastore).run()))
            for source in c.data_layer.sources if c.data_layer is not None else ():
                background.append(tg.create_task(source.run()))
            if c.objectives_watcher is not None:
                background.append(tg.create_task(c.objectives_watcher.run()))
            if c.kv_index is not None:  # KV-event subscribers from the start; stopped when cancelled
                background.append(tg.create_task(c.kv_index.run(c.datastore.snapshot)))
            leadership = None
            if discovery is not None and discovery.elector is not None:
                leadership = tg.create_task(discovery.follow_leadership())
                background.append(leadership)
            await stop.wait()
            log.info("stopping")
            if leadership is not None and discovery is not None:
                # Hand the Lease over at once (a follower becomes ready while this replica drains); the
                # pool this replica knows stays as it is until the end.
                leadership.cancel()
                await discovery.release_leadership()
            await _drain(servers, c.health, opts.drain_timeout, signals.force)  # Release calls still land
            await health_server.stop(None)
            for task in background:  # cancelling the lease sweeper releases every outstanding lease
                task.cancel()
    finally:
        metrics.stop()
        if pool is not None and not pool.stopped:
            await pool.stop(None)
        if metrics_api is not None:
            metrics_api.close()
        shutdown_tracer(c.tracer)  # exports the spans still buffered
        if discovery is not None:
            await discovery.stop()
        for w in watchers:
            await asyncio.to_thread(w.stop)
        if api is not None:
            api.close()
    if fatal:
        raise StartupError(f"stopped: {fatal[0]}")


def _object_watchers(api: Any, opts: Options, c: Components, loop: asyncio.AbstractEventLoop) -> list[Any]:
    """One started watch per `k8s-notification-source` (build() refused them without Kubernetes)."""
    if c.data_layer is None or not c.data_layer.object_events or api is None:
        return []
    from llm_epp.k8s.notifications import ObjectWatcher

    watchers = []
    for events in c.data_layer.object_events:
        w = ObjectWatcher(api, opts.pool_namespace, events.source.gvk, loop, events.dispatch)
        w.start()
        watchers.append(w)
    return watchers


class _KubernetesDiscovery:
    """Watches the InferencePool and its pods; with leader election, only while this replica leads (the
    reference's active-passive HA: followers stay unsynced, so not ready, and the Service routes to the
    leader). The watches run in worker threads and post their changes to the loop."""

    def __init__(self, api: Any, opts: Options, c: Components, loop: asyncio.AbstractEventLoop) -> None:
        from llm_epp.k8s import LeaderElector, default_lease_name

        self._api, self._opts, self._c, self._loop = api, opts, c, loop
        self._changed = asyncio.Event()
        self.watcher: Any = None
        self.objectives: Any = None
        self.elector: LeaderElector | None = None
        if opts.ha_enable_leader_election:
            lease = default_lease_name(opts.pool_namespace, opts.pool_name)
            self.elector = LeaderElector(
                api, opts.pool_namespace, lease, None, loop, self._started_leading, self._stopped_leading
            )

    def _new_watcher(self) -> Any:
        from llm_epp.k8s import PoolWatcher

        def on_sync(synced: bool) -> None:
            self._c.health.synced = synced

        o = self._opts
        if o.endpoint_selector:
            from llm_epp.k8s.selector import SelectorWatcher, standalone_pool_spec

            spec = standalone_pool_spec(o.pool_namespace, o.endpoint_selector, o.endpoint_target_ports)
            return SelectorWatcher(self._api, spec, self._c.datastore, self._loop, on_sync=on_sync)
        return PoolWatcher(
            self._api, o.pool_namespace, o.pool_name, o.pool_group, self._c.datastore, self._loop, on_sync=on_sync
        )

    def start(self) -> None:
        o = self._opts
        if o.pool_name and not o.objectives_file:  # InferenceObjectives / rewrites, when their CRDs exist
            from llm_epp.k8s.objectives import ObjectivesWatcher

            self.objectives = ObjectivesWatcher(
                self._api, o.pool_namespace, o.pool_name, o.pool_group, self._c.objectives, self._loop
            )
            try:
                self.objectives.start()
            except Exception as e:  # API discovery failed for another reason than absent CRDs
                log.warning("k8s_objectives_unavailable reason=%r", e)
                self.objectives = None
        if self.elector is not None:
            self.elector.start()
        else:
            self.watcher = self._new_watcher()
            self.watcher.start()

    def _started_leading(self) -> None:
        self._c.health.is_leader = True
        log.info("leader_election_won")
        self._changed.set()

    def _stopped_leading(self) -> None:
        self._c.health.is_leader = False
        log.info("leader_election_lost")
        self._changed.set()

    async def follow_leadership(self) -> None:
        """Starts the watches when leadership is gained and stops them (emptying the pool) when it is lost.
        A stopped watcher cannot restart, so each term gets a new one."""
        c = self._c
        while True:
            await self._changed.wait()
            self._changed.clear()
            if c.health.is_leader and self.watcher is None:
                self.watcher = self._new_watcher()
                self.watcher.start()
            elif not c.health.is_leader and self.watcher is not None:
                watcher, self.watcher = self.watcher, None
                await asyncio.to_thread(watcher.stop)
                c.datastore.clear()
                c.datastore.synced = False  # clear() marks the store synced; a follower is not
                c.health.synced = False

    async def release_leadership(self) -> None:
        """Ends the election now; a leader releases the Lease so a follower can take over."""
        if self.elector is not None:
            elector, self.elector = self.elector, None
            await asyncio.to_thread(elector.stop)

    async def stop(self) -> None:
        if self.objectives is not None:
            await asyncio.to_thread(self.objectives.stop)
        if self.watcher is not None:
            watcher, self.watcher = self.watcher, None
            await asyncio.to_thread(watcher.stop)
        if self.elector is not None:
            await asyncio.to_thread(self.elector.stop)  # releases the lease for a follower to take at once


def _write_ports(path: str, ports: dict[str, Any]) -> None:
    tmp = Path(path + ".tmp")
    tmp.write_text(json.dumps(ports))
    tmp.replace(path)


def run(opts: Options) -> None:
    configure_logging(
        opts.verbosity,
        json=opts.json_logs,
        level=level_for_flags(opts.verbosity, opts.zap_log_level),
        stack_level=stacktrace_level(opts.zap_stacktrace_level),
        time_encoding=opts.zap_time_encoding,
    )
    for flag, given in (
        ("--model-server-metrics-scheme", opts.model_server_metrics_scheme is not None),
        ("--model-server-metrics-path", opts.model_server_metrics_path is not None),
        ("--model-server-metrics-port", opts.model_server_metrics_port != 0),
        (
            "--model-server-metrics-https-insecure-skip-verify",
            opts.model_server_metrics_https_insecure_skip_verify is not None,
        ),
    ):
        if given:
            log.warning(
                "flag %s is deprecated: set the metrics-data-source plugin's parameters in the "
                "EndpointPickerConfig instead",
                flag,
            )
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(opts))
    else:
        uvloop.run(serve(opts))
