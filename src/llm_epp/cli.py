"""`llm-epp`: serve (the EPP), envoy-config (an Envoy bootstrap for it), config check (validate a config).

For drop-in use in place of the reference EPP, flags given without a subcommand mean `serve`. `serve`
parses its flags as the reference's pflag command line does: `--flag=value` or `--flag value`, booleans
bare (`--tracing`) or with `=` (`--tracing=false`), list flags repeated or comma separated, `-v` also
as `-v=N` / `-vN`, no abbreviations and no single-dash long names."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from llm_epp import __version__
from llm_epp.options import Options
from llm_epp.security.tls_policy import TlsPolicyError, apply_cipher_suites, check_min_version, grpc_cipher_list

# strconv.ParseBool
_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
# Rejected by the reference too: metric names are configured per engine in core-metrics-extractor.
_LEGACY_METRIC_FLAGS = (
    "--total-queued-requests-metric",
    "--total-running-requests-metric",
    "--kv-cache-usage-percentage-metric",
    "--lora-info-metric",
    "--cache-info-metric",
)
ZAP_LOG_LEVELS = ("debug", "info", "error", "panic")
ZAP_STACKTRACE_LEVELS = ("info", "error", "panic")
ZAP_TIME_ENCODINGS = ("epoch", "millis", "nanos", "iso8601", "rfc3339", "rfc3339nano")


def _go_bool(value: str) -> bool:
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _go_int(value: str) -> int:
    try:
        return int(value, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None


def _size(value: str) -> int:
    units = {"k": 1 << 10, "ki": 1 << 10, "m": 1 << 20, "mi": 1 << 20, "g": 1 << 30, "gi": 1 << 30}
    v = value.strip().lower()
    for suffix in sorted(units, key=len, reverse=True):
        if v.endswith(suffix):
            num = v[: -len(suffix)]
            if num.isdigit():
                return int(num) * units[suffix]
    if v.isdigit():
        return int(v)
    raise argparse.ArgumentTypeError(f"expected a byte size such as 16777216 or 16Mi, got {value!r}")


_QUANTITY_SUFFIXES = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "Pi": 1 << 50,
    "Ei": 1 << 60,
}


def _quantity(value: str) -> int:
    """A byte count in Kubernetes quantity syntax (`10Mi`, `25M`, `1048576`), a trailing B/b allowed (`10MiB`),
    as the reference's --grpc-max-*-msg-size."""
    s = value.strip()
    if len(s) > 1 and s[-1] in "Bb":
        s = s[:-1]
    number = s.rstrip("kMGTPEi")
    suffix = s[len(number) :]
    if suffix not in _QUANTITY_SUFFIXES or not number:
        raise argparse.ArgumentTypeError(f"expected a size such as 4194304, 10Mi, 10MiB or 25M, got {value!r}")
    try:
        size = float(number) * _QUANTITY_SUFFIXES[suffix]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size such as 4194304, 10Mi or 25M, got {value!r}") from None
    if size < 0 or size != size or size > (1 << 31) - 1:
        raise argparse.ArgumentTypeError(f"{value!r} is out of range (0 .. 2Gi-1)")
    return int(size)


def _duration(value: str) -> float:
    from llm_epp.framework.durations import parse_go_duration

    try:
        seconds = parse_go_duration(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive duration such as 50ms or 2s, got {value!r}")
    return seconds


def _csv(value: str) -> list[str]:
    """One occurrence of a pflag slice flag: comma separated items (repeating the flag appends)."""
    return [item.strip() for item in value.split(",")] if value else []


def _choice(*allowed: str) -> Callable[[str], str]:
    """Case-insensitive choice, as the zap flags."""

    def parse(value: str) -> str:
        v = value.lower()
        if v not in allowed:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(allowed)}, got {value!r}")
        return v

    return parse


def _zap_level(value: str) -> str:
    v = value.lower()
    if v in ZAP_LOG_LEVELS or (value.isdigit() and int(value) > 0):
        return v
    raise argparse.ArgumentTypeError(
        f"invalid log level {value!r}: expected debug, info, error, panic or an integer > 0 (a -v verbosity)"
    )


