"""The compute node's registration survives an agent restart (real agent and storage processes)."""
from __future__ import annotations

import threading
import time
import types
import uuid

import pytest

from compute_node.agent_client import AgentClient
from kvtb.launch import free_port
from hostmem.region import Region
from tests.conftest import as_identity
from tests.smartnic.helpers import LAYOUT, agent_env, storage_env


@pytest.mark.slow
def test_registers_again_after_the_agent_restarts(start_service, tmp_path):
    storage = start_service("storage", "serve", "storage", env=storage_env(tmp_path, "storage-0"))
    address = f"127.0.0.1:{free_port()}"
    env = {**agent_env([("storage-0", storage)]), "KVTB_SMARTNIC_LISTEN_ADDRESS": address}
    agent = start_service("agent", "serve", "smartnic", env=env)
    region = Region.create(f"kvtb-test-{uuid.uuid4().hex[:12]}", LAYOUT.region_bytes,
                           LAYOUT.counter_offset, LAYOUT.counter_count)
    client = AgentClient(address, as_identity("compute"), timeout_s=5.0)
    try:
        client.register(types.SimpleNamespace(region=region, layout=LAYOUT), "key", "test", "", 10.0)
        assert client.ensure_registered()  # known: nothing to do
        agent.stop()
        assert not client.ensure_registered()  # unreachable: try later
        start_service("agent-again", "serve", "smartnic", env=env)
        stop = threading.Event()
        client.keep_registered(stop, interval_s=0.1)
        try:
            deadline = time.monotonic() + 20
            while not client.ensure_registered():  # the keeper may be registering right now
                assert time.monotonic() < deadline, "not registered again"
                time.sleep(0.1)
            region.store_counter(0, 7)
            assert client.stub.CounterRead(client.counter_ref(0), timeout=5).success == 7
        finally:
            stop.set()
    finally:
        client.close()
        region.close()
