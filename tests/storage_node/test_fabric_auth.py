"""The storage fabric authenticates, on a real node process: from a FabricClient and from a raw ZeroMQ
socket, no credential, a wrong key, a host not on the allow list, a capsule with a bad MAC and a replayed
capsule are each refused (1/0x84, or the handshake fails) and the node goes on serving; the right host works."""
from __future__ import annotations

import random

import pytest

from fabric import auth
from fabric import status as st
from fabric.auth import FabricSecurity
from fabric.client import FabricClient, FabricError
from kvtb import credentials
from kvtb.crc32c import crc32c
from kvtb.credentials import AGENT_NQN
from kvtb_proto import nvmeof_pb2 as pb
from tests.conftest import fabric_client, fabric_security
from tests.fabric.raw_host import RawHost

INVALID_HOST = tuple(st.CONNECT_INVALID_HOST)
EVIL = "nqn.2026-11.org.evil:bob"


def start_node(start_service, node_config, **settings):
    """A node with the default allow list (the agent's and the compute node's NQNs) unless told."""
    settings.setdefault("allowed_hosts", None)
    return start_service("storage", "serve", "storage", "--config", node_config(**settings))


def status(rsp) -> tuple[int, int]:
    return rsp.status_code_type, rsp.status_code


def store(host: RawHost, key: bytes, value: bytes = b"value", seal: bool = True) -> bytes:
    """A sealed (or plain) Store capsule's header frame, sent with its payload; the frame is returned."""
    header = host.header(command_set=pb.KEY_VALUE, opcode=pb.KV_STORE, namespace_id=1, key=key,
                         value_length=len(value), crc32c=crc32c(value), has_crc32c=True)
    frame = host.seal(header) if seal else header
    host.send_raw(frame, value)
    return frame


def the_right_host_works(address: str, key: bytes = b"works") -> list[bytes]:
    with fabric_client(address, AGENT_NQN) as client:
        client.store(1, key, [b"fine"])
        assert bytes(client.retrieve(1, key).payload()) == b"fine"
        return client.list_keys(1)


def test_the_deployments_agent_works_and_nobody_else_gets_in(start_service, node_config, tmp_path):
    node = start_node(start_service, node_config)
    address = node.addresses["fabric"]
    assert node.ready["fabric_security"] == "auth"
    the_right_host_works(address, b"secret-of-alice")

    # no credential: a client that does not authenticate, and a raw socket that skips the handshake
    with pytest.raises(FabricError) as err:
        FabricClient(address, AGENT_NQN, timeout_s=3).connect()
    assert (err.value.sct, err.value.sc) == INVALID_HOST and "requires authentication" in str(err.value)
    bare = RawHost(address, AGENT_NQN)
    try:
        rsp = bare.connect()
        assert status(rsp) == (0, 0) and rsp.authentication_required and rsp.sq_id == 0
        for capsule in ({"opcode": pb.KV_LIST, "namespace_id": 1}, {"opcode": pb.KV_RETRIEVE, "namespace_id": 1,
                                                                    "key": b"secret-of-alice"}):
            rsp, frames = bare.request(command_set=pb.KEY_VALUE, **capsule)
            assert status(rsp) == INVALID_HOST and not rsp.keys and not frames
        store(bare, b"planted", seal=False)
        assert status(bare.receive()[0]) == INVALID_HOST
    finally:
        bare.close()

    # a wrong key: another deployment's, for the agent's own NQN
    other = credentials.init(tmp_path / "another-deployment")
    stranger = FabricClient(address, AGENT_NQN, timeout_s=3,
                            security=FabricSecurity.for_host("auth", str(other), AGENT_NQN))
    with pytest.raises(FabricError, match="authentication failed"):
        stranger.connect()
    stranger.close()
    wrong = RawHost(address, AGENT_NQN, FabricSecurity.for_host("auth", str(other), AGENT_NQN).key)
    try:
        assert status(wrong.authenticate()) == INVALID_HOST
        store(wrong, b"planted", seal=False)  # what it would send, unsealed: it has no session key
        assert status(wrong.receive()[0]) == INVALID_HOST
    finally:
        wrong.close()

    # a host not on the allow list, even holding the key the master gives its name
    for nqn in (EVIL, "nqn.2026-11.org.kvtestbed:test-host"):
        with pytest.raises(FabricError) as err:
            fabric_client(address, nqn, timeout_s=3).connect()
        assert (err.value.sct, err.value.sc) == INVALID_HOST and "not allowed" in str(err.value)

    assert the_right_host_works(address) == [b"secret-of-alice", b"works"]  # and nothing planted


