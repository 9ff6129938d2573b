"""bench.stack with several replicas: each replica's agent, identity, CPUs and threads, from the processes
a deployment announced (no service started)."""
from __future__ import annotations

import pytest

from bench.stack import Stack, bench_config, service_of
from kvtb.launch import ServiceProcess


def announced(stack: Stack, name: str, **ready) -> None:
    proc = ServiceProcess(name, [], "/dev/null")
    proc.ready = ready
    stack.deployment.procs.append(proc)


def test_a_stack_of_two_replicas_reaches_each_replicas_agent(tmp_path):
    stack = Stack(tmp_path, bench_config(), replicas=2)
    assert stack.deployment.replicas == 2
    announced(stack, "storage-0", cpus="0-1")
    announced(stack, "smartnic", cpus="0-1", addresses={"grpc": "127.0.0.1:5001"})
    announced(stack, "compute", cpus="0", torch_threads=1)
    announced(stack, "smartnic-1", cpus="0-1", addresses={"grpc": "127.0.0.1:5002"})
    announced(stack, "compute-1", cpus="1", torch_threads=1)
    assert [stack.replica_agent(i) for i in (0, 1)] == ["127.0.0.1:5001", "127.0.0.1:5002"]
    assert stack.agent == "127.0.0.1:5001"                       # replica 0's, as with one replica
    assert stack.service_cpus() == {"storage": "0-1", "smartnic": "0-1", "compute": "0", "smartnic-1": "0-1",
                                    "compute-1": "1"}
    assert stack.compute_threads() == {"replica-0": 1, "replica-1": 1}
    with pytest.raises(IndexError):
        stack.replica_agent(2)


def test_a_stack_needs_a_replica_and_names_its_services():
    with pytest.raises(ValueError, match="at least one replica"):
        Stack("/tmp/unused", bench_config(), replicas=0)
    assert [service_of(n) for n in ("storage-1", "frontend", "smartnic", "compute-2")] == [
        "storage", "frontend", "smartnic", "compute-2"]


def test_a_stacks_directory_and_config_are_private(tmp_path, monkeypatch):
    import os
    import stat
    old = os.umask(0o022)
    try:
        stack = Stack(tmp_path / "stack", bench_config())
        monkeypatch.setattr(stack.deployment, "start", lambda storage: None)  # no service: the files alone
        with stack:
            assert stat.S_IMODE((tmp_path / "stack").stat().st_mode) == 0o700
            assert stat.S_IMODE(stack.config_path.stat().st_mode) == 0o600  # it holds the salt
    finally:
        os.umask(old)
