"""`llm-epp pd-sidecar` flags: upstream names, defaults, and clear refusals of what is not supported yet."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_epp.cli import build_parser, main
from llm_epp.pdsidecar.cli import config_from_args


def _config(*argv: str) -> tuple[object, list[str]]:
    args = build_parser("pd-sidecar").parse_args(["pd-sidecar", *argv])
    return config_from_args(args)


def test_defaults() -> None:
    config, problems = _config()
    assert problems == []
    assert config.decoder_url == "http://127.0.0.1:8200"  # type: ignore[attr-defined]
    assert config.kv_connector == "nixlv2"  # type: ignore[attr-defined]
    assert not config.allowlist.enabled  # type: ignore[attr-defined]
    assert not config.enable_prefiller_sampling  # type: ignore[attr-defined]


def test_upstream_flags(tmp_path: Path) -> None:
    pool = tmp_path / "pool.yaml"
    pool.write_text("endpoints:\n  - address: 10.0.0.5\n    port: 8000\n")
    config, problems = _config(
        "--vllm-port", "8001", "--kv-connector", "sglang", "--enable-prefiller-sampling",
        "--enable-ssrf-protection", "--allowed-prefill-targets", "10.0.0.9", "--endpoints-file", str(pool),
    )  # fmt: skip
    assert problems == []
    assert config.decoder_url == "http://127.0.0.1:8001"  # type: ignore[attr-defined]
    assert config.kv_connector == "sglang"  # type: ignore[attr-defined]
    assert config.enable_prefiller_sampling  # type: ignore[attr-defined]
    allowlist = config.allowlist  # type: ignore[attr-defined]
    assert allowlist.allows("10.0.0.5:8000") and allowlist.allows("10.0.0.9:1234")
    assert not allowlist.allows("10.0.0.5:9000") and not allowlist.allows("169.254.169.254:80")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--kv-connector", "shared-storage"], "--kv-connector shared-storage is not supported yet"),
        (["--kv-connector", "bogus"], "unknown"),
        (["--decode-chunk-size", "256"], "--decode-chunk-size is not supported yet"),
        (["--inference-pool", "default/pool"], "--endpoints-file"),
        (["--secure-serving=true"], "--secure-serving is not supported yet"),
        (["--enable-ssrf-protection"], "needs --allowed-prefill-targets"),
        (["--allowed-prefill-targets", "10.0.0.1"], "only with --enable-ssrf-protection"),
        (["--enable-ssrf-protection", "--allowed-prefill-targets", "10.0.0.1:99999"], "allow-list"),
        (["--port", "0"], "--port 0"),
        (["--prefill-retry-backoff", "soon"], "--prefill-retry-backoff"),
        (["--prefill-max-retries", "-1"], "--prefill-max-retries must be >= 0"),
    ],
)
def test_refusals(argv: list[str], message: str) -> None:
    _, problems = _config(*argv)
    assert any(message in p for p in problems), problems


def test_prefill_retries() -> None:
    config, problems = _config("--prefill-max-retries", "3", "--prefill-retry-backoff", "1.5s")
    assert problems == []
    assert (config.prefill_max_retries, config.prefill_retry_backoff_s) == (3, 1.5)  # type: ignore[attr-defined]


def test_main_exits_2_with_the_problem(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pd-sidecar", "--kv-connector", "mooncake"]) == 2
    assert "mooncake is not supported yet" in capsys.readouterr().err
