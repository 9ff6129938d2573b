"""Two replicas behind one frontend (`kvtb up --replicas 2`, routing round_robin), with the real model.

A conversation whose turns alternate between the replicas restores each follow-up from what the other
replica stored, and replies as the same conversation does on one replica alone (a second frontend whose
only replica is replica 0; on 2 CPUs each compute node has one of its own, so both run the same float
math). A compute node killed mid-conversation: the next turn is served by the other replica, restored
from storage, with the same reply. Each compute node answers only its own agent.
"""
import os
import signal

import grpc
import pytest

from chat_client.client import FrontendClient
from kvtb.launch import ServiceProcess, kvtb_argv
from kvtb.placement import parse_cpus
from kvtb_proto import compute_pb2, compute_pb2_grpc
from tests.conftest import secure_channel

from .conftest import USERS, run_conversation, run_turn, start_up

pytestmark = [pytest.mark.service, pytest.mark.slow]

MESSAGES = ["My name is Ada and I bake bread. Say hello.",
            "What do I bake?",
            "Give me one tip for a crisp crust.",
            "And what is my name?"]
# users of their own (tenant "default", as alice's), so no other test's KV is theirs: one conversation each
OWN_USERS = {"erin": "erin-token", "frank": "frank-token", "grace": "grace-token"}


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    up = start_up(tmp_path_factory, "triggered", replicas=2,
                  frontend={"routing": "round_robin", "users": {**USERS, **OWN_USERS}})
    yield up
    up.stop()


@pytest.fixture(scope="module")
def one_replica(replicas, tmp_path_factory):
    """The conversation's turns on replica 0 alone: through a frontend of its own, whose only replica it is."""
    root = tmp_path_factory.mktemp("one-replica")
    proc = ServiceProcess("frontend-replica-0", kvtb_argv(
        "serve", "frontend", "--config", str(replicas.config), "--agent", replicas.agent,
        "--data-dir", str(root / "frontend")), root / "frontend.log")
    proc.start(timeout_s=120)
    try:
        client = FrontendClient(proc.addresses["grpc"], OWN_USERS["erin"])
        turns = run_conversation(client, MESSAGES)
        client.close()
    finally:
        assert proc.stop() == 0, proc.log_tail()
    assert {t.replica for t in turns} == {"replica-0"}
    return turns


def client(up, user: str) -> FrontendClient:
    return FrontendClient(up.frontend, OWN_USERS[user])


def test_the_ready_line_names_each_replica(replicas):
    assert set(replicas.proc.ready["replicas"]) == {"replica-0", "replica-1"}
    assert replicas.proc.ready["replicas"]["replica-1"]["agent"] == replicas.services["smartnic-1"]["grpc"]
    cpus = replicas.proc.ready["cpus"]
    if len(os.sched_getaffinity(0)) >= 2:  # each compute node on a share of its own
        assert not set(parse_cpus(cpus["compute"])) & set(parse_cpus(cpus["compute-1"]))


def test_turns_alternate_between_replicas_and_reply_as_on_one(replicas, one_replica):
    c = client(replicas, "frank")
    turns = run_conversation(c, MESSAGES)
    c.close()
    names = [t.replica for t in turns]
    assert set(names) == {"replica-0", "replica-1"} and all(a != b for a, b in zip(names, names[1:])), names
    assert [t.kv_origin for t in turns[1:]] == ["storage_other"] * 3, \
        [(t.kv_origin, t.kv_source, t.fallback_reason) for t in turns]
    assert all(t.tokens_reused > 0 and t.bytes_restored > 0 for t in turns[1:])
    assert [t.reply for t in turns] == [t.reply for t in one_replica]


def test_a_compute_node_answers_only_its_own_agent(replicas):
    compute = replicas.proc.ready["replicas"]["replica-1"]["compute"]

    def info(identity: str):
        with secure_channel(compute, peer="compute-1", identity=identity) as channel:
            return compute_pb2_grpc.ComputeNodeStub(channel).Info(compute_pb2.InfoRequest(), timeout=30)

    with pytest.raises(grpc.RpcError) as refused:
        info("smartnic")  # replica 0's agent
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED and "smartnic-1" in refused.value.details()
    assert info("operator").policy == "triggered"  # the operator may


def test_a_killed_compute_node_the_next_turn_restores_on_the_other(replicas, one_replica):
    c = client(replicas, "grace")
    _, first = run_turn(c, MESSAGES[0])
    served = first.replica
    compute = "compute" if served == "replica-0" else f"compute-{served.rsplit('-', 1)[1]}"
    os.kill(replicas.proc.ready["pids"][compute], signal.SIGKILL)
    text, second = run_turn(c, MESSAGES[1], first.context_id)
    assert second.replica and second.replica != served, (served, second.replica, second.retried_from)
    assert second.kv_origin == "storage_other", (second.kv_origin, second.kv_source, second.fallback_reason)
    assert text == second.reply == one_replica[1].reply
    _, third = run_turn(c, MESSAGES[2], first.context_id)  # on the survivor, or on the killed one once
    c.close()                                                # `kvtb up` restarted it (test_replicas_heal.py)
    assert third.replica in (second.replica, served) and third.reply == one_replica[2].reply
    assert replicas.proc.alive(), replicas.proc.log_tail()  # kvtb up keeps the other replica serving