class _Parser(argparse.ArgumentParser):
    """argparse with pflag's rules when `pflag` is set: a bare boolean flag (one added with `_bool_flag`) means
    true and never takes the next argument as its value (`--tracing false` is refused with the fix, since the
    reference would run with tracing on and silently drop the `false`), and a single-dash long name is an
    error that names the double-dash form."""

    pflag = False

    @property
    def pflag_bools(self) -> frozenset[str]:
        """The boolean flags' names (without dashes), whenever they were added."""
        return frozenset(
            a.option_strings[-1][2:]
            for a in self._actions
            if a.type is _go_bool and a.nargs == "?" and a.option_strings and a.option_strings[-1].startswith("--")
        )

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self.pflag:
            args = self._pflag_argv(list(sys.argv[1:] if args is None else args))
        return super().parse_known_args(args, namespace)

    def _pflag_argv(self, argv: list[str]) -> list[str]:
        bools = self.pflag_bools
        out: list[str] = []
        i = 0
        while i < len(argv):
            arg = argv[i]
            i += 1
            if arg == "--":
                out.extend(argv[i - 1 :])
                break
            name = arg[2:] if arg.startswith("--") else ""
            if name in bools:
                out.append(f"{arg}=true")
                following = argv[i] if i < len(argv) else ""
                if following in _TRUE:  # the same either way: the flag is true
                    i += 1
                elif following in _FALSE:
                    self.error(
                        f"{arg} is a boolean flag: write {arg}={following} (a separate {following!r} is not "
                        f"its value; the reference EPP would ignore it and run with {arg}=true)"
                    )
                continue
            if arg.startswith("-") and not arg.startswith("--") and len(arg) > 2:
                long = "--" + arg[1:].split("=", 1)[0]
                if long in self._option_string_actions and long != "--v":
                    self.error(f"{arg.split('=', 1)[0]}: long flags take two dashes, write {long}")
            out.append(arg)
        return out


def _bool_flag(p: argparse._ActionsContainer, name: str, default: bool, help: str) -> None:
    p.add_argument(name, type=_go_bool, nargs="?", const=True, default=default, metavar="=true|false", help=help)


def _help_formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.HelpFormatter(prog, max_help_position=46, width=116)


def _metavar(action: argparse.Action) -> str:
    if action.type is _duration:
        return "DURATION"
    if action.type in (_size, _quantity):
        return "SIZE"
    dest = action.dest
    for suffix, name in (
        ("port", "PORT"),
        ("file", "FILE"),
        ("metrics_path", "PATH"),
        ("path", "DIR"),
        ("dir", "DIR"),
        ("verbosity", "N"),
    ):
        if dest.endswith(suffix):
            return name
    return "VALUE"


