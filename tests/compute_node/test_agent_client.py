"""The compute node's registration survives an agent restart (real agent and storage processes), and
keeping it costs no RPC while the connection to the agent stays up."""
from __future__ import annotations

import threading
import time
import types
import uuid

import grpc
import pytest

from compute_node.agent_client import AgentClient
from hostmem.region import Region
from kvtb.launch import free_port
from tests.conftest import as_identity
from tests.kvtb.metrics_scrape import scrape
from tests.smartnic.helpers import LAYOUT, agent_env, storage_env


def compute_calls(agent) -> dict[str, float]:
    """The agent's count of the calls the compute node made, by method (its /metrics)."""
    return {dict(labels)["method"].rsplit("/", 1)[1]: v
            for (name, labels), v in scrape(agent.addresses["metrics"]).items()
            if name == "kvtb:agent_rpc_calls_total" and dict(labels)["peer"] == "compute"}


def agent_and_client(start_service, tmp_path):
    """A storage node and an agent (its env, to start it again), a region and a client of the agent."""
    storage = start_service("storage", "serve", "storage", env=storage_env(tmp_path, "storage-0"))
    address = f"127.0.0.1:{free_port()}"
    env = {**agent_env([("storage-0", storage)]), "KVTB_SMARTNIC_LISTEN_ADDRESS": address}
    agent = start_service("agent", "serve", "smartnic", env=env)
    region = Region.create(f"kvtb-test-{uuid.uuid4().hex[:12]}", LAYOUT.region_bytes,
                           LAYOUT.counter_offset, LAYOUT.counter_count)
    return env, agent, region, AgentClient(address, as_identity("compute"), timeout_s=5.0)


@pytest.mark.slow
def test_registers_again_after_the_agent_restarts(start_service, tmp_path):
    env, agent, region, client = agent_and_client(start_service, tmp_path)
    stop = threading.Event()
    try:
        client.register(types.SimpleNamespace(region=region, layout=LAYOUT), "key", "test", "", 10.0)
        client.keep_registered(stop, interval_s=0.1)
        time.sleep(1.5)  # fifteen intervals with the connection up: nothing to ask
        assert compute_calls(agent) == {"RegisterMemory": 1}
        assert client.ensure_registered()  # known: nothing to do
        agent.stop()
        again = start_service("agent-again", "serve", "smartnic", env=env)
        deadline = time.monotonic() + 20
        while not compute_calls(again).get("RegisterMemory"):  # the keeper alone registers it again
            assert time.monotonic() < deadline, "not registered again"
            time.sleep(0.1)
        assert compute_calls(again)["CounterRead"] >= 1  # it asked whether the region was known
        region.store_counter(0, 7)
        while True:  # the keeper sets the new region id once RegisterMemory's answer is in
            try:
                assert client.stub.CounterRead(client.counter_ref(0), timeout=5).success == 7
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.NOT_FOUND and time.monotonic() < deadline, exc
                time.sleep(0.05)
    finally:
        stop.set()
        client.close()
        region.close()


@pytest.mark.slow
def test_the_keeper_says_when_the_agent_is_gone_and_when_it_is_back(start_service, tmp_path):
    env, agent, region, client = agent_and_client(start_service, tmp_path)
    stop, changes = threading.Event(), []
    try:
        client.register(types.SimpleNamespace(region=region, layout=LAYOUT), "key", "test", "", 10.0)
        client.keep_registered(stop, interval_s=0.1, on_change=changes.append)
        time.sleep(0.5)
        assert changes == []
        agent.kill()  # as kill -9 would
        deadline = time.monotonic() + 20
        while changes != [False]:
            assert time.monotonic() < deadline and len(changes) <= 1, changes
            time.sleep(0.05)
        start_service("agent-again", "serve", "smartnic", env=env)
        back = time.monotonic()
        while changes != [False, True]:
            assert time.monotonic() < deadline + 40, changes
            time.sleep(0.05)
        assert time.monotonic() - back < 10  # dialled again within its 2 s backoff, not gRPC's 120 s
        assert client.ensure_registered()
    finally:
        stop.set()
        client.close()
        region.close()
