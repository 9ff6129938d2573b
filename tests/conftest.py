"""Fixtures shared by every test package: real service processes with clean-up."""
from __future__ import annotations

import os

import pytest

from kvtb.launch import ServiceProcess, kvtb_argv

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Tests leave the fixed HTTP and metrics ports to a `kvtb up` on this machine.
FREE_SIDE_PORTS = {f"KVTB_{s}_METRICS_ADDRESS": "127.0.0.1:0"
                   for s in ("STORAGE", "SMARTNIC", "COMPUTE", "FRONTEND")}
FREE_SIDE_PORTS["KVTB_FRONTEND_HTTP_ADDRESS"] = "127.0.0.1:0"


@pytest.fixture
def start_service(tmp_path):
    """Start `kvtb ARGS` as a real process; every one started is stopped after the test.

    Usage: `proc = start_service("storage", "serve", "storage", "--config", cfg)`;
    `proc.addresses` holds what the service announced.
    """
    started: list[ServiceProcess] = []

    def start(name: str, *args: str, env: dict[str, str] | None = None,
              timeout_s: float = 180.0) -> ServiceProcess:
        proc = ServiceProcess(name, kvtb_argv(*args), tmp_path / "logs" / f"{name}.log",
                              env={**FREE_SIDE_PORTS, **(env or {})})
        started.append(proc)
        proc.start(timeout_s=timeout_s)
        return proc

    yield start
    for proc in reversed(started):
        proc.stop()
