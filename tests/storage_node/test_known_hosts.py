"""Known hosts first (in-process, no sockets, a frozen clock): with its address's budget spent by a flood of
unauthenticated Connects, a host whose Connect carries a valid first-message proof is answered and
completes its handshake from that same address; a forged, replayed or unknown host's proof is dropped
like any message over the budget, and a proven session's other messages get no bypass."""
from __future__ import annotations

import pytest

from fabric import auth, first_proof
from fabric import status as st
from kvtb.credentials import host_key
from kvtb.crc32c import crc32c
from kvtb_proto import nvmeof_pb2 as pb
from storage_node.commands import CommandProcessor
from storage_node.stats import Stats

from .conftest import GOOD_HOST, Harness, settings_for

MASTER = b"m" * 32
ADDRESS = "127.0.0.1"  # the agent's address, and the flood's
KEY = host_key(MASTER, GOOD_HOST)


class AuthHarness(Harness):
    """A Harness whose processor authenticates (fabric_security auth), every message from ADDRESS."""

    def __init__(self, settings):
        super().__init__(settings)
        self.processor = CommandProcessor(self.subsystem, self.executor, lambda c, r: self.done.put((c, r)),
                                          Stats(), auth.FabricSecurity("auth", MASTER))
        self.processor.sessions.clock = lambda: 1000.0  # no bucket refills during the test
        self.channels: dict[bytes, auth.Channel] = {}

    def message(self, session: bytes, **fields):
        """The replies to one capsule (sealed once the session is authenticated): [] when dropped."""
        self.next_cid += 1
        header = pb.CommandCapsule(command_id=self.next_cid, **fields).SerializeToString()
        return self.raw(session, header)

    def raw(self, session: bytes, header: bytes, payload=()):
        channel = self.channels.get(session)
        if channel is not None:
            header = channel.seal(header)
        replies = self.processor.receive(session, [memoryview(header), *map(memoryview, payload)], ADDRESS)
        if not replies and channel is not None:
            cmd, result = self.done.get(timeout=10)
            replies = self.processor.complete(cmd, result)
        out = []
        for r in replies:
            data = self.processor.header(r)
            out.append(pb.ResponseCapsule.FromString(channel.open(data) if channel and not r.plain else data))
        return out

    def connect_header(self, proof: bytes = b"", host: str = GOOD_HOST) -> bytes:
        self.next_cid += 1
        return pb.CommandCapsule(command_id=self.next_cid, command_set=pb.FABRICS, opcode=pb.FABRICS_CONNECT,
                                 host_nqn=host, auth_message=proof).SerializeToString()

    def flood(self, n: int = 2000) -> int:
        """n unproven Connects from ADDRESS, each on its own session; how many were answered."""
        return sum(bool(self.raw(b"evil%d" % i, self.connect_header())) for i in range(n))

    def handshake(self, session: bytes) -> list:
        """The rest of a handshake after its Connect; each step's replies (the session sealed on success)."""
        hs = auth.HostHandshake(KEY, GOOD_HOST)
        steps = [self.message(session, command_set=pb.FABRICS, opcode=pb.FABRICS_AUTH_SEND,
                              auth_message=hs.negotiate())]
        steps.append(self.message(session, command_set=pb.FABRICS, opcode=pb.FABRICS_AUTH_RECV))
        if not steps[-1]:
            return steps
        steps.append(self.message(session, command_set=pb.FABRICS, opcode=pb.FABRICS_AUTH_SEND,
                                  auth_message=hs.reply(steps[-1][0].auth_message)))
        steps.append(self.message(session, command_set=pb.FABRICS, opcode=pb.FABRICS_AUTH_RECV))
        steps.append(self.message(session, command_set=pb.FABRICS, opcode=pb.FABRICS_AUTH_SEND,
                                  auth_message=hs.success2(steps[-1][0].auth_message)))
        self.channels[session] = hs.channel()
        return steps


