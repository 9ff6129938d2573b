"""The fire ring on (`watcher_fire_ring`): the compiled poller's own thread polls and checks, and hands
each fire through its ring to a thread that issues the PUT. The agent's contract holds as without it, in
the agent's thread fast path and in the fast path's own busy process: blocks leave by their descriptors
and come back bit-identical, refusals are counted and the block re-armed, a PUT reads the block when it
fires."""
from __future__ import annotations

import pytest

from kvtb_proto import smartnic_pb2_grpc
from smartnic import standing
from tests.conftest import secure_channel
from tests.smartnic import test_agent_service as contract
from tests.smartnic.conftest import compute_beside
from tests.smartnic.helpers import agent_env

pytestmark = [pytest.mark.service,
              pytest.mark.skipif(standing._poller is None, reason="the compiled poller was not built")]


@pytest.fixture(params=["thread", "process"])
def agent(request, start_service, storage):
    extra = {"fastpath": request.param, "watcher_fire_ring": "true"}
    if request.param == "process":
        extra["watcher_busy_poll"] = "true"
    proc = start_service("agent", "serve", "smartnic", env=agent_env(storage, **extra))
    channel = secure_channel(proc.addresses["grpc"], peer="smartnic")
    yield proc, smartnic_pb2_grpc.SmartNicStub(channel)
    channel.close()


@pytest.fixture
def compute(agent):
    with compute_beside(agent[0].addresses["grpc"]) as triple:
        yield triple


def test_blocks_leave_by_descriptor_and_come_back_bit_identical(compute, storage, agent):
    contract.test_a_block_leaves_by_its_descriptor_and_comes_back_bit_identical(compute, storage)
    assert "through the compiled poller's ring" in agent[0].log_path.read_text()  # the ring carried them


def test_forged_stale_and_out_of_range_descriptors_are_refused_and_the_block_rearmed(compute):
    contract.test_a_descriptor_that_does_not_describe_its_block_is_refused_and_counted(compute)


def test_a_put_reads_the_block_when_it_fires(compute):
    contract.test_a_put_reads_the_block_when_it_fires(compute)
