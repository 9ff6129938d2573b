"""Fixtures shared by every test package: real service processes with clean-up."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

from fabric.auth import FabricSecurity
from fabric.client import FabricClient
from kvtb import credentials
from kvtb.launch import ServiceProcess, kvtb_argv
from kvtb.rpc import Security, channel
from tests import process_guard
from tests.process_guard import (  # noqa: F401 (hooks)
    pytest_fixture_setup,
    pytest_runtest_makereport,
    pytest_runtest_protocol,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Under pytest-xdist (`make test` runs two workers) two tests share the two cores. An OpenMP team spins
# while it waits for its threads, so beside another test a compute node's two torch threads decoded 10-20x
# slower (a real-model test of 6 s took 128 s). So each worker's own torch, and every compute node a test
# starts (unless the test says otherwise), takes one thread: the cores go to the two workers instead.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("KVTB_COMPUTE_TORCH_THREADS", "1")
    import torch
    torch.set_num_threads(1)


def pytest_addoption(parser):
    process_guard.addoption(parser)


# Fixtures that start a process (a service, a stack, a child): every test that uses one is a service
# test (tests/process_guard.py; `make test-unit` leaves them out).
SERVICE_FIXTURES = frozenset({
    "start_service",                      # any service, by its command line
    "triggered", "paper_records",         # tests/e2e: `kvtb up` under the paper's policy, shared
    "replicas", "one_replica", "heal",    # tests/e2e: replicas
    "cluster", "small_pool", "failing",   # tests/compute_node: real-model stacks
    "node",                               # tests/compute_node, tests/storage_node: a node process
    "smoke_study",                        # tests/bench/study: a study's smoke run
})


# `make test` runs on two workers (pytest-xdist, --dist loadgroup): each module stays on one worker, so
# a module-scoped stack starts once; the tests that share a session-scoped stack form one group, so it
# starts once too.
SESSION_STACKS = {"triggered": "e2e-kvtb-up-triggered", "paper_records": "e2e-kvtb-up-triggered"}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    process_guard.mark_services(items, SERVICE_FIXTURES)
    for item in items:
        group = next((g for f, g in SESSION_STACKS.items() if f in getattr(item, "fixturenames", ())), None)
        if group and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))

# One deployment's credentials for the whole run, made as `kvtb up` makes them: every service a
# test starts (in this process or as a child) finds them through KVTB_CREDENTIALS_DIR, so the
# tests run with security on, as a user's deployment does.
CREDENTIALS = credentials.init(tempfile.mkdtemp(prefix="kvtb-test-credentials-"))
os.environ[credentials.ENV_DIR] = str(CREDENTIALS)
atexit.register(shutil.rmtree, CREDENTIALS, ignore_errors=True)  # a run leaves no keys behind in /tmp


def as_identity(identity: str = "operator") -> Security:
    """This test run's security as one of the deployment's identities."""
    return Security.of(identity, str(CREDENTIALS))


def secure_channel(address: str, peer: str = "", identity: str = "operator"):
    """A mutual-TLS channel to a service of this run (as the operator, unless told otherwise)."""
    return channel(address, as_identity(identity), peer=peer)

TEST_HOST = "nqn.2026-11.org.kvtestbed:test"  # the tests' own fabric host (storage_env allows it)


def fabric_security(host_nqn: str, mode: str = "auth") -> FabricSecurity:
    """A fabric host's security in this run's deployment: its own key, derived from the master."""
    return FabricSecurity.for_host(mode, str(CREDENTIALS), host_nqn)


def fabric_client(address: str, host_nqn: str = TEST_HOST, mode: str = "auth", **kwargs) -> FabricClient:
    """A FabricClient (not connected yet) that authenticates as host_nqn."""
    return FabricClient(address, host_nqn, security=fabric_security(host_nqn, mode), **kwargs)


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
