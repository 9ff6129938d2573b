"""Fixtures for the integration tests across containers (`make compose-test`).

They run only when KVTB_COMPOSE_TEST=1 (set by `make compose-test`, which also builds the
image and starts the Docker engine); `make test` skips them.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from chat_client.client import FrontendClient
from kvtb.grpc_health import wait_serving
from kvtb.launch import free_port

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "deploy" / "docker-compose.yml"
IMAGE = os.environ.get("KVTB_IMAGE", "kvtb:latest")
PROMETHEUS_IMAGE = os.environ.get("KVTB_PROMETHEUS_IMAGE", "kvtb-prometheus:latest")
REPLICAS_PROFILE = "replicas"
MONITORING_PROFILE = "monitoring"
# the frontend's two replicas (the compose file's second pair is under profile `replicas`)
TWO_REPLICAS = "replica-0=smartnic:50051=smartnic,replica-1=smartnic1:50051=smartnic-1"


def pytest_collection_modifyitems(config, items):
    if os.environ.get("KVTB_COMPOSE_TEST") == "1":
        return
    skip = pytest.mark.skip(reason="container tests run with `make compose-test`")
    for item in items:
        if "compose" in item.keywords:
            item.add_marker(skip)




def compose_command() -> list[str]:
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    return [shutil.which("docker-compose") or "docker-compose"]


class Deployment:
    """A compose project of kvtestbed started for one test module."""

    def __init__(self, project: str, port: int):
        self.project = project
        self.port = port
        self.env = {**os.environ, "KVTB_IMAGE": IMAGE, "KVTB_FRONTEND_PORT": str(port),
                    "KVTB_HTTP_PORT": str(free_port()), "KVTB_PROMETHEUS_IMAGE": PROMETHEUS_IMAGE,
                    "KVTB_PROMETHEUS_PORT": str(free_port())}

    def compose(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        cmd = [*compose_command(), "-p", self.project, "-f", str(COMPOSE_FILE), *args]
        result = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        return result

    def container(self, service: str) -> str:
        return self.compose("ps", "-q", service).stdout.strip()

    def docker(self, *args: str) -> None:
        subprocess.run(["docker", *args], check=True, capture_output=True, timeout=120)

    def wait_healthy(self, service: str, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        cid = self.container(service)
        while time.monotonic() < deadline:
            out = subprocess.run(["docker", "inspect", "-f", "{{.State.Health.Status}}", cid],
                                 capture_output=True, text=True).stdout.strip()
            if out == "healthy":
                return
            time.sleep(1)
        raise AssertionError(f"{service} not healthy after {timeout_s} s:\n{self.logs(service)}")

    def add_profile(self, profile: str) -> None:
        """Compose's later commands see this profile's services too (and those of the profiles before)."""
        profiles = [p for p in self.env.get("COMPOSE_PROFILES", "").split(",") if p]
        self.env["COMPOSE_PROFILES"] = ",".join(dict.fromkeys([*profiles, profile]))

    def add_second_replica(self) -> None:
        """Start the second pair (profile replicas) in this project and recreate the frontend with both in
        its list (its conversations stay in its volume); until both pairs are healthy and the frontend answers."""
        self.add_profile(REPLICAS_PROFILE)
        self.env["KVTB_FRONTEND_REPLICAS"] = TWO_REPLICAS
        self.compose("up", "-d", timeout=900)
        for service in ("compute1", "smartnic1", "frontend"):
            self.wait_healthy(service, timeout_s=300)
        assert wait_serving(f"127.0.0.1:{self.port}", 60)
        deadline, metrics = time.monotonic() + 60, ""
        while time.monotonic() < deadline:  # until the frontend's health loop has both in its rotation
            metrics = self.frontend_metrics()
            if all(f'kvtb:replica_up{{replica="replica-{i}"}} 1' in metrics for i in (0, 1)):
                return
            time.sleep(1)
        raise AssertionError(f"the frontend did not put both replicas in its rotation:\n"
                             f"{[line for line in metrics.splitlines() if 'replica' in line]}\n{self.logs('frontend')}")

    def start_monitoring(self) -> None:
        """Start Prometheus (profile monitoring) in this project."""
        self.add_profile(MONITORING_PROFILE)
        self.compose("up", "-d", "prometheus")

    def prometheus(self, path: str, **params: str) -> dict:
        """The `data` of Prometheus's HTTP API answer at PATH (/api/v1/query, ...), by its published port."""
        url = f"http://127.0.0.1:{self.env['KVTB_PROMETHEUS_PORT']}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.loads(response.read())
        assert body["status"] == "success", body
        return body["data"]

    def frontend_metrics(self) -> str:
        """The frontend's /metrics, read inside its container (its metrics port is not published)."""
        script = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:9100/metrics').read().decode())"
        result = subprocess.run(["docker", "exec", self.container("frontend"), "python3", "-c", script],
                                capture_output=True, text=True, timeout=60)
        return result.stdout

    def turn(self, token: str, message: str, context_id: str = "", max_new_tokens: int = 32):
        """(streamed text, TurnSummary) of one turn through the published port (gRPC, as `kvtb chat` does)."""
        client = FrontendClient(f"127.0.0.1:{self.port}", token)
        try:
            texts, summary = [], None
            for event in client.chat(message, context_id, max_new_tokens):
                if event.WhichOneof("event") == "text":
                    texts.append(event.text)
                elif event.WhichOneof("event") == "summary":
                    summary = event.summary
        finally:
            client.close()
        assert summary is not None, f"no summary for {message!r}"
        return "".join(texts), summary

    def logs(self, service: str) -> str:
        return self.compose("logs", "--no-color", "--tail", "60", service, check=False).stdout

    def chat(self, *messages: str, context: str | None = None, timeout: float = 300,
             token: str | None = None) -> list[dict]:
        """Chat from the host through the published port; one JSON record per turn."""
        script = ROOT / "var" / f"compose-script-{os.getpid()}-{time.monotonic_ns()}.txt"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text("\n".join(messages) + "\n")
        cmd = [str(ROOT / ".venv" / "bin" / "kvtb"), "chat", "--frontend", f"127.0.0.1:{self.port}",
               "--script", str(script), "--json", "--max-new-tokens", "32"]
        if context:
            cmd += ["--context", context]
        if token:
            cmd += ["--token", token]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        script.unlink()
        assert result.returncode == 0, f"chat failed: {result.stderr}"
        return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def deployment():
    dep = Deployment(f"kvtbtest{os.getpid()}", free_port())
    try:
        dep.compose("up", "-d", timeout=900)
        for service in ("storage0", "storage1", "compute", "smartnic", "frontend"):
            dep.wait_healthy(service)
        assert wait_serving(f"127.0.0.1:{dep.port}", 60)
        yield dep
    finally:
        dep.add_profile(REPLICAS_PROFILE)  # down stops every profile's services, started or not
        dep.add_profile(MONITORING_PROFILE)
        dep.compose("down", "-v", "--timeout", "20", check=False)
