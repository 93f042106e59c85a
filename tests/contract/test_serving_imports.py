"""`llm-epp serve` loads only what serving needs: neither the simulator nor the gateway tools (checked in a
fresh interpreter, where `sys.modules` shows everything the imports pulled in)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

NOT_FOR_SERVING = ("llm_epp.sim", "llm_epp.gateway")


def _loaded_after(code: str) -> list[str]:
    script = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    modules: list[str] = json.loads(proc.stdout.splitlines()[-1])
    return [m for m in modules if m.startswith(NOT_FOR_SERVING)]


@pytest.mark.parametrize(
    "code",
    [
        "import llm_epp.app",
        "import llm_epp.composition",
        "from llm_epp import cli; cli.build_parser('serve').parse_args(['serve', '--endpoints', '127.0.0.1:8000'])",
        "from llm_epp import cli; cli.build_parser(None)",
        "from llm_epp import cli; from llm_epp.app import build; build(cli._options("
        "cli.build_parser('serve').parse_args(['serve', '--endpoints', '127.0.0.1:8000'])))",
    ],
    ids=["app", "composition", "serve-parser", "help-parser", "serve-build"],
)
def test_the_serving_path_does_not_import_the_simulator_or_gateway_tools(code: str) -> None:
    assert _loaded_after(code) == []


def test_the_sim_and_envoy_config_subcommands_still_get_their_arguments() -> None:
    loaded = _loaded_after("from llm_epp import cli; cli.build_parser('sim'); cli.build_parser('envoy-config')")
    assert "llm_epp.sim.cli" in loaded and "llm_epp.gateway.envoy_config" in loaded
