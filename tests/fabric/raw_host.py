"""A fabric host on a raw ZeroMQ DEALER: every message by hand, for tests that send what a
FabricClient never would (no handshake, a wrong key, a bad seal, a replay, fuzz)."""
from __future__ import annotations

import zmq

from fabric import auth
from kvtb_proto import nvmeof_pb2 as pb


class RawHost:
    """One DEALER socket to a fabric address; seals and opens once authenticate() succeeded."""

    def __init__(self, address: str, host_nqn: str, key: bytes = b"", timeout_ms: int = 10_000):
        self.host_nqn, self.key = host_nqn, key
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
        self.sock.connect(address)
        self.channel: auth.Channel | None = None
        self.cid = 0

    def header(self, **fields) -> bytes:
        """A capsule's bytes, with a fresh command id unless given."""
        self.cid += 1
        fields.setdefault("command_id", self.cid)
        return pb.CommandCapsule(**fields).SerializeToString()

    def send_raw(self, header: bytes, *payload) -> None:
        """Send a message as it is (sealed or not, as the caller made it)."""
        self.sock.send_multipart([header, *payload])

    def seal(self, header: bytes) -> bytes:
        return self.channel.seal(header) if self.channel is not None else header

    def receive(self) -> tuple[pb.ResponseCapsule, list[bytes]]:
        """The next response (opened when authenticated) and its payload frames."""
        header, *frames = self.sock.recv_multipart()
        if self.channel is not None:
            header = self.channel.open(header)
        return pb.ResponseCapsule.FromString(header), frames

    def request(self, *payload, **fields) -> tuple[pb.ResponseCapsule, list[bytes]]:
        """Send a capsule made of fields (sealed when authenticated) and return its response."""
        self.send_raw(self.seal(self.header(**fields)), *payload)
        return self.receive()

    def connect(self) -> pb.ResponseCapsule:
        return self.request(command_set=pb.FABRICS, opcode=pb.FABRICS_CONNECT, host_nqn=self.host_nqn)[0]

    def auth_send(self, message: bytes) -> pb.ResponseCapsule:
        return self.request(command_set=pb.FABRICS, opcode=pb.FABRICS_AUTH_SEND, auth_message=message)[0]

    def auth_recv(self) -> pb.ResponseCapsule:
        return self.request(command_set=pb.FABRICS, opcode=pb.FABRICS_AUTH_RECV)[0]

    def authenticate(self) -> pb.ResponseCapsule:
        """Connect and the whole handshake with self.key; the last response (its status says how it went)."""
        rsp = self.connect()
        if rsp.status_code or not rsp.authentication_required:
            return rsp
        hs = auth.HostHandshake(self.key, self.host_nqn)
        for step in (lambda: self.auth_send(hs.negotiate()), self.auth_recv):
            rsp = step()
            if rsp.status_code:
                return rsp
        rsp = self.auth_send(hs.reply(rsp.auth_message))
        if rsp.status_code:
            return rsp
        rsp = self.auth_recv()
        rsp = self.auth_send(hs.success2(rsp.auth_message))
        if not rsp.status_code:
            self.channel = hs.channel()
        return rsp

    def close(self) -> None:
        self.sock.close(linger=0)
