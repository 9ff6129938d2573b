"""The fabric front end: a ZeroMQ ROUTER that carries capsules between hosts and the processor.

Wire (per message): host -> node [routing id, CommandCapsule, payload...]; node -> host
[routing id, ResponseCapsule, payload...]; the capsules sealed once the host authenticated
(`CommandProcessor.header`). With `fabric_security: curve` the socket is a CURVE server: every
byte is encrypted (ZeroMQ's CurveZMQ), with the same authentication on top. Frames are received with copy=False and handed on
as memoryviews; replies go out with copy=False from buffers made for that reply alone, or from
views of a namespace's mapping that keep their extents pinned until ZeroMQ lets go of them.

Bounded: a frame over `max_frame_bytes` (ZMQ_MAXMSGSIZE) makes libzmq drop its peer's connection
before buffering it, and at most `rcv_hwm` messages wait per connection while the node does not
read (then TCP's own window stops the peer). The processor learns each connection's peer address
(ZeroMQ's "Peer-Address") for its limits on work before authentication.

No head-of-line blocking across hosts: the socket is read whatever any queue pair holds. A host
past its queue depth has its next commands parked (a bounded number, `storage_node.queues`) and
then refused with "command interrupted" (retryable), never held in the socket where they would
stop every other host's. Nothing on this thread waits for the disk's cache: fsyncs run on each
namespace's committer and sync threads. A stall over 1 s, of this thread or of a command, is
logged with what it waited on (`storage_node.stall_watch`).
"""
from __future__ import annotations

import logging
import queue
import threading
import time

import zmq

from fabric.auth import FabricSecurity
from kvtb.doorbell import Doorbell
from storage_node.commands import CommandProcessor, Reply
from storage_node.handlers import Command, Result
from storage_node.idle_trim import IdleTrim
from storage_node.stall_watch import CHECK_S, CommandWatch, LoopWatch, executor_state

logger = logging.getLogger(__name__)

RECV_BATCH = 64  # messages taken per loop turn before completions get their turn
COMPLETION_BATCH = 256  # completions answered per loop turn before the socket gets its turn
MAX_FRAME_BYTES = 16 << 20  # as StorageSettings.max_frame_bytes
# Messages ZeroMQ queues per connection before the node reads them; past it, TCP's window holds the
# peer back (nothing is lost). Small: libzmq keeps a small message in an 8 KiB receive buffer of its
# own: 220,000 Connects over 1,100 connections grew the node by 490 MiB at 1,024 a connection, by
# 60 MiB at 32. Stores and Retrieves of 4 KiB and 4 MiB measured the same at 32 and at 1,024.
RCV_HWM = 32


def bindable(address: str) -> str:
    """ZeroMQ spells "any free port" as "*"; accept port 0 too."""
    return address[:-2] + ":*" if address.startswith("tcp://") and address.endswith(":0") else address


