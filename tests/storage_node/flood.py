"""Unauthenticated Fabrics Connects from many connections of one source address (tests' attacker)."""
from __future__ import annotations

import threading
import time

import zmq

from kvtb_proto import nvmeof_pb2 as pb


class ConnectFlood:
    """n DEALER connections from source_ip, each sending `repeat` Connects (as host_nqn), never finishing
    a handshake nor reading a reply."""

    def __init__(self, address: str, host_nqn: str, n: int, source_ip: str = "127.0.0.2", repeat: int = 1):
        host_port = address.removeprefix("tcp://")
        self.ctx = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, n + 64)
        self.socks = []
        connect = pb.CommandCapsule(command_id=1, command_set=pb.FABRICS, opcode=pb.FABRICS_CONNECT,
                                    host_nqn=host_nqn).SerializeToString()
        for _ in range(n):
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.connect(f"tcp://{source_ip}:0;{host_port}")
            self.socks.append(sock)
        for _ in range(repeat):
            for sock in self.socks:
                sock.send(connect)

    def answered(self) -> int:
        """How many connections got their Connect answered so far."""
        return sum(1 for s in self.socks if s.poll(0))

    def close(self) -> None:
        for sock in self.socks:
            sock.close(linger=0)
        self.ctx.term()


class SteadyFlood:
    """n DEALER connections from source_ip sending unauthenticated Connects (as host_nqn) round-robin at about
    `rate` a second from a thread of their own, until closed; queued while the node is down."""

    def __init__(self, address: str, host_nqn: str, n: int, source_ip: str, rate: float = 5000.0):
        self.address, self.host_nqn, self.n, self.source_ip, self.rate = address, host_nqn, n, source_ip, rate
        self.sent = 0
        self.started = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steady-flood", daemon=True)
        self._thread.start()
        if not self.started.wait(30):
            raise TimeoutError("the flood's connections were not made")

    def _run(self) -> None:
        ctx = zmq.Context()
        ctx.set(zmq.MAX_SOCKETS, self.n + 64)
        host_port = self.address.removeprefix("tcp://")
        socks = []
        try:
            for _ in range(self.n):
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDHWM, 1000)
                sock.connect(f"tcp://{self.source_ip}:0;{host_port}")
                socks.append(sock)
            self.started.set()
            connect = pb.CommandCapsule(command_id=1, command_set=pb.FABRICS, opcode=pb.FABRICS_CONNECT,
                                        host_nqn=self.host_nqn).SerializeToString()
            batch, began = 10, time.monotonic()
            while not self._stop.is_set():
                for i in range(batch):
                    try:
                        socks[(self.sent + i) % len(socks)].send(connect, zmq.NOBLOCK)
                    except zmq.Again:
                        pass
                self.sent += batch
                ahead = self.sent / self.rate - (time.monotonic() - began)
                if ahead > 0:
                    self._stop.wait(ahead)
        finally:
            for sock in socks:
                sock.close(linger=0)
            ctx.term()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def send_frame(address: str, nbytes: int, source_ip: str = "127.0.0.3", parts: int = 1) -> zmq.Socket:
    """A DEALER that sends one message of `parts` frames of nbytes, unauthenticated; close it when done."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, -1)  # once dropped, stay away
    sock.connect(f"tcp://{source_ip}:0;{address.removeprefix('tcp://')}")
    frame = bytearray(nbytes)
    sock.send_multipart([frame] * parts, copy=False)
    return sock


def vm_rss_bytes(pid: int) -> int:
    """The resident memory of a process (VmRSS in /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise LookupError(f"no VmRSS for process {pid}")
