"""`serve --workers N` flags and `envoy-config --epp-workers N`."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from llm_epp import cli
from llm_epp.gateway import envoy_config as ec
from llm_epp.gateway.envoy_process import validate_config_file
from llm_epp.options import Options, worker_ports


def parse(*argv: str) -> Options:
    return cli._options(cli.build_parser().parse_args(["serve", "--endpoints", "10.0.0.1:8000", *argv]))


def test_one_worker_is_the_default_and_serves_in_process() -> None:
    opts = parse()
    assert opts.workers == 1
    assert cli.worker_problems(opts) == []


def test_default_worker_ports_skip_the_epps_other_ports() -> None:
    opts = parse("--workers", "3")  # 9002, then 9003 is the default health port
    assert cli.check_options(opts) == []
    assert opts.worker_ports() == (9002, 9004, 9005)
    opts = parse("--workers", "4", "--grpc-port", "9088", "--pick-api-port", "9089")
    assert opts.worker_ports() == (9088, 9091, 9092, 9093)  # 9089 Pick API, 9090 metrics
    moved = parse("--workers", "2", "--grpc-health-port", "9103")
    assert moved.worker_ports() == (9002, 9003)
    assert parse("--workers", "3", "--grpc-port", "0").worker_ports() == (0, 0, 0)  # any free port each
    assert cli.check_options(parse("--workers", "3", "--grpc-port", "0")) == []


def test_worker_ports_skip_any_listed_port() -> None:
    assert worker_ports(100, 1, (100, 101)) == (100,)
    assert worker_ports(100, 3, (101, 103, 99)) == (100, 102, 104)
    with pytest.raises(ValueError, match="past port 65535"):
        worker_ports(65533, 3, (65534,))


def test_another_port_on_the_grpc_port_is_refused() -> None:
    problems = cli.check_options(parse("--workers", "2", "--grpc-port", "9103", "--grpc-health-port", "9103"))
    assert problems == [
        "--grpc-health-port 9103 is the --grpc-port, where the first ext_proc worker listens: give "
        "--grpc-health-port another port"
    ]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--workers", "0"], "--workers must be between 1 and 64, got 0"),
        (["--workers", "65"], "--workers must be between 1 and 64, got 65"),
        (
            ["--workers", "2", "--enable-grpc-stream-metrics"],
            "--enable-grpc-stream-metrics is not supported with --workers 2",
        ),
        (["--workers", "2", "--grpc-port", "65535"], "runs past port 65535"),
        (["--workers", "2", "--grpc-port", "9080", "--metrics-port", "9080"], "--metrics-port 9080 is the --grpc-port"),
        (["--workers", "2", "--grpc-port", "65534", "--metrics-port", "65535"], "runs past port 65535"),
    ],
)
def test_unsupported_worker_combinations_are_refused_with_the_reason(argv: list[str], expected: str) -> None:
    problems = cli.check_options(parse("--grpc-health-port", "9103", *argv))
    assert any(expected in p for p in problems), problems


def test_the_pick_api_needs_its_own_port_with_workers() -> None:
    problems = cli.worker_problems(parse("--workers", "2", "--grpc-health-port", "9103", "--enable-pick-api"))
    assert problems == [
        "--enable-pick-api without --pick-api-port is not supported with --workers 2: the ext_proc ports belong "
        "to the workers; give the API its own --pick-api-port"
    ]


CALLER = ("--pick-api-allowed-service-accounts", "ns/caller")


def _envoy_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    ec.add_arguments(parser)
    return parser.parse_args(list(argv))


def _epp_endpoints(doc: dict[str, object]) -> list[int]:
    clusters = doc["static_resources"]["clusters"]  # type: ignore[index]
    epp = next(c for c in clusters if c["name"] == "epp")
    return [
        e["endpoint"]["address"]["socket_address"]["port_value"]
        for e in epp["load_assignment"]["endpoints"][0]["lb_endpoints"]
    ]


def test_envoy_config_lists_every_worker_port_as_an_epp_endpoint(tmp_path: Path) -> None:
    opts = ec.options_from_args(_envoy_args("--epp-port", "9002", "--epp-workers", "3"))
    doc = ec.build_bootstrap(opts)
    assert _epp_endpoints(doc) == [9002, 9004, 9005]  # the ports serve --workers 3 listens on
    assert _epp_endpoints(ec.build_bootstrap(ec.options_from_args(_envoy_args()))) == [9002]
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = validate_config_file(path)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("serve", "envoy"),
    [
        ([], []),
        (["--grpc-health-port", "9103"], ["--epp-grpc-health-port", "9103"]),
        (
            ["--grpc-port", "9088", "--enable-pick-api", "--pick-api-port", "9089", "--pick-api-token-review", *CALLER],
            ["--epp-port", "9088", "--epp-pick-api-port", "9089"],
        ),
        (
            ["--grpc-port", "7000", "--metrics-port", "7002", "--grpc-health-port", "7001"],
            ["--epp-port", "7000", "--epp-metrics-port", "7002", "--epp-grpc-health-port", "7001"],
        ),
    ],
)
def test_envoy_config_and_serve_agree_on_worker_ports(serve: list[str], envoy: list[str]) -> None:
    opts = parse("--workers", "4", *serve)
    assert cli.check_options(opts) == []
    listed = ec.options_from_args(_envoy_args("--epp-workers", "4", *envoy)).epp_ports
    assert listed == opts.worker_ports()
    assert len(set(listed)) == 4
    assert not set(listed) & {port for _, port in opts.other_ports()}


@pytest.mark.parametrize(
    ("argv", "expected"),
    [(["--epp-workers", "0"], "at least 1"), (["--epp-port", "65535", "--epp-workers", "2"], "past port 65535")],
)
def test_envoy_config_refuses_impossible_worker_ports(argv: list[str], expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        ec.options_from_args(_envoy_args(*argv))