class FabricServer:
    """Owns the ROUTER socket on one thread; other threads only call post() and stop().

    Back-pressure is per host, never shared: the socket is always read (RECV_BATCH messages a turn,
    then the completions), and a host past its queue depth gets its extra commands parked, then
    refused with "command interrupted" (QueuePair), so one host's full queue or slow commands never
    keep another host's capsules unread. Each turn's work is bounded: a batch of receives, the
    completions posted so far. A turn over 1 s and a command outstanding over 1 s are logged with
    what they wait on (`watch`, `commands_watch`).
    """

    def __init__(self, address: str, context: zmq.Context | None = None, security: FabricSecurity | None = None,
                 max_frame_bytes: int = MAX_FRAME_BYTES, rcv_hwm: int = RCV_HWM):
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        if security is not None and security.mode == "curve":  # encryption; who the host is, the handshake says
            self._sock.curve_server = True
            self._sock.curve_secretkey = security.curve_secret
            self._sock.curve_publickey = security.curve_public
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 0)
        self._sock.setsockopt(zmq.RCVHWM, rcv_hwm)
        self._sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)  # per frame: larger ones cost a disconnect
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # an unroutable reply raises, not vanishes
        self._sock.bind(bindable(address))
        self.address = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._done: queue.SimpleQueue[tuple[Command, Result]] = queue.SimpleQueue()
        self._wake = Doorbell()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.processor: CommandProcessor | None = None
        self.idle_trim = IdleTrim()  # what refused unauthenticated work held goes back to the system
        self._refused_seen = 0
        self.watch: LoopWatch | None = None
        self._next_check = 0.0

    def post(self, cmd: Command, result: Result) -> None:
        """Hand a finished command to the fabric thread (thread-safe; dropped once stopped)."""
        if self._stopping.is_set():
            return
        self._done.put((cmd, result))
        self._wake.ring()

    def start(self, processor: CommandProcessor) -> None:
        self.processor = processor
        self.watch = LoopWatch("fabric", stats=processor.stats)
        self.commands_watch = CommandWatch(processor.stats, executor_state(processor.executor))
        self._thread = threading.Thread(target=self._run, name="fabric", daemon=True)
        self._thread.start()
        self.watch.start(self._thread.ident)

    def stop(self) -> None:
        """Stop the loop and close the socket."""
        self._stopping.set()
        self._wake.ring()
        if self._thread:
            self._thread.join()
        if self.watch is not None:
            self.watch.stop()
            stats = self.processor.stats
            logger.info("fabric stopped: the longest command took %.3f s (%s); %d stalls over 1 s logged",
                        stats.longest_command_s, stats.longest_command or "none", stats.stalls)
        self._sock.close(linger=0)
        self._wake.close()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake.fd, zmq.POLLIN)
        watch = self.watch
        while not self._stopping.is_set():
            watch.idle()
            events = dict(poller.poll(500))
            watch.busy("sending completions")
            if self._wake.fd in events:
                self._wake.answer()
            self._drain_completions()
            watch.busy("expiring half-open handshakes")
            self.processor.expire()
            now = time.monotonic()
            if self._sock in events:
                self.idle_trim.seen(now)
                self._receive_batch()
                if self.processor.refused_before_auth != self._refused_seen:
                    self._refused_seen = self.processor.refused_before_auth
                    self.idle_trim.want()
            else:
                self.idle_trim.tick(now)
            if now >= self._next_check:  # commands outstanding over 1 s, logged with what they wait on
                self._next_check = now + CHECK_S
                watch.busy("checking for stalled commands")
                self.commands_watch.check(self.processor.subsystem.controllers(), now)

    def _receive_batch(self) -> None:
        session = b""
        self.watch.busy("handling received capsules", lambda: f"the last from session {session.hex()}")
        for _ in range(RECV_BATCH):
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            session = frames[0].bytes
            try:
                replies = self.processor.receive(session, [f.buffer for f in frames[1:]],
                                                 lambda f=frames[0]: _peer_address(f))
            except Exception:  # one bad message must not stop the node
                logger.exception("unexpected failure handling a capsule")
                continue
            self._send(replies)

    def _drain_completions(self) -> None:
        for _ in range(COMPLETION_BATCH):
            try:
                cmd, result = self._done.get_nowait()
            except queue.Empty:
                return
            self.commands_watch.answered(cmd, time.monotonic())
            self._send(self.processor.complete(cmd, result))
        self._wake.ring()  # more are waiting: the next turn takes them, after the socket's turn

    def _send(self, replies: list[Reply]) -> None:
        for reply in replies:
            message = [reply.session, self.processor.header(reply), *reply.frames]
            try:
                self._sock.send_multipart(message, copy=False)
            except zmq.ZMQError as exc:
                logger.warning("reply to a departed host dropped: %s", exc)


def _peer_address(frame: zmq.Frame) -> str:
    """The address a message came from ("" where the transport has none: ipc, inproc)."""
    try:
        return frame.get("Peer-Address") or ""
    except zmq.ZMQError:
        return ""
