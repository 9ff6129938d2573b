"""Capsules in, responses out: authentication, parsing, access control, queue admission and dispatch.

Bounded before anything else: a capsule (header frame) of at most MAX_HEADER_BYTES and a message of at
most MAX_FRAMES frames, refused before they are copied or parsed. Before a session authenticates
(`fabric_security` auth or curve) its messages are rate-limited per peer address (over the rate:
dropped unanswered) and at most MAX_PRE_AUTH_BYTES each (`storage_node.pre_auth`). Known hosts
first: a Connect whose first-message proof holds (`fabric.first_proof`, checked before anything is
allocated), and the rest of that session's handshake, skip the address's rate; a proof that fails is
no better than none (the address's rate, as before).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from fabric import first_proof
from fabric import status as st
from fabric.auth import TRAILER_BYTES, AuthError, FabricSecurity
from fabric.frames import MAX_HEADER_BYTES
from fabric.status import NvmeError, Status
from kvtb_proto import nvmeof_pb2 as pb
from storage_node import handlers, pacing
from storage_node.handlers import OPS, Command, RequestLimits, Result
from storage_node.namespace import byte_view
from storage_node.pre_auth import PreAuthLimits
from storage_node.sessions import Sessions
from storage_node.stats import Stats
from storage_node.subsystem import Controller, Subsystem

logger = logging.getLogger(__name__)


@dataclass
class Reply:
    """A response to send: the session (routing id) it goes to, its capsule and payload buffers.

    plain: sent unsealed even to an authenticated session (the handshake's last reply);
    close: the session's channel ends once this reply is sealed (Disconnect).
    """

    session: bytes
    capsule: pb.ResponseCapsule
    frames: list
    plain: bool = False
    close: bool = False


Post = Callable[[Command, Result], None]
Peer = Callable[[], str]  # the peer address of a message's connection, asked only when needed

MAX_FRAMES = 1 << 16  # frames of one message (a 1 GiB value cut into 4 MiB frames is 256)

# Reads of at most this many bytes run on the fabric thread: a page-cache copy of 128 KiB
# takes tens of microseconds, less than two hand-offs between threads. (Writes stay on the
# workers: running them inline measured slower, as it delays receiving the next capsules.)
INLINE_MAX_BYTES = 128 << 10
MIN_DATA_PDU_BYTES = 4096  # a host may not ask for more messages than a page of data each


def data_pdus(session: bytes, response: pb.ResponseCapsule, value: memoryview, pdu: int) -> list[Reply]:
    """A value sent as data PDUs of `pdu` bytes, the response carrying the last one (views, no copy).

    Each PDU is a view of `value`, which keeps what `value` views (a pinned mapping) alive
    until ZeroMQ lets go of the last PDU.
    """
    offsets = range(0, value.nbytes, pdu)
    replies = [Reply(session, pb.ResponseCapsule(command_id=response.command_id, data_pdu=True,
                                                 data_offset=o), [value[o:o + pdu]])
               for o in offsets[:-1]]
    response.data_offset = offsets[-1]
    replies.append(Reply(session, response, [value[offsets[-1]:]]))
    return replies


def range_pdus(session: bytes, response: pb.ResponseCapsule, ranges, frames: list, statuses: list[int],
               pdu: int) -> list[Reply]:
    """A range Retrieve's answer as data PDUs of at most `pdu` bytes, none spanning two ranges, each at
    its offset in the concatenation of the ranges asked for; then the response, without data."""
    replies, start, sent = [], 0, iter(frames)
    for r, status in zip(ranges, statuses):
        if status == 0:
            value = byte_view(next(sent))
            replies += [Reply(session, pb.ResponseCapsule(command_id=response.command_id, data_pdu=True,
                                                          data_offset=start + o), [value[o:o + pdu]])
                        for o in range(0, value.nbytes, pdu)]
        start += r.length
    response.data_offset = start
    replies.append(Reply(session, response, []))
    return replies


class CommandProcessor:
    """Turns received capsules into executions and finished executions into replies.

    Invariants: a capsule from a session without a controller is never executed; with
    `security` auth or curve a session gets its controller only once it authenticated, and a
    capsule of an authenticated session is executed only when its seal checks out; each
    received capsule gets exactly one reply, except the messages of sessions not authenticated that
    go over their peer's rate (dropped unanswered, so a flood queues no replies). Thread-safety:
    receive(), complete(), header() and expire() run on the fabric thread only; executions post
    their Result back through `post` (thread-safe).
    """

    def __init__(self, subsystem: Subsystem, executor: Executor, post: Post, stats: Stats,
                 security: FabricSecurity | None = None):
        self.subsystem = subsystem
        self.executor = executor
        self.post = post
        self.stats = stats
        self.sessions = Sessions(security or FabricSecurity.off(), PreAuthLimits.of(subsystem.settings),
                                 subsystem_nqn=subsystem.settings.subsystem_nqn, allowed=self._serves)
        self.limits = RequestLimits.of(subsystem.settings)
        self.refused_before_auth = 0  # messages dropped or refused before authentication (rate, size)
        self.env = {"committers": subsystem.committers, "limits": self.limits}

    def receive(self, session: bytes, frames: list, peer: Peer | str = "") -> list[Reply]:
        """Handle one received message: [header, payload buffers...] (buffers, not copied) from the
        connection at peer (an address, or a function that tells it)."""
        address, proven, capsule = "", False, None
        if self.sessions.required and not self.sessions.sealed(session):  # before authentication
            address = peer() if callable(peer) else peer
            capsule, proven = self._known_host(session, frames)  # before any budget
            if not proven and not self.sessions.admit(address):
                self.stats.count("pre_auth_message", "rate limited")
                self.refused_before_auth += 1
                return []
            size = handlers.payload_size(frames)
            if size > self.sessions.limits.max_pre_auth_bytes:
                self.refused_before_auth += 1
                return [self._error(session, 0, None, st.INVALID_FIELD, f"a message of {size} bytes before "
                                    f"authentication (at most {self.sessions.limits.max_pre_auth_bytes})")]
        header_bytes = memoryview(frames[0]).nbytes if frames else 0
        if header_bytes > MAX_HEADER_BYTES or len(frames) > MAX_FRAMES:
            return [self._error(session, 0, None, st.INVALID_FIELD, f"a capsule of {header_bytes} bytes and "
                                f"{len(frames)} frames (at most {MAX_HEADER_BYTES} bytes, {MAX_FRAMES} frames)")]
        if capsule is None:
            capsule = pb.CommandCapsule()
            try:
                header = self.sessions.open(session, frames[0] if frames else b"")
            except AuthError as exc:
                logger.warning("capsule refused: %s", exc)
                return [self._error(session, _command_id(frames[0] if frames else b""), None,
                                    st.CONNECT_INVALID_HOST, f"capsule refused: {exc}")]
            try:
                if not header:
                    raise DecodeError("no header frame, or an empty one")
                capsule.ParseFromString(header)
            except (DecodeError, ValueError, TypeError) as exc:
                return [self._error(session, 0, None, st.INVALID_FIELD, f"unparsable command capsule: {exc}")]
        payload = frames[1:]
        if capsule.command_set == pb.FABRICS:
            return [self._fabrics(session, capsule, payload, address, proven)]
        controller = self.subsystem.controller_for(session)
        if controller is None:
            return [self._error(session, capsule.command_id, None, st.CONNECT_INVALID_HOST,
                                "host is not connected and authenticated (send a Fabrics Connect, then "
                                "authenticate)" if self.sessions.required else
                                "host is not connected (send a Fabrics Connect first)")]
        try:
            cmd = self._validate(session, capsule, payload, controller)
            admitted = controller.queue.submit(capsule.command_id, cmd)
        except NvmeError as exc:
            return [self._error(session, capsule.command_id, controller, exc.status, exc.message)]
        if admitted:
            self._start(cmd)
        return []

    def _known_host(self, session: bytes, frames: list) -> tuple[pb.CommandCapsule | None, bool]:
        """A message of a session not authenticated yet, before any budget is spent on it: its capsule
        (parsed when it is one small frame, else None) and whether it comes from a known host, that is a
        Connect whose first-message proof holds, or a handshake message of a session whose Connect's did."""
        if len(frames) != 1:
            return None, False
        header = frames[0]
        if not 0 < memoryview(header).nbytes <= self.sessions.limits.max_pre_auth_bytes:
            return None, False
        capsule = pb.CommandCapsule()
        try:
            capsule.ParseFromString(bytes(header))
        except (DecodeError, ValueError, TypeError):
            return None, False
        if capsule.command_set != pb.FABRICS:
            return capsule, False
        if capsule.opcode == pb.FABRICS_CONNECT:
            if not capsule.auth_message:
                return capsule, False
            outcome = self.sessions.prove(capsule.host_nqn, capsule.auth_message)
            self.stats.count("first_proof", outcome)
            return capsule, outcome == first_proof.OK
        handshake = capsule.opcode in (pb.FABRICS_AUTH_SEND, pb.FABRICS_AUTH_RECV)
        return capsule, handshake and self.sessions.proven(session)

    def _serves(self, host_nqn: str) -> bool:
        """Whether host_nqn is on this node's allow list."""
        return self.subsystem.settings.allowed_namespaces(host_nqn) is not None

    def complete(self, cmd: Command, result: Result) -> list[Reply]:
        """Retire a finished command, start what waited for its slot, and build its reply."""
        for waiting in cmd.controller.queue.complete(cmd.capsule.command_id):
            self._start(waiting)
        status = st.status_name(*result.status)
        self.stats.record(cmd.spec.name, status, result.bytes_written, result.bytes_read)
        if logger.isEnabledFor(logging.DEBUG):  # one line per command, when asked
            logger.debug("%s %s from %s: %s", cmd.spec.name, cmd.capsule.key.hex(), cmd.controller.host_nqn,
                         status, extra={"opcode": cmd.spec.name, "status": status,
                                        "bytes": result.bytes_written + result.bytes_read})
        response = pb.ResponseCapsule(
            command_id=cmd.capsule.command_id, status_code_type=result.status.sct,
            status_code=result.status.sc, sq_head=cmd.controller.queue.sq_head,
            sq_id=cmd.controller.qid, value_length=result.value_length, crc32c=result.crc32c,
            keys=result.keys, message=result.message, exists=result.exists, range_status=result.range_status)
        if not result.status.ok:
            return [Reply(cmd.session, response, [])]
        pdu = cmd.capsule.data_pdu_bytes
        if cmd.capsule.ranges and pdu:
            return range_pdus(cmd.session, response, cmd.capsule.ranges, result.frames, result.range_status, pdu)
        if not pdu or len(result.frames) != 1 or byte_view(result.frames[0]).nbytes <= pdu:
            return [Reply(cmd.session, response, result.frames)]
        return data_pdus(cmd.session, response, byte_view(result.frames[0]), pdu)

    def _validate(self, session: bytes, capsule: pb.CommandCapsule, payload: list,
                  controller: Controller) -> Command:
        spec = OPS.get((capsule.command_set, capsule.opcode))
        if spec is None:
            raise NvmeError(st.INVALID_OPCODE, f"opcode {capsule.opcode:#04x} in command set "
                                               f"{capsule.command_set} is not supported")
        ns = self.subsystem.namespace_for(controller, capsule.namespace_id)
        if not isinstance(ns, spec.kind):
            raise NvmeError(st.INVALID_OPCODE, f"{spec.name} on a {ns.command_set} namespace")
        if 0 < capsule.data_pdu_bytes < MIN_DATA_PDU_BYTES:
            raise NvmeError(st.INVALID_FIELD, f"data_pdu_bytes {capsule.data_pdu_bytes} is under "
                                              f"{MIN_DATA_PDU_BYTES} (0 sends the value whole)")
        nbytes = handlers.payload_size(payload)
        if nbytes and not spec.carries_payload:
            raise NvmeError(st.INVALID_FIELD, f"{spec.name} carries no payload, got {nbytes} bytes")
        spec.validate(capsule, ns, nbytes, self.limits)
        return Command(session, capsule, payload, nbytes, controller, ns, spec)

    def _start(self, cmd: Command) -> None:
        def finish(result: Result) -> None:
            self.post(cmd, result)

        finish = pacing.wrap(cmd, finish)  # under a hardware profile: it ends when the modeled drive says
        spec = cmd.spec
        if spec.inline or (spec.size is not None and spec.size(cmd) <= INLINE_MAX_BYTES):
            handlers.run(cmd, finish, self.env)
        else:
            self.executor.submit(handlers.run, cmd, finish, self.env)

    def header(self, reply: Reply) -> bytes:
        """A reply's first frame: its capsule, sealed for an authenticated session unless plain."""
        data = reply.capsule.SerializeToString()
        if not reply.plain:
            data = self.sessions.seal(reply.session, data)
        if reply.close:
            self.sessions.drop(reply.session)
        return data

    def expire(self) -> int:
        """Forget half-open sessions past the handshake timeout (the fabric thread calls it each turn)."""
        gone = self.sessions.expire()
        self.stats.count("handshake", "expired", gone)
        return gone

    def _fabrics(self, session: bytes, capsule: pb.CommandCapsule, payload: list, peer: str = "",
                 proven: bool = False) -> Reply:
        """Connect binds the session to a controller, or starts its authentication (or refuses it);
        AUTH_SEND / AUTH_RECV carry the handshake; Disconnect unbinds the session."""
        try:
            if payload:
                raise NvmeError(st.INVALID_FIELD, "fabrics commands carry no payload")
            if capsule.opcode == pb.FABRICS_CONNECT:
                return self._connect(session, capsule, peer, proven)
            if capsule.opcode in (pb.FABRICS_AUTH_SEND, pb.FABRICS_AUTH_RECV):
                return self._authenticate(session, capsule)
            if capsule.opcode == pb.FABRICS_DISCONNECT:
                controller = self.subsystem.controller_for(session)
                if controller is None:
                    raise NvmeError(st.CONNECT_INVALID_HOST, "not connected")
                self.subsystem.disconnect_session(session)
                self.stats.record("disconnect", "success")
                reply = self._reply(session, capsule.command_id, controller, st.SUCCESS, "")
                reply.close = True
                return reply
            raise NvmeError(st.INVALID_OPCODE, f"fabrics opcode {capsule.opcode:#04x} is not supported")
        except NvmeError as exc:
            logger.info("fabrics command refused: %s", exc.message)
            return self._error(session, capsule.command_id, None, exc.status, exc.message)

    def _connect(self, session: bytes, capsule: pb.CommandCapsule, peer: str, proven: bool = False) -> Reply:
        if self.sessions.sealed(session):
            raise NvmeError(st.INVALID_FIELD, "already connected and authenticated (Disconnect first)")
        if not self.sessions.required:
            controller = self.subsystem.connect(session, capsule.host_nqn, capsule.subsystem_nqn)
            self.stats.record("connect", "success")
            return self._reply(session, capsule.command_id, controller, st.SUCCESS, "")
        self.subsystem.check_allowed(capsule.host_nqn, capsule.subsystem_nqn)
        self.subsystem.disconnect_session(session)  # a session that connects again starts over
        evicted, expired = self.sessions.evicted, self.sessions.expired
        self.sessions.begin(session, capsule.host_nqn, self.subsystem.settings.subsystem_nqn, peer, proven)
        self.stats.count("handshake", "evicted", self.sessions.evicted - evicted)
        self.stats.count("handshake", "expired", self.sessions.expired - expired)
        reply = self._reply(session, capsule.command_id, None, st.SUCCESS, "")
        reply.capsule.authentication_required = True
        return reply

    def _authenticate(self, session: bytes, capsule: pb.CommandCapsule) -> Reply:
        """One step of the handshake; the last binds the session to its host's controller."""
        try:
            handshake = self.sessions.handshake(session)
            reply = self._reply(session, capsule.command_id, None, st.SUCCESS, "")
            if capsule.opcode == pb.FABRICS_AUTH_RECV:
                reply.capsule.auth_message = handshake.send()
                return reply
            handshake.receive(capsule.auth_message)
        except AuthError as exc:
            if not self.sessions.sealed(session):
                self.sessions.drop(session)
            self.stats.record("authentication", "failed")
            logger.warning("authentication refused: %s", exc)
            raise NvmeError(st.CONNECT_INVALID_HOST, f"authentication failed: {exc}") from exc
        if not handshake.done:
            return reply
        controller = self.subsystem.connect(session, handshake.host_nqn, handshake.subsystem_nqn)
        self.sessions.establish(session)
        self.stats.record("authentication", "success")
        self.stats.record("connect", "success")
        reply = self._reply(session, capsule.command_id, controller, st.SUCCESS, "")
        reply.plain = True  # the host seals from its next capsule on, and expects sealed replies after this
        return reply

    def _error(self, session: bytes, cid: int, controller: Controller | None, status: Status,
               message: str) -> Reply:
        self.stats.record("rejected", st.status_name(*status))
        logger.debug("command %d rejected: %s", cid, message)
        return self._reply(session, cid, controller, status, message)

    @staticmethod
    def _reply(session: bytes, cid: int, controller: Controller | None, status: Status,
               message: str) -> Reply:
        response = pb.ResponseCapsule(command_id=cid, status_code_type=status.sct, status_code=status.sc,
                                      message=message)
        if controller is not None:
            response.sq_head = controller.queue.sq_head
            response.sq_id = controller.qid
        return Reply(session, response, [])


def _command_id(header) -> int:
    """The command id of a capsule that failed its seal, best effort (0 when unparsable)."""
    capsule = pb.CommandCapsule()
    try:
        capsule.ParseFromString(bytes(header)[:-TRAILER_BYTES] if len(header) > TRAILER_BYTES else b"")
    except (DecodeError, ValueError, TypeError):
        return 0
    return capsule.command_id
