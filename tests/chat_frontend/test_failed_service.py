"""The user's error names the service that failed: a real frontend and agent, a fake compute
node in a process of its own that is killed (kill -9) in the middle of a turn."""
import concurrent.futures
import os
import signal
import subprocess
import sys
import time

import grpc
import pytest
import yaml

from kvtb.grpc_health import wait_serving
from kvtb.launch import free_port
from kvtb_proto import compute_pb2, compute_pb2_grpc
from tests.conftest import secure_channel
from tests.smartnic.helpers import agent_env, storage_env

from .test_http_api import GOOD, TOKEN, assert_openai_error, post

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start_fake_compute(address: str) -> subprocess.Popen:
    """The fake ComputeNode (its Generate held until killed) as a process; once it answers."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.chat_frontend.fake_agent", address, "--hold",
                             "--as", "compute"], cwd=ROOT)
    with secure_channel(address, peer="compute") as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
    return proc


@pytest.fixture
def stack(start_service, tmp_path):
    """(frontend addresses, agent process, compute address, compute process)."""
    compute_address = f"127.0.0.1:{free_port()}"
    compute = start_fake_compute(compute_address)
    storage = start_service("storage-s0", "serve", "storage", env=storage_env(tmp_path, "s0"))
    agent = start_service("agent", "serve", "smartnic",
                          env=agent_env([("s0", storage)], compute_address=compute_address))
    cfg = tmp_path / "kvtb.yaml"
    cfg.write_text(yaml.safe_dump({"frontend": {
        "listen_address": "127.0.0.1:0", "agent_address": agent.addresses["grpc"],
        "data_dir": str(tmp_path / "fe"), "users": {"alice": TOKEN}, "info_retry_s": 0.1,
        "storage_admin_addresses": []}}))
    frontend = start_service("frontend", "serve", "frontend", "--config", str(cfg))
    assert wait_serving(frontend.addresses["grpc"], timeout_s=20)
    yield frontend.addresses, agent, compute_address, compute
    compute.kill()
    compute.wait()


def test_a_killed_compute_node_is_named_and_a_gone_agent_too(stack):
    addresses, agent, compute_address, compute = stack
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(post, addresses["http"], GOOD)  # waits in the fake's Generate
        with secure_channel(agent.addresses["grpc"], peer="smartnic") as channel:
            stats = compute_pb2_grpc.ComputeNodeStub(channel).Stats
            while stats(compute_pb2.ComputeStatsRequest(), timeout=10).turns < 1:
                time.sleep(0.01)  # until the turn reached the compute node
        os.kill(compute.pid, signal.SIGKILL)
        status, body, _ = held.result(timeout=30)
    compute.wait()
    assert_openai_error(status, body, 503)
    message = body["error"]["message"]
    print("killed mid-turn:", message)
    assert f"the compute node at {compute_address} is unavailable" in message, message
    assert "the agent at" in message and "cannot be reached" not in message, message

    status, body, _ = post(addresses["http"], GOOD)  # the next turn: nothing listens there now
    assert_openai_error(status, body, 503)
    assert f"the compute node at {compute_address} is unavailable" in body["error"]["message"]

    # the agent's own answer over gRPC
    with secure_channel(agent.addresses["grpc"], peer="smartnic") as channel, pytest.raises(grpc.RpcError) as err:
        list(compute_pb2_grpc.ComputeNodeStub(channel).Generate(compute_pb2.TurnRequest(
            request_id="r", user_id="u", context_id="c", token_ids=[1, 2]), timeout=10))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and compute_address in err.value.details()
    assert ("kvtb-failed-service", "compute-node") in tuple(err.value.trailing_metadata())

    agent.stop()
    status, body, _ = post(addresses["http"], GOOD)
    assert_openai_error(status, body, 503)
    message = body["error"]["message"]
    assert message.startswith(f"the agent at {agent.addresses['grpc']} cannot be reached"), message
    assert "compute node" not in message