def _serve_parser(p: _Parser) -> None:
    serving = p.add_argument_group("serving")
    serving.add_argument("--grpc-port", type=_go_int, default=9002, help="ext_proc gRPC port (default 9002)")
    serving.add_argument("--grpc-health-port", type=_go_int, default=9003, help="gRPC health port (default 9003)")
    serving.add_argument(
        "--metrics-port", type=_go_int, default=9090, help="/metrics (and /debug/pprof) port (default 9090)"
    )
    serving.add_argument("--bind-address", default="0.0.0.0", help="address to listen on (default all interfaces)")
    _bool_flag(
        serving, "--secure-serving", True, "serve ext_proc over TLS (default true; self-signed unless --cert-path)"
    )
    serving.add_argument("--cert-path", default="", help="directory with tls.crt and tls.key for ext_proc TLS")
    _bool_flag(serving, "--enable-cert-reload", False, "reload --cert-path's key pair when its files change")
    serving.add_argument(
        "--tls-min-version",
        default="",
        help="minimum TLS version of ext_proc: VersionTLS12 (what gRPC enforces anyway); others are refused",
    )
    serving.add_argument(
        "--tls-cipher-suites",
        type=_csv,
        action="extend",
        default=[],
        metavar="NAME[,NAME...]",
        help="TLS 1.2 cipher suites of ext_proc (Go names, e.g. TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256)",
    )
    serving.add_argument(
        "--grpc-max-recv-msg-size", type=_quantity, default=0, help="largest ext_proc message received (default 64Mi)"
    )
    serving.add_argument(
        "--grpc-max-send-msg-size", type=_quantity, default=0, help="largest ext_proc message sent (default 64Mi)"
    )
    serving.add_argument(
        "--grpc-max-connections",
        type=int,
        default=None,
        metavar="N",
        help="client connections the ext_proc and health ports each accept at once on the asyncio transport; one "
        "past it is sent GOAWAY and closed (default 4096; 0: no limit). grpcio has no such limit",
    )
    serving.add_argument(
        "--grpc-max-streams",
        type=int,
        default=None,
        metavar="N",
        help="streams (in-flight requests) the ext_proc port serves at once across all its connections on the "
        "asyncio transport; one past it is refused with REFUSED_STREAM (default 65536; 0: no limit)",
    )
    _bool_flag(serving, "--health-checking", False, "also serve gRPC health on the ext_proc port")
    serving.add_argument(
        "--grpc-transport",
        choices=("auto", "asyncio", "grpcio"),
        metavar="auto|asyncio|grpcio",
        default="auto",
        help="what serves the ext_proc, health and direct-routing API ports: asyncio (llm-epp's HTTP/2 server in "
        "the event loop's thread, about half the CPU per request) or grpcio; auto (default) is asyncio",
    )
    serving.add_argument(
        "--max-request-body-bytes", type=_size, default=16 << 20, help="larger bodies get 413 (default 16Mi)"
    )
    serving.add_argument(
        "--max-held-request-bytes",
        type=_size,
        default=256 << 20,
        help="request body bytes the EPP holds across all requests at once; over it a request gets 503 with "
        "Retry-After (default 256Mi). On the asyncio transport, ext_proc data received and not yet read counts too",
    )
    serving.add_argument("--ports-file", default="", help="write the bound ports as JSON here once serving")
    src = p.add_argument_group("configuration")
    src.add_argument("--config-file", default="", help="EndpointPickerConfig YAML file")
    src.add_argument("--config-text", default="", help="EndpointPickerConfig YAML text")
    _bool_flag(
        src, "--allow-experimental-plugins", False, "allow plugin types marked experimental in the configuration"
    )
    src.add_argument(
        "--objectives-file",
        default="",
        help="YAML with InferenceObjective priorities and model rewrite rules (without Kubernetes); reloaded on change",
    )
    _bool_flag(src, "--disable-endpoint-subset-filter", False, "ignore the gateway's endpoint subset hint")
    _bool_flag(
        src,
        "--enable-explain",
        False,
        "answer requests carrying x-llm-epp-explain: 1 with each candidate's scores in the response header "
        "x-gateway-destination-endpoint-scores",
    )
    disc = p.add_argument_group("endpoint discovery (exactly one)")
    disc.add_argument("--endpoints", default="", help="static endpoints, e.g. 10.0.0.5:8000,10.0.0.6:8000")
    disc.add_argument("--endpoints-file", default="", help="YAML file listing endpoints; reloaded on change")
    disc.add_argument("--pool-name", default="", help="InferencePool to watch (Kubernetes)")
    disc.add_argument("--pool-namespace", default="", help="namespace of the pool (default $NAMESPACE or default)")
    disc.add_argument("--pool-group", default="inference.networking.k8s.io", help="API group of the InferencePool")
    disc.add_argument(
        "--endpoint-selector", default="", help="standalone Kubernetes mode: pods matching k=v[,k=v] are the pool"
    )
    disc.add_argument(
        "--endpoint-target-ports",
        type=_csv,
        action="extend",
        default=[],
        metavar="PORT[,PORT...]",
        help="with --endpoint-selector: the model-server ports (1-8; comma list, or repeat the flag)",
    )
    _bool_flag(
        disc,
        "--ha-enable-leader-election",
        False,
        "active-passive HA: only the replica holding the pool's Lease watches the pool and reports ready",
    )
    data = p.add_argument_group("model-server metrics")
    data.add_argument(
        "--refresh-metrics-interval", type=_duration, default=0.05, help="scrape interval per endpoint (default 50ms)"
    )
    data.add_argument(
        "--refresh-prometheus-metrics-interval",
        type=_duration,
        default=5.0,
        help="how often the inference_pool_* gauges are updated (default 5s)",
    )
    data.add_argument(
        "--metrics-staleness-threshold",
        type=_duration,
        default=2.0,
        help="metrics older than this are stale and left out of pool gauges (default 2s)",
    )
    _bool_flag(
        data,
        "--metrics-name-filter",
        True,
        "ask model servers for only the metric samples the EPP reads (prometheus_client's name[] query "
        "parameter); an endpoint whose filtered page lacks data goes back to the full page (not in the reference)",
    )
    for legacy in _LEGACY_METRIC_FLAGS:
        data.add_argument(legacy, dest=legacy.lstrip("-").replace("-", "_"), default=None, help=argparse.SUPPRESS)
    obs = p.add_argument_group("observability")
    _bool_flag(
        obs,
        "--emit-endpoint-scores",
        False,
        "emit the scheduler's per-endpoint scores in the request-path dynamic metadata under the "
        "'x-gateway-destination-endpoint-scores' key of the 'envoy.lb' namespace",
    )
    _bool_flag(obs, "--tracing", True, "OpenTelemetry traces, configured by OTEL_* variables (default true)")
    _bool_flag(
        obs,
        "--metrics-endpoint-auth",
        True,
        "/metrics and /debug/pprof need a bearer token allowed to GET /metrics (TokenReview + SubjectAccessReview; "
        "default true)",
    )
    obs.add_argument(
        "--metrics-cert-dir", default="", help="directory with tls.crt and tls.key: HTTPS on the metrics port"
    )
    obs.add_argument(
        "--metrics-client-ca-file", default="", help="with --metrics-cert-dir: require client certificates from this CA"
    )
    _bool_flag(
        obs, "--enable-pprof", True, "CPU and heap profiles under /debug/pprof on the metrics port (default true)"
    )
    _bool_flag(
        obs,
        "--enable-grpc-stream-metrics",
        False,
        "ext_proc stream metrics: streams in flight, stream duration, streams ended by status code",
    )
    obs.add_argument(
        "-v",
        "--v",
        dest="verbosity",
        type=_go_int,
        default=2,
        help="log verbosity: 2 info, 3 verbose, 4 debug, 5 trace",
    )
    _bool_flag(obs, "--zap-devel", True, "without --zap-encoder: true logs for the console, false logs JSON")
    obs.add_argument("--zap-encoder", type=_choice("json", "console"), default=None, help="log format: json or console")
    obs.add_argument(
        "--zap-log-level",
        type=_zap_level,
        default=None,
        help="debug, info, error, panic or N (same as -v N); overrides -v",
    )
    obs.add_argument(
        "--zap-stacktrace-level",
        type=_choice(*ZAP_STACKTRACE_LEVELS),
        default=None,
        help="add the stack to lines at or above: info, error or panic (default none)",
    )
    obs.add_argument(
        "--zap-time-encoding",
        type=_choice(*ZAP_TIME_ENCODINGS),
        default=None,
        help=f"timestamp format: {', '.join(ZAP_TIME_ENCODINGS)} (default ISO 8601 UTC with milliseconds)",
    )
    old = p.add_argument_group(
        "deprecated (accepted as the reference does; set metrics-data-source parameters in the config instead)"
    )
    old.add_argument("--model-server-metrics-scheme", default=None, help="http or https")
    old.add_argument("--model-server-metrics-path", default=None, help="URL path of the metrics page")
    old.add_argument(
        "--model-server-metrics-port", type=_go_int, default=0, help="scrape this port (pools with one target port)"
    )
    old.add_argument(
        "--model-server-metrics-https-insecure-skip-verify",
        type=_go_bool,
        nargs="?",
        const=True,
        default=None,
        metavar="=true|false",
        help="with https: skip certificate verification",
    )
    _pick_api_and_shutdown_flags(p)
    for action in p._actions:  # short placeholders keep --help readable
        if action.metavar is None and action.option_strings and action.nargs is None:
            action.metavar = _metavar(action)
    p.pflag = True


