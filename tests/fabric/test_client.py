"""The host library against a tiny fake target: command ids, pipelining, back-pressure, timeouts."""
import threading
import time

import pytest
import zmq

from fabric import auth, first_proof
from fabric import status as st
from fabric.auth import FabricSecurity
from fabric.client import (
    HEAD_RANGES,
    Completion,
    FabricClient,
    FabricError,
    FabricTimeout,
    StorageStatusError,
    heads_of,
)
from kvtb_proto import nvmeof_pb2 as pb


class FakeTarget:
    """A ROUTER that answers held capsules newest first once `hold` are held (never, if silent)."""

    def __init__(self, hold: int = 0, silent: bool = False):
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
        self.hold, self.silent = hold, silent
        self.seen: list[int] = []
        self.capsules: list[pb.CommandCapsule] = []
        self.max_outstanding = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        held = []
        while not self._stop.is_set():
            if not self.sock.poll(50):
                continue
            ident, header, *_ = self.sock.recv_multipart()
            capsule = pb.CommandCapsule.FromString(header)
            self.seen.append(capsule.command_id)
            self.capsules.append(capsule)
            held.append((ident, capsule.command_id))
            self.max_outstanding = max(self.max_outstanding, len(held))
            if self.silent:
                continue
            if len(held) >= self.hold:
                while held:
                    ident, cid = held.pop()  # newest first: completions out of order
                    self.sock.send_multipart([ident, pb.ResponseCapsule(command_id=cid).SerializeToString()])

    def close(self):
        self._stop.set()
        self._thread.join()
        self.sock.close()


def capsule():
    return pb.CommandCapsule(command_set=pb.KEY_VALUE, opcode=pb.KV_EXIST, namespace_id=1, key=b"k")


def test_out_of_order_completions_reach_their_own_futures_with_unique_ids():
    target = FakeTarget(hold=4)
    client = FabricClient(target.address, "nqn:h", queue_depth=8)
    try:
        capsules = [capsule() for _ in range(8)]
        futures = [client.submit(c) for c in capsules]
        for c, future in zip(capsules, futures):
            assert future.result(5).response.command_id == c.command_id
        assert len(set(target.seen)) == 8 and target.max_outstanding == 4
    finally:
        client.close()
        target.close()


def test_submit_blocks_at_queue_depth_and_futures_time_out():
    target = FakeTarget(silent=True)
    client = FabricClient(target.address, "nqn:h", queue_depth=2, timeout_s=0.5)
    try:
        first = [client.submit(capsule()) for _ in range(2)]
        start = time.monotonic()
        third = client.submit(capsule())          # blocks until a slot frees (by timeout)
        assert time.monotonic() - start >= 0.3
        for future in first:
            with pytest.raises(FabricTimeout):
                future.result(5)
        with pytest.raises(FabricTimeout):
            third.result(5)
        assert target.max_outstanding == 3 and len(set(target.seen)) == 3
    finally:
        client.close()
        target.close()


def test_a_command_can_have_its_own_timeout():
    target = FakeTarget(silent=True)
    client = FabricClient(target.address, "nqn:h", timeout_s=30)
    try:
        start = time.monotonic()
        with pytest.raises(FabricTimeout, match="0.2 s"):
            client.submit(capsule(), timeout_s=0.2).result(5)
        assert time.monotonic() - start < 5
    finally:
        client.close()
        target.close()


class AuthTarget:
    """A ROUTER that runs the target's handshake, then answers each capsule as `answer` says:
    "sealed" (a real completion), "plain" (an unsealed success: forged) or "invalid host" (unsealed)."""

    def __init__(self, key: bytes, answers: list[str]):
        self.sock = zmq.Context.instance().socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.address = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.key, self.answers = key, list(answers)
        self.connects: list[pb.CommandCapsule] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        handshakes, channels = {}, {}  # per connection (routing id)
        while not self._stop.is_set():
            if not self.sock.poll(50):
                continue
            ident, header, *_ = self.sock.recv_multipart()
            channel = channels.get(ident)
            if channel is not None:
                header = channel.open(header)
            capsule = pb.CommandCapsule.FromString(header)
            rsp = pb.ResponseCapsule(command_id=capsule.command_id)
            answer = "sealed"
            if capsule.opcode == pb.FABRICS_CONNECT and capsule.command_set == pb.FABRICS:
                self.connects.append(capsule)
                handshakes[ident] = auth.TargetHandshake(self.key, capsule.host_nqn, "nqn.fake")
                rsp.authentication_required = True
            elif capsule.opcode == pb.FABRICS_AUTH_SEND and capsule.command_set == pb.FABRICS:
                handshakes[ident].receive(capsule.auth_message)
            elif capsule.opcode == pb.FABRICS_AUTH_RECV and capsule.command_set == pb.FABRICS:
                rsp.auth_message = handshakes[ident].send()
            elif self.answers:
                answer = self.answers.pop(0)
            if answer == "invalid host":
                rsp.status_code_type, rsp.status_code = st.CONNECT_INVALID_HOST
            data = rsp.SerializeToString()
            if channel is not None and answer == "sealed":
                data = channel.seal(data)
            self.sock.send_multipart([ident, data])
            handshake = handshakes.get(ident)
            if handshake is not None and handshake.done and channel is None:
                channels[ident] = handshake.channel()

    def close(self):
        self._stop.set()
        self._thread.join()
        self.sock.close()