def test_a_capsule_with_a_bad_mac_or_replayed_is_refused_and_never_executed(start_service, node_config):
    node = start_node(start_service, node_config)
    host = RawHost(node.addresses["fabric"], AGENT_NQN, fabric_security(AGENT_NQN).key)
    try:
        assert status(host.authenticate()) == (0, 0)
        first = store(host, b"k0", b"first")
        assert status(host.receive()[0]) == (0, 0)
        host.send_raw(first, b"first")  # replayed, byte for byte
        rsp, _ = host.receive()
        assert status(rsp) == INVALID_HOST and "replayed" in rsp.message
        altered = bytearray(host.seal(host.header(command_set=pb.KEY_VALUE, opcode=pb.KV_DELETE,
                                                  namespace_id=1, key=b"k0")))
        altered[-1] ^= 1  # a bad MAC
        host.send_raw(bytes(altered))
        rsp, _ = host.receive()
        assert status(rsp) == INVALID_HOST and "MAC mismatch" in rsp.message
        body = host.header(command_set=pb.KEY_VALUE, opcode=pb.KV_DELETE, namespace_id=1, key=b"k0")
        host.send_raw(body + bytes(auth.TRAILER_BYTES))  # a forged seal
        assert status(host.receive()[0]) == INVALID_HOST
        host.channel.sent = 1  # the node still expects the number after the last capsule it took
        rsp, frames = host.request(command_set=pb.KEY_VALUE, opcode=pb.KV_RETRIEVE, namespace_id=1, key=b"k0")
        assert status(rsp) == (0, 0) and frames == [b"first"]  # never deleted, never stored twice
    finally:
        host.close()
    assert the_right_host_works(node.addresses["fabric"]) == [b"k0", b"works"]


def test_over_curve_the_same_authentication_and_no_plain_host(start_service, node_config, tmp_path):
    node = start_node(start_service, node_config, fabric_security="curve")
    address = node.addresses["fabric"]
    with fabric_client(address, AGENT_NQN, mode="curve") as client:
        client.store(1, b"over-curve", [b"sealed and encrypted"])
        assert bytes(client.retrieve(1, b"over-curve").payload()) == b"sealed and encrypted"
    with pytest.raises(FabricError):  # right key, no CURVE: ZeroMQ never completes the connection
        fabric_client(address, AGENT_NQN, timeout_s=1).connect()
    other = FabricSecurity.for_host("curve", str(credentials.init(tmp_path / "elsewhere")), AGENT_NQN)
    with pytest.raises(FabricError):  # another deployment's CURVE key: no connection either
        FabricClient(address, AGENT_NQN, timeout_s=1, security=other).connect()


def test_a_bounded_fuzz_of_handshake_messages_crashes_nothing(start_service, node_config):
    node = start_node(start_service, node_config)
    address = node.addresses["fabric"]
    rng = random.Random(2026)
    key = fabric_security(AGENT_NQN).key
    good = auth.HostHandshake(key, AGENT_NQN)
    samples = [good.negotiate(), b"", b"\x03\x00\x00" + bytes(68), b"\x05", bytes(300)]
    answered = 0
    for round_ in range(40):
        host = RawHost(address, rng.choice([AGENT_NQN, EVIL, ""]), key, timeout_ms=5000)
        try:
            for _ in range(rng.randint(1, 8)):
                kind = rng.random()
                if kind < 0.2:
                    rsp = host.connect()
                elif kind < 0.4:
                    rsp = host.auth_recv()
                elif kind < 0.5:
                    rsp = host.request(command_set=pb.FABRICS, opcode=rng.randrange(256),
                                       auth_message=rng.randbytes(rng.randrange(64)))[0]
                else:
                    message = bytearray(rng.choice(samples))
                    for _ in range(rng.randint(0, 3)):
                        if message and rng.random() < 0.6:
                            message[rng.randrange(len(message))] = rng.randrange(256)
                        else:
                            message += rng.randbytes(rng.randrange(40))
                    rsp = host.auth_send(bytes(message))
                answered += 1
                assert rsp.status_code_type in (0, 1)
                if round_ % 5 == 0:  # sometimes a raw frame that is no capsule at all
                    host.send_raw(rng.randbytes(rng.randrange(1, 60)))
                    host.receive()
                    answered += 1
        finally:
            host.close()
    assert answered >= 40 and node.alive()
    assert b"works" in the_right_host_works(address)