def _non_negative_duration(value: str) -> float:
    from llm_epp.framework.durations import parse_go_duration

    try:
        seconds = parse_go_duration(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"expected a duration such as 0s, 500ms or 30s, got {value!r}")
    return seconds


def _pick_api_and_shutdown_flags(p: argparse.ArgumentParser) -> None:
    """The direct-routing API (off by default; authenticated when on) and the SIGTERM drain."""
    api = p.add_argument_group("direct-routing API (llm_epp.v1.EndpointPicker; off unless enabled)")
    _bool_flag(
        api,  # type: ignore[arg-type]
        "--enable-pick-api",
        False,
        "serve Pick/Release/ListEndpoints; needs --pick-api-client-ca-file and/or --pick-api-token-review",
    )
    api.add_argument(
        "--pick-api-port",
        type=int,
        default=0,
        help="own port for the API (needed for mTLS); 0 = on the ext_proc port, token authentication only",
    )
    api.add_argument(
        "--pick-api-client-ca-file",
        default="",
        help="PEM CA bundle: callers must present a client certificate it signed (mTLS; needs --pick-api-port)",
    )
    _bool_flag(
        api,  # type: ignore[arg-type]
        "--pick-api-token-review",
        False,
        "callers send 'authorization: Bearer <service-account token>', checked with a Kubernetes TokenReview",
    )
    api.add_argument(
        "--pick-api-allowed-service-accounts",
        default="",
        help="with --pick-api-token-review: namespace/name[,namespace/*] of the service accounts allowed",
    )
    api.add_argument(
        "--pick-api-token-audiences", default="", help="audiences the tokens must carry (comma list; default any)"
    )
    api.add_argument(
        "--pick-api-max-leases", type=int, default=10_000, help="outstanding leases in total (default 10000)"
    )
    api.add_argument(
        "--pick-api-max-leases-per-caller",
        type=int,
        default=1_000,
        help="outstanding leases of one authenticated caller (default 1000)",
    )
    api.add_argument(
        "--pick-api-lease-ttl", type=_duration, default=60.0, help="lease lifetime when a Pick asks for none (60s)"
    )
    api.add_argument(
        "--pick-api-max-lease-ttl", type=_duration, default=600.0, help="longest lease lifetime granted (10m)"
    )
    p.add_argument(
        "--drain-timeout",
        type=_non_negative_duration,
        default=30.0,
        help="on SIGTERM: report not ready and keep serving this long, then stop accepting and give in-flight "
        "streams as long again to finish (default 30s; 0 stops at once)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="ext_proc worker processes sharing this process's scheduling state, on --grpc-port and the next "
        "ports above it that are not the health, metrics or Pick API port (list them all as EPP endpoints: "
        "llm-epp envoy-config --epp-workers N); default 1",
    )