def test_an_authenticated_client_takes_only_sealed_completions():
    key = bytes(range(32))
    target = AuthTarget(key, ["plain", "invalid host", "sealed"])
    client = FabricClient(target.address, "nqn:h", timeout_s=0.5, security=FabricSecurity("auth", key))
    try:
        client.connect()
        with pytest.raises(FabricTimeout):  # a forged (unsealed) success is dropped: the command times out
            client.submit(capsule()).result(5)
        with pytest.raises(StorageStatusError) as err:  # an unsealed "invalid host" can only fail it
            client.submit(capsule()).result(5).raise_for_status()
        assert err.value.status == st.CONNECT_INVALID_HOST
        assert client.submit(capsule()).result(5).ok
    finally:
        client.close()
        target.close()


def test_a_client_refuses_a_target_that_does_not_authenticate_itself():
    target = FakeTarget(hold=1)  # answers Connect with success, no authentication asked
    client = FabricClient(target.address, "nqn:h", timeout_s=1, security=FabricSecurity("auth", bytes(32)))
    try:
        with pytest.raises(FabricError, match="does not authenticate itself"):
            client.connect()
    finally:
        client.close()
        target.close()


def test_a_connect_carries_a_proof_bound_to_the_subsystem_once_a_handshake_named_it():
    key = bytes(range(32))
    target = AuthTarget(key, [])
    verifier = first_proof.Verifier("nqn.fake", lambda nqn: key)
    other = first_proof.Verifier("nqn.other", lambda nqn: key)
    try:
        for _ in range(2):  # a first client, then another (as the agent's reconnect)
            client = FabricClient(target.address, "nqn:h", timeout_s=2, security=FabricSecurity("auth", key))
            try:
                client.connect()
            finally:
                client.close()
        first, second = (c.auth_message for c in target.connects)
        assert first_proof.parse(first).bound is False and first_proof.parse(second).bound is True
        assert other.check(first, "nqn:h") == first_proof.OK  # unbound: any node takes it
        assert other.check(second, "nqn:h") == first_proof.FORGED  # bound: only "nqn.fake" does
        assert verifier.check(second, "nqn:h") == first_proof.OK
    finally:
        target.close()


def test_a_client_without_security_sends_no_proof():
    target = FakeTarget(hold=1)
    client = FabricClient(target.address, "nqn:h", timeout_s=1)
    try:
        client.connect()
        assert target.capsules[0].auth_message == b""
    finally:
        client.close()
        target.close()


def test_heads_of_many_keys_are_asked_in_range_reads_all_sent_before_any_answer_leased_and_unchecked():
    target = FakeTarget(hold=2)  # answers only once both commands are held: one round trip
    client = FabricClient(target.address, "nqn:h", queue_depth=8, timeout_s=2.0)
    keys = [i.to_bytes(4, "little") for i in range(HEAD_RANGES + 1)]
    try:
        client.retrieve_heads(1, keys, 4096, lease_ms=30_000, timeout_s=1.0)
        assert [(c.opcode, c.skip_guard_check, c.lease_ms) for c in target.capsules] == \
            [(pb.KV_RETRIEVE_RANGES, True, 30_000)] * 2
        asked = [(r.key, r.offset, r.length) for c in target.capsules for r in c.ranges]
        assert asked == [(k, 0, 4096) for k in keys]
    finally:
        client.close()
        target.close()


def test_heads_past_a_full_queue_fail_at_their_deadline_instead_of_blocking():
    target = FakeTarget(silent=True)
    client = FabricClient(target.address, "nqn:h", queue_depth=1, timeout_s=5.0)
    keys = [bytes([i % 256, i // 256]) for i in range(2 * HEAD_RANGES + 1)]  # three commands
    try:
        start = time.monotonic()
        assert client.retrieve_heads(1, keys, 4096, timeout_s=0.3) == [None] * len(keys)
        assert time.monotonic() - start < 2.0  # each waited 0.3 s at most, not the client's 5 s
    finally:
        client.close()
        target.close()


def test_each_range_of_a_head_read_gets_its_bytes_or_none():
    ok, absent = 0, st.KEY_DOES_NOT_EXIST.sct << 8 | st.KEY_DOES_NOT_EXIST.sc
    response = pb.ResponseCapsule(range_status=[ok, absent, ok])
    frames = [zmq.Frame(b"a" * 4), zmq.Frame(b"c" * 4)]
    assert [None if h is None else bytes(h) for h in heads_of(Completion(response, frames), 3, 4)] == \
        [b"aaaa", None, b"cccc"]
    failed = pb.ResponseCapsule(status_code_type=0, status_code=2)
    assert heads_of(Completion(failed, []), 2, 4) == [None, None]
