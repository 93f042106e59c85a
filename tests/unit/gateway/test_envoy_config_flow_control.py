"""`llm-epp envoy-config --epp-config`: the ext_proc message timeout covers flow-control queueing."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from llm_epp.gateway import envoy_config as ec

ROUTER = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n"
GIE = ROUTER.replace("llm-d.ai/v1alpha1", "inference.networking.x-k8s.io/v1alpha1")


def _timeout(tmp_path: Path, config: str, *extra: str, capsys: pytest.CaptureFixture[str]) -> str:
    path = tmp_path / "epp.yaml"
    path.write_text(config)
    parser = argparse.ArgumentParser()
    ec.add_arguments(parser)
    assert ec.run(parser.parse_args(["--epp-config", str(path), *extra])) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    filters = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
    (ext_proc,) = [f["typed_config"] for f in filters if f["name"] == "envoy.filters.http.ext_proc"]
    return str(ext_proc["message_timeout"])


def test_a_long_ttl_raises_the_message_timeout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = ROUTER + "featureGates: [flowControl]\nflowControl: {defaultRequestTTL: 25m}\n"
    assert _timeout(tmp_path, config, capsys=capsys) == "1510s"


def test_without_flow_control_the_default_stays(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _timeout(tmp_path, ROUTER, capsys=capsys) == "1000s"


def test_unbounded_queueing_takes_the_longest_timeout_and_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text(GIE + "featureGates: [flowControl]\n")
    parser = argparse.ArgumentParser()
    ec.add_arguments(parser)
    assert ec.run(parser.parse_args(["--epp-config", str(path)])) == 0
    out = capsys.readouterr()
    assert "message_timeout: 3600s" in out.out
    assert "without a time limit" in out.err and "set defaultRequestTTL" in out.err


@pytest.mark.parametrize(
    ("config", "extra", "fragment"),
    [
        ("flowControl: {defaultRequestTTL: 2h}\n", (), "longer than Envoy's message timeout can be"),
        ("flowControl: {defaultRequestTTL: 60s}\n", ("--message-timeout", "30"), "use at least 70"),
    ],
)
def test_timeouts_that_cannot_cover_the_queue_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], config: str, extra: tuple[str, ...], fragment: str
) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text(ROUTER + "featureGates: [flowControl]\n" + config)
    parser = argparse.ArgumentParser()
    ec.add_arguments(parser)
    assert ec.run(parser.parse_args(["--epp-config", str(path), *extra])) == 2
    assert fragment in capsys.readouterr().err