def _options(args: argparse.Namespace) -> Options:
    json_logs = args.zap_encoder == "json" if args.zap_encoder else not args.zap_devel
    return Options(
        grpc_port=args.grpc_port,
        grpc_health_port=args.grpc_health_port,
        metrics_port=args.metrics_port,
        bind_address=args.bind_address,
        secure_serving=args.secure_serving,
        cert_path=args.cert_path,
        enable_cert_reload=args.enable_cert_reload,
        health_checking=args.health_checking,
        config_file=args.config_file,
        config_text=args.config_text,
        endpoints=args.endpoints,
        endpoints_file=args.endpoints_file,
        pool_name=args.pool_name,
        pool_namespace=args.pool_namespace or os.environ.get("NAMESPACE", "") or "default",
        pool_group=args.pool_group,
        ha_enable_leader_election=args.ha_enable_leader_election,
        endpoint_selector=args.endpoint_selector,
        endpoint_target_ports=",".join(args.endpoint_target_ports),
        max_request_body_bytes=args.max_request_body_bytes,
        max_held_request_bytes=args.max_held_request_bytes,
        emit_endpoint_scores=args.emit_endpoint_scores,
        disable_endpoint_subset_filter=args.disable_endpoint_subset_filter,
        verbosity=args.verbosity,
        json_logs=json_logs,
        zap_log_level=args.zap_log_level or "",
        zap_stacktrace_level=args.zap_stacktrace_level or "",
        zap_time_encoding=args.zap_time_encoding or "",
        ports_file=args.ports_file,
        enable_explain=args.enable_explain,
        refresh_metrics_interval=args.refresh_metrics_interval,
        refresh_prometheus_metrics_interval=args.refresh_prometheus_metrics_interval,
        metrics_staleness_threshold=args.metrics_staleness_threshold,
        metrics_name_filter=args.metrics_name_filter,
        objectives_file=args.objectives_file,
        model_server_metrics_scheme=args.model_server_metrics_scheme,
        model_server_metrics_path=args.model_server_metrics_path,
        model_server_metrics_port=args.model_server_metrics_port,
        model_server_metrics_https_insecure_skip_verify=args.model_server_metrics_https_insecure_skip_verify,
        tracing=args.tracing,
        enable_pprof=args.enable_pprof,
        metrics_endpoint_auth=args.metrics_endpoint_auth,
        metrics_cert_dir=args.metrics_cert_dir,
        metrics_client_ca_file=args.metrics_client_ca_file,
        grpc_max_recv_msg_size=args.grpc_max_recv_msg_size,
        grpc_max_connections=args.grpc_max_connections,
        grpc_max_streams=args.grpc_max_streams,
        grpc_max_send_msg_size=args.grpc_max_send_msg_size,
        enable_grpc_stream_metrics=args.enable_grpc_stream_metrics,
        grpc_transport=args.grpc_transport,
        tls_min_version=args.tls_min_version,
        tls_cipher_suites=tuple(s for s in args.tls_cipher_suites if s),
        allow_experimental_plugins=args.allow_experimental_plugins,
        enable_pick_api=args.enable_pick_api,
        pick_api_port=args.pick_api_port,
        pick_api_client_ca_file=args.pick_api_client_ca_file,
        pick_api_token_review=args.pick_api_token_review,
        pick_api_token_audiences=args.pick_api_token_audiences,
        pick_api_allowed_service_accounts=args.pick_api_allowed_service_accounts,
        pick_api_max_leases=args.pick_api_max_leases,
        pick_api_max_leases_per_caller=args.pick_api_max_leases_per_caller,
        pick_api_lease_ttl=args.pick_api_lease_ttl,
        pick_api_max_lease_ttl=args.pick_api_max_lease_ttl,
        drain_timeout=args.drain_timeout,
        workers=args.workers,
    )


