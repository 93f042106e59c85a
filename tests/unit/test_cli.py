"""The command line: reference flag names and forms, and clear errors for wrong combinations."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_epp import cli
from llm_epp.options import Options


def parse(*argv: str) -> Options:
    args = cli.build_parser().parse_args(["serve", *argv])
    return cli._options(args)


def test_reference_defaults() -> None:
    opts = parse("--endpoints", "10.0.0.1:8000")
    assert (opts.grpc_port, opts.grpc_health_port, opts.metrics_port) == (9002, 9003, 9090)
    assert opts.secure_serving is True
    assert opts.refresh_metrics_interval == 0.05
    assert opts.metrics_staleness_threshold == 2.0
    assert opts.refresh_prometheus_metrics_interval == 5.0
    assert opts.max_request_body_bytes == 16 << 20
    assert opts.max_held_request_bytes == 256 << 20
    assert opts.emit_endpoint_scores is False
    assert opts.metrics_name_filter is True
    assert opts.verbosity == 2


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["--secure-serving=false"], "secure_serving", False),
        (["--secure-serving"], "secure_serving", True),
        (["--secure-serving", "true"], "secure_serving", True),
        (["--refresh-metrics-interval", "200ms"], "refresh_metrics_interval", 0.2),
        (["--metrics-staleness-threshold=1m"], "metrics_staleness_threshold", 60.0),
        (["--max-request-body-bytes", "4Mi"], "max_request_body_bytes", 4 << 20),
        (["--max-held-request-bytes", "1Gi"], "max_held_request_bytes", 1 << 30),
        (["--grpc-max-connections", "64"], "grpc_max_connections", 64),
        (["--grpc-max-connections=0"], "grpc_max_connections", 0),
        (["--grpc-max-streams", "1000"], "grpc_max_streams", 1000),
        (["--emit-endpoint-scores"], "emit_endpoint_scores", True),
        (["--emit-endpoint-scores=false"], "emit_endpoint_scores", False),
        (["--metrics-name-filter=false"], "metrics_name_filter", False),
        (["--v", "4"], "verbosity", 4),
        (["-v", "5"], "verbosity", 5),
        (["--zap-encoder", "json"], "json_logs", True),
    ],
    ids=[
        "go-bool-false",
        "bare-bool",
        "bool-true-word",
        "duration-ms",
        "duration-m",
        "size-mi",
        "held-gi",
        "connections",
        "connections-unlimited",
        "streams",
        "scores",
        "scores-false",
        "name-filter-off",
        "v",
        "short-v",
        "json",
    ],
)
def test_flag_forms(argv: list[str], field: str, value: object) -> None:
    assert getattr(parse("--endpoints", "10.0.0.1:8000", *argv), field) == value


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        ([], "no endpoint source"),
        (["--endpoints", "a:1", "--endpoints-file", "f.yaml"], "exactly one endpoint source"),
        (["--endpoints", "a:1", "--pool-name", "p"], "exactly one endpoint source"),
        (["--endpoints", "a:1", "--config-file", "a", "--config-text", "b"], "mutually exclusive"),
        (["--endpoints", "a:1", "--grpc-port", "70000"], "--grpc-port must be between"),
        (["--endpoint-selector", "app=vllm"], "needs --endpoint-target-ports"),
        (["--endpoint-selector", "app=vllm", "--endpoint-target-ports", "0"], "--endpoint-target-ports"),
        (["--endpoint-selector", "app vllm", "--endpoint-target-ports", "8000"], "--endpoint-selector"),
        (["--endpoints", "a:1", "--endpoint-target-ports", "8000"], "only used with --endpoint-selector"),
        (["--endpoints", "a:1", "--ha-enable-leader-election"], "needs --pool-name"),
        (["--endpoints", "a:1", "--max-held-request-bytes", "0"], "--max-held-request-bytes must be positive"),
        (["--endpoints", "a:1", "--grpc-max-connections", "-1"], "--grpc-max-connections must be 0 (no limit)"),
        (
            ["--endpoints", "a:1", "--grpc-max-connections", "8", "--grpc-transport", "grpcio"],
            "--grpc-max-connections is enforced by the asyncio transport only",
        ),
        (["--endpoints", "a:1", "--grpc-max-streams", "-5"], "--grpc-max-streams must be 0 (no limit)"),
        (
            ["--endpoints", "a:1", "--grpc-max-streams", "100", "--grpc-transport", "grpcio"],
            "--grpc-max-streams is enforced by the asyncio transport only",
        ),
    ],
    ids=[
        "no-source",
        "two-sources",
        "pool-and-static",
        "two-configs",
        "bad-port",
        "selector-without-ports",
        "bad-target-port",
        "bad-selector",
        "ports-without-selector",
        "ha-without-pool",
        "held-zero",
        "connections-negative",
        "connections-on-grpcio",
        "streams-negative",
        "streams-on-grpcio",
    ],
)
def test_wrong_combinations_are_explained(argv: list[str], fragment: str) -> None:
    problems = cli.check_options(parse(*argv))
    assert any(fragment in p for p in problems), problems


@pytest.mark.parametrize("value", ["fast", "10", "-1s"], ids=["word", "no-unit", "negative"])
def test_bad_durations_are_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--refresh-metrics-interval", value)
    assert "--refresh-metrics-interval" in capsys.readouterr().err


def test_legacy_metric_flags_are_rejected_with_the_replacement(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["serve", "--endpoints", "a:1", "--total-queued-requests-metric", "x"])
    assert code == 2
    assert "engineConfigs" in capsys.readouterr().err


def test_flags_without_a_subcommand_mean_serve(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--grpc-port", "9002"]) == 2  # parsed as serve; fails on the missing endpoint source
    assert "no endpoint source" in capsys.readouterr().err


def test_config_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("plugins:\n- type: queue-scorer\n- type: max-score-picker\n")
    assert cli.main(["config", "check", str(good)]) == 0
    out = capsys.readouterr().out
    assert "valid" in out and "scorer queue-scorer weight 1" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("plugins:\n- type: queue-scorr\n")
    assert cli.main(["config", "check", str(bad)]) == 1
    assert "plugins[0].type: unknown plugin type 'queue-scorr'" in capsys.readouterr().err


# --- every flag of the reference EPPs (GIE v1.5.0 and llm-d-router v0.10) ----------------------------------
# (argv, Options field, value). Values differ from the defaults so that each case proves the flag is read.
UPSTREAM_FLAGS: list[tuple[list[str], str, object]] = [
    (["--grpc-port", "9100"], "grpc_port", 9100),
    (["--grpc-health-port", "9101"], "grpc_health_port", 9101),
    (["--metrics-port", "9102"], "metrics_port", 9102),
    (["--ha-enable-leader-election"], "ha_enable_leader_election", True),
    (["--pool-group", "example.io"], "pool_group", "example.io"),
    (["--pool-namespace", "team-a"], "pool_namespace", "team-a"),
    (["--pool-name", "other"], "pool_name", "other"),
    (["--disable-endpoint-subset-filter"], "disable_endpoint_subset_filter", True),
    (["--model-server-metrics-scheme", "https"], "model_server_metrics_scheme", "https"),
    (["--model-server-metrics-path", "/prometheus/metrics"], "model_server_metrics_path", "/prometheus/metrics"),
    (["--model-server-metrics-port", "9400"], "model_server_metrics_port", 9400),
    (
        ["--model-server-metrics-https-insecure-skip-verify=false"],
        "model_server_metrics_https_insecure_skip_verify",
        False,
    ),
    (["--refresh-metrics-interval", "100ms"], "refresh_metrics_interval", 0.1),
    (["--refresh-prometheus-metrics-interval", "10s"], "refresh_prometheus_metrics_interval", 10.0),
    (["--metrics-staleness-threshold", "3s"], "metrics_staleness_threshold", 3.0),
    (["--v", "4"], "verbosity", 4),
    (["--zap-devel=false"], "json_logs", True),
    (["--zap-encoder", "json"], "json_logs", True),
    (["--zap-log-level", "debug"], "zap_log_level", "debug"),
    (["--zap-log-level", "5"], "zap_log_level", "5"),
    (["--zap-stacktrace-level", "error"], "zap_stacktrace_level", "error"),
    (["--zap-time-encoding", "rfc3339nano"], "zap_time_encoding", "rfc3339nano"),
    (["--tracing=false"], "tracing", False),
    (["--health-checking"], "health_checking", True),
    (["--enable-pprof=false"], "enable_pprof", False),
    (["--cert-path", "/certs"], "cert_path", "/certs"),
    (["--enable-cert-reload"], "enable_cert_reload", True),
    (["--secure-serving=false"], "secure_serving", False),
    (["--metrics-endpoint-auth=false"], "metrics_endpoint_auth", False),
    (["--config-file", "/config/default-plugins.yaml"], "config_file", "/config/default-plugins.yaml"),
    (["--config-text", "plugins: []"], "config_text", "plugins: []"),
    # llm-d-router v0.10 only
    (["--grpc-max-recv-msg-size", "10MiB"], "grpc_max_recv_msg_size", 10 << 20),
    (["--grpc-max-send-msg-size", "25MB"], "grpc_max_send_msg_size", 25_000_000),
    (["--enable-grpc-stream-metrics"], "enable_grpc_stream_metrics", True),
    (["--tls-min-version", "VersionTLS12"], "tls_min_version", "VersionTLS12"),
    (
        ["--tls-cipher-suites", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_AES_128_GCM_SHA256"],
        "tls_cipher_suites",
        ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_AES_128_GCM_SHA256"),
    ),
    (["--allow-experimental-plugins"], "allow_experimental_plugins", True),
]


def _forms(argv: list[str]) -> list[list[str]]:
    """The pflag spellings of one flag occurrence: `--f v` and `--f=v`; a bare boolean also as `--f=true`."""
    if len(argv) == 2:
        return [argv, [f"{argv[0]}={argv[1]}"]]
    if "=" in argv[0]:
        return [argv]
    return [argv, [f"{argv[0]}=true"], [f"{argv[0]}=True"], [f"{argv[0]}=1"]]


@pytest.mark.parametrize(
    ("argv", "field", "value"), UPSTREAM_FLAGS, ids=[c[0][0].split("=")[0] for c in UPSTREAM_FLAGS]
)
def test_every_upstream_flag_parses_and_is_read(argv: list[str], field: str, value: object) -> None:
    for form in _forms(argv):
        opts = parse("--pool-name", "demo", *form)
        assert getattr(opts, field) == value, form
        assert cli.check_options(opts) == [], form


def test_standalone_and_metrics_tls_flags(tmp_path: Path) -> None:
    opts = parse("--endpoint-selector", "app=vllm", "--endpoint-target-ports", "8000", "--endpoint-target-ports=8001")
    assert opts.endpoint_target_ports == "8000,8001"  # repeated: appended, as pflag's int slice
    assert cli.check_options(opts) == []
    opts = parse("--endpoint-selector=app=vllm", "--endpoint-target-ports", "8000,8001,8002")
    assert opts.endpoint_target_ports == "8000,8001,8002"
    (tmp_path / "tls.crt").write_text("x")
    (tmp_path / "tls.key").write_text("x")
    (tmp_path / "ca.crt").write_text("x")
    opts = parse(
        "--pool-name", "demo", "--metrics-cert-dir", str(tmp_path), "--metrics-client-ca-file", str(tmp_path / "ca.crt")
    )
    assert (opts.metrics_cert_dir, opts.metrics_client_ca_file) == (str(tmp_path), str(tmp_path / "ca.crt"))
    assert cli.check_options(opts) == []


def test_repeated_cipher_suites_append() -> None:
    opts = parse(
        "--pool-name",
        "demo",
        "--tls-cipher-suites",
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        "--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    )
    assert opts.tls_cipher_suites == (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    )


@pytest.mark.parametrize("argv", [["-v", "1"], ["-v=1"], ["-v1"], ["--v", "1"], ["--v=1"]], ids=str)
def test_v_spellings(argv: list[str]) -> None:
    assert parse("--pool-name", "demo", *argv).verbosity == 1


def test_defaults_are_the_references() -> None:
    opts = parse("--pool-name", "demo")
    assert opts.tracing is True and opts.enable_pprof is True and opts.metrics_endpoint_auth is True
    assert opts.enable_cert_reload is False and opts.enable_grpc_stream_metrics is False
    assert opts.allow_experimental_plugins is False
    assert opts.json_logs is False  # --zap-devel defaults to true: console lines
    assert (opts.model_server_metrics_scheme, opts.model_server_metrics_port) == (None, 0)
    assert (opts.grpc_max_recv_msg_size, opts.tls_min_version, opts.tls_cipher_suites) == (0, "", ())


# --- direct-routing API and drain ------------------------------------------------------------------------------
def test_the_pick_api_is_off_and_the_drain_is_the_references_by_default() -> None:
    opts = parse("--endpoints", "10.0.0.1:8000")
    assert opts.enable_pick_api is False
    assert opts.drain_timeout == 30.0
    assert opts.pick_api_lease_ttl == 60.0
    assert cli.check_options(opts) == []


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--tracing", "false"], "write --tracing=false"),
        (["--secure-serving", "0"], "write --secure-serving=0"),
        (["-tracing=false"], "long flags take two dashes, write --tracing"),
        (["-pool-name", "x"], "write --pool-name"),
        (["--trac"], "unrecognized arguments: --trac"),
        (["--tracing=maybe"], "expected true or false"),
        (["--zap-encoder", "xml"], "expected one of json, console"),
        (["--zap-log-level", "warn"], "invalid log level 'warn'"),
        (["--zap-log-level", "0"], "invalid log level '0'"),
        (["--zap-stacktrace-level", "debug"], "expected one of info, error, panic"),
        (["--zap-time-encoding", "unix"], "expected one of epoch"),
        (["--grpc-max-recv-msg-size", "lots"], "expected a size"),
        (["--grpc-port", "x"], "expected an integer"),
        (["stray"], "unrecognized arguments: stray"),
    ],
    ids=lambda v: str(v),
)
def test_malformed_flags_exit_2_with_the_fix(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse("--pool-name", "demo", *argv)
    assert exited.value.code == 2
    assert fragment in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--model-server-metrics-scheme", "ftp"], "only http or https"),
        (["--tls-min-version", "VersionTLS13"], "VersionTLS13 cannot be enforced"),
        (["--tls-min-version", "VersionTLS10"], "never negotiates below TLS 1.2"),
        (["--tls-min-version", "TLS1.2"], "supported values: VersionTLS10"),
        (["--tls-cipher-suites", "TLS_RSA_WITH_RC4_128_SHA"], "TLS_RSA_WITH_RC4_128_SHA cannot be used"),
        (["--metrics-client-ca-file", "/nonexistent/ca.crt"], "needs --metrics-cert-dir"),
        (["--metrics-cert-dir", "/nonexistent", "--metrics-endpoint-auth=false"], "to anyone"),
        (["--metrics-cert-dir", "/nonexistent"], "tls.crt is missing"),
    ],
    ids=lambda v: str(v),
)
def test_values_that_cannot_be_honoured_are_refused(argv: list[str], fragment: str) -> None:
    problems = cli.check_options(parse("--pool-name", "demo", *argv))
    assert any(fragment in p for p in problems), problems


# The args the reference chart (GIE v1.5.0 config/charts/epplib, default values, vLLM, one replica) renders
# for the EPP container; `flags: {v: 1}` renders as `--v "1"`.
CHART_ARGS = [
    "--pool-name",
    "demo",
    "--pool-namespace",
    "llm",
    "--pool-group",
    "inference.networking.k8s.io",
    "--zap-encoder",
    "json",
    "--config-file",
    "/config/default-plugins.yaml",
    "--v",
    "1",
    "--tracing=false",
]


def test_reference_chart_args_parse_and_check() -> None:
    for extra in ([], ["--metrics-endpoint-auth=false"], ["--ha-enable-leader-election"]):
        opts = parse(*CHART_ARGS, *extra)
        assert cli.check_options(opts) == []
        assert (opts.pool_name, opts.pool_namespace, opts.pool_group) == ("demo", "llm", "inference.networking.k8s.io")
        assert opts.json_logs and opts.verbosity == 1 and opts.tracing is False
        assert opts.metrics_endpoint_auth is (extra != ["--metrics-endpoint-auth=false"])


def test_reference_chart_sglang_args_are_refused_as_upstream(capsys: pytest.CaptureFixture[str]) -> None:
    """For model servers other than vLLM the v1.5.0 chart still renders the legacy metric flags, which
    the reference itself refuses (see the reference notes)."""
    code = cli.main([*CHART_ARGS, '--total-queued-requests-metric="sglang:num_queue_reqs"'])
    assert code == 2
    assert "engineConfigs" in capsys.readouterr().err


def test_help_groups_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    out = capsys.readouterr().out
    for group in ("serving:", "observability:", "endpoint discovery", "deprecated"):
        assert group in out
    assert "--total-queued-requests-metric" not in out


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--pick-api-token-review"], "add --enable-pick-api"),
        (["--pick-api-port", "9100"], "add --enable-pick-api"),
        (["--enable-pick-api"], "needs client authentication"),
        (["--enable-pick-api", "--pick-api-client-ca-file", "ca.pem"], "needs --pick-api-port"),
        (["--enable-pick-api", "--pick-api-token-review"], "needs --pick-api-allowed-service-accounts"),
        (
            ["--enable-pick-api", "--pick-api-token-review", "--pick-api-allowed-service-accounts", "batch"],
            "namespace/name",
        ),
        (
            ["--enable-pick-api", "--pick-api-client-ca-file", "ca.pem", "--pick-api-port", "9002"],
            "must differ from --grpc-port",
        ),
        (
            [
                "--enable-pick-api",
                "--pick-api-client-ca-file",
                "c",
                "--pick-api-port",
                "9100",
                "--pick-api-max-leases",
                "5",
            ],
            "--pick-api-max-leases-per-caller <= --pick-api-max-leases",
        ),
    ],
    ids=[
        "token-without-enable",
        "port-without-enable",
        "enable-without-auth",
        "ca-on-the-ext-proc-port",
        "tokens-without-allowed-accounts",
        "malformed-account",
        "port-clash",
        "caps",
    ],
)
def test_pick_api_misconfigurations_are_explained(argv: list[str], fragment: str) -> None:
    problems = cli.check_options(parse("--endpoints", "10.0.0.1:8000", *argv))
    assert any(fragment in p for p in problems), problems


@pytest.mark.parametrize(
    "argv",
    [
        ["--enable-pick-api", "--pick-api-token-review", "--pick-api-allowed-service-accounts", "batch/*"],
        ["--enable-pick-api", "--pick-api-client-ca-file", "ca.pem", "--pick-api-port", "9100"],
    ],
    ids=["tokens-on-the-ext-proc-port", "mtls-on-its-own-port"],
)
def test_authenticated_pick_api_configurations_are_accepted(argv: list[str]) -> None:
    assert cli.check_options(parse("--endpoints", "10.0.0.1:8000", *argv)) == []


@pytest.mark.parametrize(("value", "seconds"), [("0s", 0.0), ("0", 0.0), ("90s", 90.0)], ids=str)
def test_drain_timeout_accepts_zero(value: str, seconds: float) -> None:
    assert parse("--endpoints", "10.0.0.1:8000", "--drain-timeout", value).drain_timeout == seconds


TOKEN_AUTH = ("--pick-api-token-review", "--pick-api-allowed-service-accounts", "ns/caller")


@pytest.mark.parametrize(
    ("argv", "transport"),
    [
        ([], "asyncio"),
        (["--enable-pick-api"], "asyncio"),  # the direct-routing API on the ext_proc port, served beside it
        (["--enable-pick-api", "--pick-api-port", "9100"], "asyncio"),
        (["--grpc-transport", "asyncio", "--enable-pick-api"], "asyncio"),
        (["--grpc-transport", "grpcio"], "grpcio"),
        (["--grpc-transport", "asyncio", "--enable-pick-api", "--pick-api-port", "9100"], "asyncio"),
    ],
)
def test_the_ext_proc_transport(argv: list[str], transport: str) -> None:
    if "--enable-pick-api" in argv:
        argv = [*argv, *TOKEN_AUTH]
    opts = parse("--endpoints", "10.0.0.1:8000", *argv)
    assert cli.check_options(opts) == []
    assert opts.ext_proc_transport() == transport


def test_only_known_transports_are_accepted() -> None:
    for gone_or_unknown in ("grpclib", "h2"):  # grpclib served the port before the asyncio server
        with pytest.raises(SystemExit):
            parse("--endpoints", "10.0.0.1:8000", "--grpc-transport", gone_or_unknown)
