"""A compute node whose agent is gone waits for it, pool kept: health NOT_SERVING, every turn refused with
UNAVAILABLE saying why, Info and Stats still answered; once the agent is back it serves again
(the keeper's word, compute_node.agent_client: tests/compute_node/test_agent_client.py)."""
from __future__ import annotations

import os
import time
import types

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvtb_proto import compute_pb2
from tests.conftest import secure_channel

from .conftest import run_turn

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


def health(node) -> int:
    with secure_channel(node.address, peer="compute") as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status


def test_without_its_agent_the_node_refuses_turns_and_keeps_its_pool(make_node):
    node = make_node()
    region = node.pool.region.path
    assert node.ready_extra()["regions"] == [str(region)]  # what `kvtb up` removes after a kill -9
    run_turn(node, list(range(500, 520)), n=4)
    node._agent_changed(False)
    assert health(node) == health_pb2.HealthCheckResponse.NOT_SERVING
    with pytest.raises(grpc.RpcError) as refused:
        run_turn(node, list(range(500, 520)), context="c2", n=4)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "SmartNIC agent" in refused.value.details() and "waits for it" in refused.value.details()
    assert node.stub.Info(compute_pb2.InfoRequest(), timeout=10).num_blocks > 0  # the operator still sees it
    assert region.exists()  # the pool kept
    node._agent_changed(True)
    assert health(node) == health_pb2.HealthCheckResponse.SERVING
    _, record, _ = run_turn(node, list(range(500, 520)), context="c3", n=4)
    assert record.tokens_out == 4


@pytest.mark.slow
def test_a_real_node_waits_for_its_killed_agent_and_serves_once_it_is_back(tmp_path):
    """Real processes (storage, agent, compute node): the agent killed with -9, the node refuses turns with
    UNAVAILABLE, same process, same region; the agent started again on its address, the node registers
    again and a turn through the agent is served."""
    from kvtb.launch import ServiceProcess

    from .conftest import Chat, start_cluster, stop_cluster

    cluster = start_cluster(tmp_path, "agentloss")
    try:
        node = types.SimpleNamespace(address=cluster.compute_address)
        pid, region = cluster.compute.proc.pid, cluster.compute.ready["regions"][0]
        chat = Chat(cluster.agent_address)
        assert chat.turn(chat.encode("Say hi."), "before", n=4)[1].tokens_out > 0
        chat.close()
        address = cluster.agent_address
        cluster.agent.kill()
        until(lambda: health(node) == health_pb2.HealthCheckResponse.NOT_SERVING, 30)
        direct = Chat(cluster.compute_address)  # as the operator, to the node itself
        with pytest.raises(grpc.RpcError) as refused:
            direct.turn([1, 2, 3], "meanwhile", n=4)
        direct.close()
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE and address in refused.value.details()
        assert cluster.compute.alive() and cluster.compute.proc.pid == pid and os.path.exists(region)
        again = ServiceProcess("agentloss-smartnic-again", cluster.agent.argv, tmp_path / "again.log",
                               env={**cluster.agent.env, "KVTB_SMARTNIC_LISTEN_ADDRESS": address})
        again.start(timeout_s=120)
        cluster.agent = again
        until(lambda: health(node) == health_pb2.HealthCheckResponse.SERVING, 30)
        chat = Chat(address)
        assert chat.turn(chat.encode("Say hi again."), "after", n=4)[1].tokens_out > 0
        chat.close()
        assert "registered again" in cluster.compute.log_path.read_text()
    finally:
        stop_cluster(cluster)


def until(condition, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.1)