def _pick_api_problems(opts: Options) -> list[str]:
    given = [
        name
        for name, value in (
            ("--pick-api-port", opts.pick_api_port),
            ("--pick-api-client-ca-file", opts.pick_api_client_ca_file),
            ("--pick-api-token-review", opts.pick_api_token_review),
            ("--pick-api-allowed-service-accounts", opts.pick_api_allowed_service_accounts),
            ("--pick-api-token-audiences", opts.pick_api_token_audiences),
        )
        if value
    ]
    if not opts.enable_pick_api:
        return [f"{name} configures the direct-routing API: add --enable-pick-api" for name in given]
    problems = []
    if not opts.pick_api_client_ca_file and not opts.pick_api_token_review:
        problems.append(
            "--enable-pick-api needs client authentication: --pick-api-client-ca-file CA.pem (mTLS, with "
            "--pick-api-port) and/or --pick-api-token-review with --pick-api-allowed-service-accounts"
        )
    if opts.pick_api_client_ca_file and not opts.pick_api_port:
        problems.append(
            "--pick-api-client-ca-file needs --pick-api-port: the ext_proc port cannot ask Envoy for client "
            "certificates, so mTLS callers get their own port"
        )
    if opts.pick_api_port and opts.pick_api_port in (opts.grpc_port, opts.grpc_health_port, opts.metrics_port):
        problems.append("--pick-api-port must differ from --grpc-port, --grpc-health-port and --metrics-port")
    if not 0 <= opts.pick_api_port <= 65535:
        problems.append("--pick-api-port must be between 0 and 65535")
    if opts.pick_api_token_review:
        from llm_epp.pickapi.auth import parse_service_account

        accounts = [a for a in opts.pick_api_allowed_service_accounts.split(",") if a.strip()]
        if not accounts:
            problems.append(
                "--pick-api-token-review needs --pick-api-allowed-service-accounts namespace/name[,...]: "
                "a valid token alone would let every service account of the cluster in"
            )
        for entry in accounts:
            try:
                parse_service_account(entry)
            except ValueError as e:
                problems.append(f"--pick-api-allowed-service-accounts: {e}")
    elif opts.pick_api_allowed_service_accounts or opts.pick_api_token_audiences:
        problems.append(
            "--pick-api-allowed-service-accounts and --pick-api-token-audiences need --pick-api-token-review"
        )
    if not 0 < opts.pick_api_max_leases_per_caller <= opts.pick_api_max_leases:
        problems.append("lease caps must satisfy 0 < --pick-api-max-leases-per-caller <= --pick-api-max-leases")
    if opts.pick_api_lease_ttl > opts.pick_api_max_lease_ttl:
        problems.append("--pick-api-lease-ttl must not exceed --pick-api-max-lease-ttl")
    return problems


def _selector_problems(opts: Options) -> list[str]:
    if not opts.endpoint_selector:
        return ["--endpoint-target-ports is only used with --endpoint-selector"] if opts.endpoint_target_ports else []
    from llm_epp.k8s.selector import EndpointSelectorError, parse_endpoint_selector, parse_target_ports

    problems = []
    try:
        parse_endpoint_selector(opts.endpoint_selector)
    except EndpointSelectorError as e:
        problems.append(str(e))
    if not opts.endpoint_target_ports:
        problems.append("--endpoint-selector needs --endpoint-target-ports, e.g. --endpoint-target-ports 8000")
    else:
        try:
            parse_target_ports(opts.endpoint_target_ports)
        except EndpointSelectorError as e:
            problems.append(str(e))
    if opts.ha_enable_leader_election:
        problems.append(
            "--ha-enable-leader-election needs --pool-name; standalone --endpoint-selector runs one replica"
        )
    return problems


