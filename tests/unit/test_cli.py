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
    assert opts.verbosity == 2


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["--secure-serving=false"], "secure_serving", False),
        (["--secure-serving"], "secure_serving", True),
        (["--secure-serving", "False"], "secure_serving", False),
        (["--refresh-metrics-interval", "200ms"], "refresh_metrics_interval", 0.2),
        (["--metrics-staleness-threshold=1m"], "metrics_staleness_threshold", 60.0),
        (["--max-request-body-bytes", "4Mi"], "max_request_body_bytes", 4 << 20),
        (["--v", "4"], "verbosity", 4),
        (["-v", "5"], "verbosity", 5),
        (["--zap-encoder", "json"], "json_logs", True),
    ],
    ids=["go-bool-false", "bare-bool", "bool-word", "duration-ms", "duration-m", "size-mi", "v", "short-v", "json"],
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
