"""Replicas over real gRPC: `kvtb serve frontend` in front of two fake agents (tests/chat_frontend/fake_agent.py).

A conversation stays on its replica (kv_aware); a replica that is stopped leaves the rotation (the
next turns go to the other, the user sees no error), and returns when it answers again; /metrics
and SystemStats show each replica.
"""
import asyncio
import time
import urllib.request

import pytest
import yaml

from chat_client.client import FrontendClient
from chat_frontend.replicas import Replicas
from chat_frontend.settings import FrontendSettings
from kvtb.grpc_health import wait_serving
from kvtb.launch import free_port
from kvtb.rpc import Security

from . import fake_agent

TOKEN = "t-alice"


def metric(address: str, name: str, replica: str) -> float:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    for line in text.splitlines():
        if line.startswith(f'kvtb:{name}{{replica="{replica}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"kvtb:{name} of {replica} not in /metrics")


def until(condition, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.05)


@pytest.fixture
def two_replicas(start_service, tmp_path):
    """(frontend addresses, [(server, node, address)] of the two fake agents, restart(i))."""
    agents = [list(fake_agent.serve(f"127.0.0.1:{free_port()}")) for _ in range(2)]
    cfg = tmp_path / "kvtb.yaml"
    cfg.write_text(yaml.safe_dump({"frontend": {
        "listen_address": "127.0.0.1:0", "data_dir": str(tmp_path / "fe"), "users": {"alice": TOKEN},
        "info_retry_s": 0.1, "health_interval_s": 0.2, "health_timeout_s": 1.0, "storage_admin_addresses": [],
        "replicas": [f"replica-{i}={a[2]}=smartnic" for i, a in enumerate(agents)]}}))
    frontend = start_service("frontend", "serve", "frontend", "--config", str(cfg))
    assert wait_serving(frontend.addresses["grpc"], timeout_s=20)

    def restart(i: int) -> None:
        agents[i][:2] = fake_agent.serve(agents[i][2])[:2]
    yield frontend.addresses, agents, restart
    for server, _, _ in agents:
        server.stop(0)


def chat(client: FrontendClient, message: str, context_id: str = ""):
    return [e for e in client.chat(message, context_id=context_id, max_new_tokens=4)][-1].summary


def test_a_conversation_stays_on_its_replica_and_moves_when_it_goes(two_replicas):
    addresses, agents, restart = two_replicas
    client = FrontendClient(addresses["grpc"], TOKEN)
    try:
        first = chat(client, "hello there " * 20)  # a few routing blocks
        context, home = first.context_id, first.replica
        assert home in ("replica-0", "replica-1") and first.retried_from == ""
        for _ in range(2):
            assert chat(client, "and then?", context).replica == home
        other = "replica-1" if home == "replica-0" else "replica-0"
        i = int(home[-1])
        agents[i][0].stop(0)  # the home replica goes away: the next turn goes to the other, no error
        summary = chat(client, "still there?", context)
        assert summary.replica == other and summary.turn == 4
        assert summary.retried_from in ("", home)  # retried if the health loop had not noticed yet
        until(lambda: metric(addresses["metrics"], "replica_up", home) == 0)
        assert metric(addresses["metrics"], "replica_up", other) == 1
        assert metric(addresses["metrics"], "replica_turns_total", other) >= 1
        stats = client.system_stats()
        assert set(stats["replicas"]) == {"replica-0", "replica-1"}
        assert stats["replicas"][home]["up"] is False and "error" in stats["replicas"][home]["compute"]
        assert int(stats["compute"]["turns"]) == len(agents[1 - i][1].requests)  # the one that answers
        restart(i)
        until(lambda: metric(addresses["metrics"], "replica_up", home) == 1)
        # back in the rotation, but the conversation stays where its KV now is
        assert chat(client, "and now?", context).replica == other
    finally:
        client.close()


def test_each_replica_is_dialled_as_its_own_identity():
    server, _, address = fake_agent.serve()  # serves as "smartnic"
    try:
        settings = FrontendSettings(replicas=(f"replica-0={address}=smartnic",
                                              f"replica-1={address}=smartnic-1"), health_timeout_s=2.0)

        async def go():
            replicas = Replicas.connect(settings, Security.of("frontend"))
            try:
                return await asyncio.gather(*(replicas.probe(r) for r in replicas.replicas)), replicas
            finally:
                await replicas.close()
        (up0, up1), replicas = asyncio.run(go())
        # replica-1 expects the agent's certificate to say smartnic-1: it does not, so it is out
        assert (up0, up1) == (True, False)
        assert "health probe" in replicas.replicas[1].reason
    finally:
        server.stop(0)