def _metrics_tls_problems(opts: Options) -> list[str]:
    """As the reference: a client CA needs the server certificate; TLS alone is no access control."""
    problems = []
    if opts.metrics_client_ca_file and not opts.metrics_cert_dir:
        problems.append("--metrics-client-ca-file needs --metrics-cert-dir (the metrics server's tls.crt and tls.key)")
    if opts.metrics_cert_dir and not opts.metrics_client_ca_file and not opts.metrics_endpoint_auth:
        problems.append(
            "--metrics-cert-dir with --metrics-endpoint-auth=false would serve /metrics over TLS to anyone: give "
            "--metrics-client-ca-file too, or keep --metrics-endpoint-auth"
        )
    if opts.metrics_client_ca_file and not Path(opts.metrics_client_ca_file).is_file():
        problems.append(f"--metrics-client-ca-file {opts.metrics_client_ca_file}: no such file")
    if opts.metrics_cert_dir:
        for name in ("tls.crt", "tls.key"):
            if not (Path(opts.metrics_cert_dir) / name).is_file():
                problems.append(f"--metrics-cert-dir {opts.metrics_cert_dir}: {name} is missing")
    return problems


MAX_WORKERS = 64


def check_options(opts: Options) -> list[str]:
    """Problems with a flag combination, each saying how to fix it."""
    problems = []
    if opts.config_file and opts.config_text:
        problems.append("--config-file and --config-text are mutually exclusive; give one")
    sources = [
        n
        for n, v in (
            ("--endpoints", opts.endpoints),
            ("--endpoints-file", opts.endpoints_file),
            ("--pool-name", opts.pool_name),
            ("--endpoint-selector", opts.endpoint_selector),
        )
        if v
    ]
    if len(sources) > 1:
        problems.append(f"give exactly one endpoint source, not {' and '.join(sources)}")
    if not sources and not (opts.config_file or opts.config_text):  # a config may name a discovery plugin
        problems.append(
            "no endpoint source: give --pool-name NAME or --endpoint-selector k=v (Kubernetes), "
            "--endpoints host:port,... or --endpoints-file FILE"
        )
    problems.extend(_selector_problems(opts))
    problems.extend(_pick_api_problems(opts))
    if opts.ha_enable_leader_election and not opts.pool_name:
        problems.append(
            "--ha-enable-leader-election needs --pool-name (the Lease coordinates replicas serving one InferencePool)"
        )
    if opts.max_request_body_bytes <= 0:
        problems.append("--max-request-body-bytes must be positive")
    if opts.max_held_request_bytes <= 0:
        problems.append("--max-held-request-bytes must be positive")
    for flag, value in (
        ("--grpc-max-connections", opts.grpc_max_connections),
        ("--grpc-max-streams", opts.grpc_max_streams),
    ):
        if value is None:
            continue
        if value < 0:
            problems.append(f"{flag} must be 0 (no limit) or more")
        elif opts.ext_proc_transport() != "asyncio":
            problems.append(
                f"{flag} is enforced by the asyncio transport only, and --grpc-transport grpcio has no such "
                "limit: drop the flag, or use --grpc-transport asyncio (the default)"
            )
    if opts.model_server_metrics_scheme not in (None, "http", "https"):
        problems.append(
            f"--model-server-metrics-scheme {opts.model_server_metrics_scheme!r}: only http or https (better: set "
            "the metrics-data-source plugin's scheme parameter in the config)"
        )
    if not 0 <= opts.model_server_metrics_port <= 65535:
        problems.append("--model-server-metrics-port must be between 0 and 65535")
    problems.extend(_metrics_tls_problems(opts))
    problems.extend(worker_problems(opts))
    try:
        check_min_version(opts.tls_min_version)
    except TlsPolicyError as e:
        problems.append(str(e))
    try:
        grpc_cipher_list(opts.tls_cipher_suites)
    except TlsPolicyError as e:
        problems.append(str(e))
    for name, port in (
        ("--grpc-port", opts.grpc_port),
        ("--grpc-health-port", opts.grpc_health_port),
        ("--metrics-port", opts.metrics_port),
    ):
        if not 0 <= port <= 65535:
            problems.append(f"{name} must be between 0 and 65535")
    return problems


def worker_problems(opts: Options) -> list[str]:
    """`--workers N`: what worker processes cannot do, and ports that would collide."""
    if opts.workers == 1:
        return []
    if not 1 <= opts.workers <= MAX_WORKERS:
        return [f"--workers must be between 1 and {MAX_WORKERS}, got {opts.workers}"]
    problems = []
    for flag, given, why in (
        (
            "--enable-grpc-stream-metrics",
            opts.enable_grpc_stream_metrics,
            "the stream counters live in the worker processes, not on the metrics port",
        ),
        (
            "--enable-pick-api without --pick-api-port",
            opts.enable_pick_api and not opts.pick_api_port,
            "the ext_proc ports belong to the workers; give the API its own --pick-api-port",
        ),
    ):
        if given:
            problems.append(f"{flag} is not supported with --workers {opts.workers}: {why}")
    if opts.grpc_port:
        for flag, port in opts.other_ports():
            if port == opts.grpc_port:
                problems.append(
                    f"{flag} {port} is the --grpc-port, where the first ext_proc worker listens: give {flag} "
                    "another port"
                )
        try:
            opts.worker_ports()
        except ValueError:
            problems.append(f"--grpc-port {opts.grpc_port} + --workers {opts.workers} runs past port 65535")
    return problems


