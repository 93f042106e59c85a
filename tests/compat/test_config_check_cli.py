"""`llm-epp config check [--strict]`: unknown plugin parameters are warnings (GIE v1.5.0 ignores them), or
errors under --strict (llm-d-router rejects them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_epp import cli

CONFIG = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: max-score-picker
  parameters: {maxNumOfEndpoint: 2}
"""


def test_unknown_parameters_are_warnings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text(CONFIG)
    assert cli.main(["config", "check", str(path)]) == 0
    out, err = capsys.readouterr()
    assert f"{path}: valid with warnings" in out
    assert (
        f"{path}: warning: plugins[1].parameters.maxNumOfEndpoint: unknown parameter of 'max-score-picker' "
        "(max-score-picker), ignored; did you mean 'maxNumOfEndpoints'?"
    ) in err
    assert "metrics: metrics-data-source/metrics-data-source -> core-metrics-extractor" in out


def test_strict_fails_on_unknown_parameters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text(CONFIG)
    assert cli.main(["config", "check", "--strict", str(path)]) == 1
    err = capsys.readouterr().err
    assert "plugins[1].parameters.maxNumOfEndpoint: unknown parameter of 'max-score-picker'" in err
    assert "did you mean 'maxNumOfEndpoints'?" in err


def test_a_clean_config_has_no_warnings_even_under_strict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "epp.yaml"
    path.write_text(CONFIG.replace("maxNumOfEndpoint:", "maxNumOfEndpoints:"))
    assert cli.main(["config", "check", "--strict", str(path)]) == 0
    out, err = capsys.readouterr()
    assert f"{path}: valid\n" in out and err == ""