@pytest.fixture
def h(tmp_path):
    harness = AuthHarness(settings_for(tmp_path))
    yield harness
    harness.close()


def proof(subsystem: str = "", key: bytes = KEY, host: str = GOOD_HOST) -> bytes:
    return first_proof.make(key, host, subsystem)


def test_a_proven_host_gets_in_from_the_floods_own_address(h):
    answered = h.flood()
    sessions = h.processor.sessions
    assert answered < 2000 and sessions.limited > 0  # the address's budget is spent
    assert h.flood(10) == 0  # and stays spent (a frozen clock)

    rsp = h.raw(b"agent", h.connect_header(proof(h.subsystem.settings.subsystem_nqn)))
    assert rsp and rsp[0].status_code == 0 and rsp[0].authentication_required
    assert sessions.proven(b"agent") and sessions.half_open_of_host(GOOD_HOST) == 1
    steps = h.handshake(b"agent")
    assert all(step and step[0].status_code == 0 for step in steps), steps
    assert sessions.sealed(b"agent") and not sessions.proven(b"agent")
    value = b"after the flood"
    store = pb.CommandCapsule(command_id=999, command_set=pb.KEY_VALUE, opcode=pb.KV_STORE, namespace_id=1,
                              key=b"k", value_length=len(value), crc32c=crc32c(value), has_crc32c=True)
    rsp = h.raw(b"agent", store.SerializeToString(), [value])
    assert (rsp[0].status_code_type, rsp[0].status_code) == tuple(st.SUCCESS)
    assert h.processor.stats.snapshot()["commands"][("first_proof", first_proof.OK)] == 1


def test_an_unbound_proof_works_too(h):
    h.flood()
    rsp = h.raw(b"agent", h.connect_header(proof("")))
    assert rsp and rsp[0].authentication_required
    assert all(step and step[0].status_code == 0 for step in h.handshake(b"agent"))


@pytest.mark.parametrize("what", ["replayed", "forged", "unknown host", "bound to another subsystem", "stale",
                                  "garbage"])
def test_a_bad_first_message_is_dropped_over_the_budget(h, what):
    good = h.connect_header(proof())
    assert h.raw(b"agent", good)  # the real one, taken
    h.flood()
    evil = "nqn.2026-11.org.evil:bob"
    header = {
        "replayed": good,
        "forged": h.connect_header(proof(key=b"k" * 32)),
        "unknown host": h.connect_header(proof(key=host_key(MASTER, evil), host=evil), host=evil),
        "bound to another subsystem": h.connect_header(proof("nqn.2026-11.org.kvtestbed:storage-9")),
        "stale": h.connect_header(first_proof.make(KEY, GOOD_HOST, "", now=1.0)),
        "garbage": h.connect_header(b"\x01" * first_proof.PROOF_BYTES),
    }[what]
    assert h.raw(b"attacker", header) == []  # no bypass: the spent budget drops it unanswered
    sessions = h.processor.sessions
    assert not sessions.proven(b"attacker") and sessions.half_open_of_host(GOOD_HOST) <= 1


def test_a_bad_proof_is_no_worse_than_none_while_the_budget_lasts(h):
    """A host whose proof fails (a clock minutes off, say) still gets in the old way when there is no flood."""
    rsp = h.raw(b"skewed", h.connect_header(first_proof.make(KEY, GOOD_HOST, "", now=1.0)))
    assert rsp and rsp[0].authentication_required
    assert not h.processor.sessions.proven(b"skewed")
    assert all(step and step[0].status_code == 0 for step in h.handshake(b"skewed"))


def test_a_proven_sessions_other_messages_get_no_bypass(h):
    assert h.raw(b"agent", h.connect_header(proof()))
    h.flood()
    assert h.message(b"agent", command_set=pb.KEY_VALUE, opcode=pb.KV_EXIST, namespace_id=1, key=b"k") == []
    # a second Connect on the session without a proof is rationed too
    assert h.raw(b"agent", h.connect_header()) == []