def _config_check(args: argparse.Namespace) -> int:
    from llm_epp.config import ConfigError, load_config
    from llm_epp.framework import NullRecorder
    from llm_epp.plugins import builtin_registry

    logging.getLogger("llm_epp.config").addHandler(logging.NullHandler())  # warnings are printed below
    try:
        loaded = load_config(args.file, builtin_registry(), NullRecorder(), strict=args.strict)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 1
    for w in loaded.warnings:
        print(f"{args.file}: warning: {w}", file=sys.stderr)
    print(f"{args.file}: valid{' with warnings' if loaded.warnings else ''}")
    print(loaded.describe())
    return 0


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `llm-epp` parser. Only the subcommand named by `command` gets its arguments when it is `envoy-config`
    or `sim`: their modules (the Envoy config builder, the simulator) are imported just for them, so
    `llm-epp serve` loads only what serving needs."""
    parser = argparse.ArgumentParser(prog="llm-epp", description="Endpoint Picker for LLM inference pools")
    parser.add_argument("--version", action="version", version=f"llm-epp {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    serve = sub.add_parser(
        "serve",
        help="run the endpoint picker",
        usage="llm-epp [serve] [flags]",
        description="Flags as the reference EPP takes them: --flag=value or --flag value; booleans as --flag "
        "or --flag=false (a separate word is not their value); list flags comma separated or repeated.",
        formatter_class=_help_formatter,
        allow_abbrev=False,
    )
    assert isinstance(serve, _Parser)
    _serve_parser(serve)
    envoy = sub.add_parser("envoy-config", help="print an Envoy bootstrap for the EPP")
    if command == "envoy-config":
        from llm_epp.gateway import envoy_config

        envoy_config.add_arguments(envoy)
    sim = sub.add_parser("sim", help="run simulated vLLM or SGLang pods on loopback")
    if command == "sim":
        from llm_epp.sim import cli as sim_cli

        sim_cli.add_arguments(sim)
    pd = sub.add_parser("pd-sidecar", help="run the decode-side P/D routing sidecar")
    if command == "pd-sidecar":
        from llm_epp.pdsidecar import cli as pd_sidecar_cli

        pd_sidecar_cli.add_arguments(pd)
    cfg = sub.add_parser("config", help="work with EndpointPickerConfig files")
    cfg_sub = cfg.add_subparsers(dest="config_command", required=True)
    check = cfg_sub.add_parser("check", help="validate a config file and print the resolved profiles")
    check.add_argument("file")
    check.add_argument(
        "--strict",
        action="store_true",
        help="fail on unknown plugin parameters (llm-d-router rejects them; GIE v1.5.0 ignores them)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0].startswith("-") and args_list[0] not in ("-h", "--help", "--version"):
        args_list.insert(0, "serve")
    parser = build_parser(args_list[0] if args_list else None)
    args = parser.parse_args(args_list)
    if args.command == "serve":
        opts = _options(args)
        problems = check_options(opts)
        for legacy in _LEGACY_METRIC_FLAGS:
            if getattr(args, legacy.lstrip("-").replace("-", "_")) is not None:
                problems.append(
                    f"{legacy} is no longer supported: set metric names per engine in the core-metrics-extractor "
                    "plugin's engineConfigs"
                )
        if problems:
            for p in problems:
                print(f"llm-epp: {p}", file=sys.stderr)
            return 2
        if opts.secure_serving:
            apply_cipher_suites(opts.tls_cipher_suites)  # gRPC reads it once, when first imported (just below)
        from llm_epp.app import StartupError, run

        try:
            run(opts)
        except StartupError as e:
            print(f"llm-epp: {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
        return 0
    if args.command == "envoy-config":
        from llm_epp.gateway import envoy_config

        return envoy_config.run(args)
    if args.command == "config":
        return _config_check(args)
    if args.command == "sim":
        from llm_epp.sim import cli as sim_cli

        return sim_cli.run(args)
    if args.command == "pd-sidecar":
        from llm_epp.pdsidecar import cli as pd_sidecar_cli

        return pd_sidecar_cli.run(args)
    parser.print_help()
    return 2
