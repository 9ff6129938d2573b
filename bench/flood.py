"""An attacker on the storage fabric, for `kvtb bench abuse`: unauthenticated Connects from many
connections of one source address, oversized unauthenticated frames, and a process's resident memory
watched while they land. Loopback only: the source addresses are 127.0.0.x. The Connect flood comes
by default from the agent's own address (127.0.0.1, as in issue 42: hosts behind one NAT, or on one
machine, share an address), so the node's budget per peer address is the agent's too.
"""
from __future__ import annotations

import resource
import threading
import time
from collections.abc import Callable
from typing import Self

import zmq

from kvtb_proto import nvmeof_pb2 as pb

AGENT_SOURCE = "127.0.0.1"   # the agent's own address (it connects to the node at 127.0.0.1)
OTHER_SOURCE = "127.0.0.2"   # an address of the attacker's own
FLOOD_SOURCE = AGENT_SOURCE  # the Connect flood's default address
FRAMES_SOURCE = "127.0.0.3"  # the big frames' address


def raise_open_files(needed: int) -> None:
    """The soft limit on open files raised to `needed` (each connection is a descriptor or two);
    OSError when even the hard limit is lower."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise OSError(f"{needed} open files needed, the hard limit is {hard} (ulimit -Hn)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


class ConnectFlood:
    """n DEALER connections from source_ip, each sending `repeat` Fabrics Connects as host_nqn (before
    the node is up, they go when it is), never finishing a handshake nor reading a reply; with `rate`,
    then Connects at about `rate` a second more, round-robin, from a thread, until answered() or close()
    (those dropped by a full send queue are not counted in `sent`)."""

    def __init__(self, address: str, host_nqn: str, n: int, source_ip: str = FLOOD_SOURCE, repeat: int = 1,
                 rate: float = 0.0):
        raise_open_files(2 * n + 1024)
        self.sent = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        host_port = address.removeprefix("tcp://")
        self.ctx = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, n + 64)
        self.socks: list[zmq.Socket] = []
        connect = pb.CommandCapsule(command_id=1, command_set=pb.FABRICS, opcode=pb.FABRICS_CONNECT,
                                    host_nqn=host_nqn).SerializeToString()
        try:
            for _ in range(n):
                sock = self.ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDHWM, 0)  # every Connect queued, however long the node is down
                sock.connect(f"tcp://{source_ip}:0;{host_port}")
                self.socks.append(sock)
            for _ in range(repeat):
                for sock in self.socks:
                    sock.send(connect)
            self.sent = n * repeat
        except BaseException:
            self.close()
            raise
        if rate > 0:  # the sockets are the thread's until it stops
            self._thread = threading.Thread(target=self._steady, args=(connect, rate), name="connect-flood",
                                            daemon=True)
            self._thread.start()

    def _steady(self, connect: bytes, rate: float) -> None:
        batch, began, sent, i = 10, time.monotonic(), 0, 0
        while not self._stop.is_set():
            for _ in range(batch):
                i = (i + 1) % len(self.socks)
                try:
                    self.socks[i].send(connect, zmq.NOBLOCK)
                    self.sent += 1
                except zmq.Again:  # that connection's queue is full (the node is down or slow)
                    pass
            sent += batch
            ahead = sent / rate - (time.monotonic() - began)
            if ahead > 0:
                self._stop.wait(ahead)

    def stop_sending(self) -> None:
        """Stop the steady Connects (the connections stay open)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def answered(self) -> int:
        """How many connections got an answer to a Connect so far (the steady Connects stop first)."""
        self.stop_sending()
        return sum(1 for s in self.socks if s.poll(0))

    def close(self) -> None:
        self.stop_sending()
        for sock in self.socks:
            sock.close(linger=0)
        self.socks = []
        self.ctx.term()


def send_frame(address: str, frame: bytearray, source_ip: str = FRAMES_SOURCE) -> zmq.Socket:
    """A new DEALER that sends one message of one frame (without copying it), unauthenticated and
    never reconnecting once dropped; the caller closes it (the frame must live until then)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, -1)
    sock.connect(f"tcp://{source_ip}:0;{address.removeprefix('tcp://')}")
    sock.send(frame, copy=False)
    return sock


def vm_rss_bytes(pid: int) -> int:
    """The resident memory of a process (VmRSS in /proc/<pid>/status); LookupError when it has none
    (it exited)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError as exc:
        raise LookupError(f"no process {pid}") from exc
    raise LookupError(f"no VmRSS for process {pid}")


class RssWatch:
    """The highest resident memory of a process, sampled every interval_s in a thread, whichever
    process pid_of() names at the time (None: none now, as while a node restarts)."""

    def __init__(self, pid_of: Callable[[], int | None], interval_s: float = 0.02):
        self.pid_of, self.interval_s = pid_of, interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-watch", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> int | None:
        """One sample now (also taken into the peak); None when there is no process."""
        pid = self.pid_of()
        if pid is None:
            return None
        try:
            rss = vm_rss_bytes(pid)
        except LookupError:
            return None
        self.peak = max(self.peak, rss)
        return rss

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()

