"""Runs `llm-epp serve` as a child process on free loopback ports (tests, the demo and benchmarks).

with EppProcess("--endpoints", "127.0.0.1:8001", "--secure-serving=false") as epp:
    envoy_options = EnvoyConfigOptions(epp_port=epp.grpc_port, epp_tls=False)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any


class EppProcess:
    def __init__(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        startup_timeout: float = 30.0,
        log_path: str | Path | None = None,
    ) -> None:
        self.args = list(args)
        self.env = env
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.ports: dict[str, int] = {}
        self._dir = Path(tempfile.mkdtemp(prefix="llm-epp-"))
        self.log_path = Path(log_path) if log_path else self._dir / "epp.log"

    @property
    def grpc_port(self) -> int:
        return self.ports["grpc"]

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['metrics']}/metrics"

    def start(self) -> EppProcess:
        ports_file = self._dir / "ports.json"
        exe = str(Path(sys.executable).parent / "llm-epp")
        cmd = [
            exe,
            "serve",
            "--bind-address",
            "127.0.0.1",
            "--grpc-health-port",
            "0",
            "--metrics-port",
            "0",
            "--ports-file",
            str(ports_file),
            *self.args,
        ]
        if "--grpc-port" not in self.args:
            cmd += ["--grpc-port", "0"]
        if not any(a.startswith("--tracing") for a in self.args):
            cmd.append("--tracing=false")  # a loopback stack has no collector; the default exporter is the console
        if not any(a.startswith("--drain-timeout") for a in self.args):
            cmd += ["--drain-timeout", "0s"]  # stop() at once unless a test exercises the drain
        env = {**os.environ, **(self.env or {})}
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.startup_timeout
        while not ports_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"llm-epp did not start:\n{self.log()}")
            time.sleep(0.05)
        self.ports = json.loads(ports_file.read_text())
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as resp:
            text: str = resp.read().decode()
        return text

    def metric_value(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        total = 0.0
        for line in self.metrics().splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            head, _, value = line.rpartition(" ")
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
        return total

    def wait_metric(self, name: str, expected: float, timeout: float = 10.0, **labels: str) -> float:
        """Polls until the metric reaches `expected` (the EPP records completion just after the last
        byte is forwarded, so a client can finish reading first). Returns the last value seen."""
        deadline = time.monotonic() + timeout
        value = self.metric_value(name, **labels)
        while value != expected and time.monotonic() < deadline:
            time.sleep(0.02)
            value = self.metric_value(name, **labels)
        return value

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if getattr(self, "_log", None) is not None:
            self._log.close()

    def __enter__(self) -> EppProcess:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
