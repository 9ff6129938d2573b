"""The agent as a real process with real storage nodes; this test process plays the compute node
(a registered pool, and a ComputeNode server the agent forwards turns to)."""
from __future__ import annotations

import concurrent.futures
import contextlib

import grpc
import pytest

from kvtb.rpc import add_port
from kvtb_proto import compute_pb2_grpc, smartnic_pb2_grpc
from tests.conftest import as_identity, secure_channel
from tests.smartnic.helpers import LAYOUT, FakeCompute, Pool, agent_env, storage_env


@pytest.fixture
def storage(start_service, tmp_path):
    return [("s0", start_service("storage-s0", "serve", "storage", env=storage_env(tmp_path, "s0")))]


@pytest.fixture
def agent(start_service, storage):
    proc = start_service("agent", "serve", "smartnic", env=agent_env(storage))
    channel = secure_channel(proc.addresses["grpc"], peer="smartnic")
    yield proc, smartnic_pb2_grpc.SmartNicStub(channel)
    channel.close()


@contextlib.contextmanager
def compute_beside(agent_address: str, layout=LAYOUT):
    """This process as a compute node of the agent: (pool, fake compute node, channel to the agent),
    the pool (of `layout`) registered with the fake's address."""
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(8))
    port = add_port(server, "127.0.0.1:0", as_identity("compute"))
    channel = secure_channel(agent_address, peer="smartnic")
    pool = Pool(smartnic_pb2_grpc.SmartNicStub(channel), layout, compute_address=f"127.0.0.1:{port}")
    fake = FakeCompute(pool)
    compute_pb2_grpc.add_ComputeNodeServicer_to_server(fake, server)
    server.start()
    try:
        yield pool, fake, channel
    finally:
        pool.close()
        channel.close()
        server.stop(0)


@pytest.fixture
def compute(agent):
    """(pool, fake compute node, channel to the agent) beside the `agent` fixture's agent."""
    with compute_beside(agent[0].addresses["grpc"]) as triple:
        yield triple
