"""The host side of the storage fabric: capsules over a ZeroMQ DEALER, pipelined, without copies.

    client = FabricClient("tcp://127.0.0.1:55061", "nqn.2026-11.org.kvtestbed:agent-0")
    client.connect()
    client.store(1, key, [kv_bytes])            # acknowledged means durable
    done = client.retrieve(1, key)              # payload in done.frames (zmq.Frame, not copied)
    heads = client.retrieve_heads(1, keys, 4096, lease_ms=30_000)  # many values' first bytes, one round trip
    client.close()

Wire (one ZeroMQ multipart message each way):
    host -> target: [CommandCapsule, payload frame 0, payload frame 1, ...]
    target -> host: [ResponseCapsule, payload frame 0, ...]

With `security` (fabric.auth.FabricSecurity, mode auth or curve) connect() also authenticates
both ends (DH-HMAC-CHAP over AUTH_SEND / AUTH_RECV) and every capsule after it, either way, is
sealed with the session's MAC and sequence number; a response that fails its MAC is dropped
(its command then times out), except a plain "invalid host" (a target that forgot this
connection, e.g. after a restart), which can only fail its command. `curve` also encrypts the
connection (ZeroMQ CURVE, the storage nodes' public key from the credentials). The Connect then
carries a proof that the host holds its secret (`fabric.first_proof`), bound to the target's
subsystem NQN once a handshake with that address told it (`LEARNED_SUBSYSTEMS`): a node serves it
before its budget per peer address, so a flood from the host's own address does not shut it out.
"""
from __future__ import annotations

import concurrent.futures
import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Self

import zmq

from fabric import auth, first_proof
from fabric import frames as frames_
from fabric import status as st
from fabric.auth import AuthError, FabricSecurity
from kvtb.crc32c import crc32c as compute_crc32c
from kvtb.doorbell import Doorbell
from kvtb_proto import nvmeof_pb2

logger = logging.getLogger(__name__)

CID_SPACE = 1 << 16  # command ids rotate through 16 bits, skipping those still outstanding
HEAD_RANGES = 256  # keys per head read (submit_heads): under every node's max_ranges (its default is 1,024)
LIST_PAGE_KEYS = 1000  # keys asked per List command (every node takes at least this many)
# fabric address -> the subsystem NQN a handshake there named (this process's next proofs there bind to it)
LEARNED_SUBSYSTEMS = first_proof.LearnedSubsystems()


class FabricError(Exception):
    """The fabric failed: refused connection, closed client, or a non-zero status."""

    def __init__(self, message: str, sct: int | None = None, sc: int | None = None):
        super().__init__(message)
        self.sct = sct
        self.sc = sc


class FabricTimeout(FabricError, TimeoutError):
    """No completion arrived within the client's timeout_s."""


class StorageStatusError(FabricError):
    """A command completed with a non-zero NVMe status."""

    def __init__(self, sct: int, sc: int, message: str = ""):
        name = st.status_name(sct, sc)
        detail = f": {message}" if message and message != name else ""
        super().__init__(f"{name} (sct {sct:#x}, sc {sc:#04x}){detail}", sct, sc)
        self.message = message

    @property
    def status(self) -> st.Status:
        return st.Status(self.sct, self.sc)


@dataclass
class Completion:
    """A command's response capsule and the payload frames that followed it."""

    response: nvmeof_pb2.ResponseCapsule
    frames: list = field(default_factory=list)  # list[zmq.Frame]; .buffer is a memoryview

    @property
    def ok(self) -> bool:
        return self.response.status_code_type == 0 and self.response.status_code == 0

    def raise_for_status(self) -> Completion:
        """Return self, or raise StorageStatusError on a non-zero status."""
        if not self.ok:
            r = self.response
            raise StorageStatusError(r.status_code_type, r.status_code, r.message)
        return self

    def payload(self) -> memoryview:
        """The payload as one buffer (no copy when it came as one frame)."""
        if len(self.frames) == 1:
            return self.frames[0].buffer
        return memoryview(b"".join(f.bytes for f in self.frames))


@dataclass
class _Pending:
    """An outstanding command: its submission number, its Future, and where its data PDUs go."""

    seq: int
    future: concurrent.futures.Future
    on_data: Callable[[int, list], None] | None = None
    early: list = field(default_factory=list)  # data PDUs kept for a Completion (no on_data)


class FabricClient:
    """A host's queue pair to one storage node.

    Thread-safe: any thread may submit; one I/O thread owns the socket. At most queue_depth
    commands are outstanding; submit blocks past that (back-pressure). Futures resolve on the
    I/O thread, so their callbacks must be short.
    """

    def __init__(self, fabric_address: str, host_nqn: str, subsystem_nqn: str | None = None,
                 queue_depth: int = 128, timeout_s: float = 5.0, context: zmq.Context | None = None,
                 security: FabricSecurity | None = None):
        if queue_depth <= 0 or timeout_s <= 0:
            raise ValueError(f"queue_depth ({queue_depth}) and timeout_s ({timeout_s}) must be positive")
        self.fabric_address = fabric_address
        self.host_nqn = host_nqn
        self.subsystem_nqn = subsystem_nqn or ""
        self.queue_depth = queue_depth
        self.timeout_s = timeout_s
        self.queue_id: int | None = None
        self.sq_head = 0
        self.security = security or FabricSecurity.off()
        self._channel: auth.Channel | None = None  # set once authenticated: capsules are sealed
        self._ctx = context or zmq.Context.instance()
        self._slots = threading.BoundedSemaphore(queue_depth)
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}  # cid -> what is waiting for it
        # (deadline, seq, cid, timeout_s): no reference to the future, so a completed one (and its
        # frames) is freed at once rather than when its deadline passes
        self._deadlines: list[tuple[float, int, int, float]] = []
        self._seqs = itertools.count()
        self._outbox: deque[list] = deque()
        self._cids = itertools.count()
        self._wake = Doorbell()
        self._closed = False
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, 0)  # outstanding work is bounded by queue_depth instead
        self._sock.setsockopt(zmq.RCVHWM, 0)
        if self.security.mode == "curve":
            public, secret = zmq.curve_keypair()  # this connection's own; who the host is, the handshake says
            self._sock.curve_serverkey = self.security.curve_public
            self._sock.curve_publickey, self._sock.curve_secretkey = public, secret
        self._sock.connect(fabric_address)
        self._thread = threading.Thread(target=self._run, name=f"fabric-client-{host_nqn}", daemon=True)
        self._thread.start()

    # -- connection ---------------------------------------------------------------------------

    def connect(self) -> Completion:
        """Send the Fabrics Connect capsule, and authenticate when the security asks for it; raise
        FabricError with the status when refused, or when the target does not authenticate itself."""
        proof = b""
        if self.security.authenticates:  # checked by the node before its budget per peer address
            bound = self.subsystem_nqn or LEARNED_SUBSYSTEMS.get(self.fabric_address)
            proof = first_proof.make(self.security.key, self.host_nqn, bound)
        done = self._fabrics(nvmeof_pb2.FABRICS_CONNECT, "connect", host_nqn=self.host_nqn,
                             subsystem_nqn=self.subsystem_nqn, auth_message=proof)
        required = done.response.authentication_required
        if self.security.authenticates and not required:
            raise FabricError(f"the storage node at {self.fabric_address} does not authenticate itself "
                              f"(its fabric_security is off): refused")
        if required and not self.security.authenticates:
            raise FabricError("connect refused: the storage node requires authentication (fabric_security)",
                              *st.CONNECT_INVALID_HOST)
        if required:
            done = self._authenticate()
        self.queue_id = done.response.sq_id
        return done

    def _authenticate(self) -> Completion:
        """DH-HMAC-CHAP: NEGOTIATE, CHALLENGE, REPLY, SUCCESS1, SUCCESS2; then capsules are sealed."""
        handshake = auth.HostHandshake(self.security.key, self.host_nqn, self.subsystem_nqn)
        send, recv = nvmeof_pb2.FABRICS_AUTH_SEND, nvmeof_pb2.FABRICS_AUTH_RECV
        try:
            self._fabrics(send, "authentication", auth_message=handshake.negotiate())
            challenge = self._fabrics(recv, "authentication").response.auth_message
            self._fabrics(send, "authentication", auth_message=handshake.reply(challenge))
            success1 = self._fabrics(recv, "authentication").response.auth_message
            done = self._fabrics(send, "authentication", auth_message=handshake.success2(success1))
        except AuthError as exc:
            raise FabricError(f"authentication with {self.fabric_address} failed: {exc}",
                              *st.CONNECT_INVALID_HOST) from exc
        self._channel = handshake.channel()  # nothing is outstanding: the next capsule is the first sealed
        LEARNED_SUBSYSTEMS.remember(self.fabric_address, handshake.subsystem_nqn)
        return done

    def _fabrics(self, opcode: int, what: str, **fields) -> Completion:
        capsule = nvmeof_pb2.CommandCapsule(command_set=nvmeof_pb2.FABRICS, opcode=opcode, **fields)
        done = self._wait(self.submit(capsule))
        if not done.ok:
            r = done.response
            raise FabricError(f"{what} refused: {st.status_name(r.status_code_type, r.status_code)}"
                              f" {r.message}", r.status_code_type, r.status_code)
        return done

    def close(self) -> None:
        """Disconnect (best effort), stop the I/O thread and fail what is still pending."""
        if self._closed:
            return
        if self.queue_id is not None:
            capsule = nvmeof_pb2.CommandCapsule(command_set=nvmeof_pb2.FABRICS,
                                                opcode=nvmeof_pb2.FABRICS_DISCONNECT)
            try:
                self.submit(capsule).result(timeout=min(1.0, self.timeout_s))
            except Exception:  # noqa: BLE001 - the node may be gone; closing goes on
                logger.debug("disconnect from %s got no answer", self.fabric_address)
        self._closed = True
        self._wake.ring()
        self._thread.join()
        self._sock.close(linger=0)
        self._wake.close()
        with self._lock:
            pending, self._pending = self._pending, {}
        for entry in pending.values():
            entry.future.set_exception(FabricError("client closed"))

    def __enter__(self) -> Self:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- submission ---------------------------------------------------------------------------

    def submit(self, capsule: nvmeof_pb2.CommandCapsule, frames: Sequence = (),
               timeout_s: float | None = None,
               on_data: Callable[[int, list], None] | None = None,
               slot_wait_s: float | None = None) -> concurrent.futures.Future:
        """Send capsule (its command id is assigned here) and frames; return a Future of Completion.

        The frames are sent with copy=False (a buffer over fabric.frames.FRAME_BYTES as views of it, the
        most a node takes in one frame): leave them unmodified until the Future resolves.
        After timeout_s (default: the client's) the Future fails with FabricTimeout, and a late
        completion is dropped.

        Data PDUs (capsule.data_pdu_bytes): on_data(offset, frames) runs on the I/O thread for
        each one as it arrives, in order, and only while the command is outstanding; the
        Completion then holds the last piece, from response.data_offset. Without on_data the
        PDUs are kept and the Completion holds the whole value.

        With slot_wait_s, a full queue is waited on that long at most (then FabricTimeout).
        """
        if self._closed:
            raise FabricError("client closed")
        if not self._slots.acquire(timeout=slot_wait_s):
            raise FabricTimeout(f"no free queue slot within {slot_wait_s:g} s ({self.queue_depth} outstanding)")
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        with self._lock:
            cid = self._next_cid()
            capsule.command_id = cid
            seq = next(self._seqs)
            self._pending[cid] = _Pending(seq, future, on_data)
            timeout_s = self.timeout_s if timeout_s is None else timeout_s
            heapq.heappush(self._deadlines, (time.monotonic() + timeout_s, seq, cid, timeout_s))
            header = capsule.SerializeToString()
            if self._channel is not None:  # sealed in submission order, which is sending order
                header = self._channel.seal(header)
            self._outbox.append([header, *frames_.split(frames)])  # a node takes frames of FRAME_BYTES
        self._wake.ring()
        return future

    def _next_cid(self) -> int:
        for _ in range(CID_SPACE):
            cid = next(self._cids) % CID_SPACE
            if cid not in self._pending:
                return cid
        raise FabricError("no free command id")  # unreachable while queue_depth < CID_SPACE

    def _wait(self, future: concurrent.futures.Future) -> Completion:
        return future.result(timeout=self.timeout_s + 5.0)

    # -- key-value helpers --------------------------------------------------------------------

    def store(self, nsid: int, key: bytes, frames: Sequence, crc32c: int | None = None, *,
              only_if_absent: bool = False, only_if_present: bool = False, paced_until: float = 0.0) -> Completion:
        """Store the concatenation of frames under key; return once it is durable (paced_until: under a
        hardware profile, when the modeled link delivers it)."""
        frames = list(frames)
        length = sum(memoryview(f).nbytes for f in frames)
        capsule = nvmeof_pb2.CommandCapsule(
            command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_STORE, namespace_id=nsid,
            key=key, value_length=length, crc32c=compute_crc32c(frames) if crc32c is None else crc32c,
            has_crc32c=True, store_only_if_absent=only_if_absent,
            store_only_if_present=only_if_present, paced_until=paced_until)
        return self._wait(self.submit(capsule, frames)).raise_for_status()

    def retrieve(self, nsid: int, key: bytes, max_bytes: int = 0, offset: int = 0, lease_ms: int = 0) -> Completion:
        """Fetch key's value from byte `offset` on (at most max_bytes; 0 = to its end) into completion.frames
        (lease_ms: no other host deletes it for that long; the node caps it)."""
        capsule = nvmeof_pb2.CommandCapsule(command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_RETRIEVE,
                                            namespace_id=nsid, key=key, value_length=max_bytes, value_offset=offset,
                                            lease_ms=lease_ms)
        return self._wait(self.submit(capsule)).raise_for_status()

    def submit_heads(self, nsid: int, keys: Sequence[bytes], head_bytes: int, lease_ms: int = 0,
                     timeout_s: float | None = None) -> list[concurrent.futures.Future]:
        """Ask for the first head_bytes of each key's value: range reads of up to HEAD_RANGES keys each, all
        sent before any answer is waited for (one round trip; heads_of splits each answer). The node skips
        its guard check (the reader checks what it uses; with it the node would read each whole value) and,
        with lease_ms, leases each key it read. timeout_s bounds each command and the wait for a queue slot:
        a command that could not be sent in time gets a failed Future."""
        futures = []
        for i in range(0, len(keys), HEAD_RANGES):
            capsule = nvmeof_pb2.CommandCapsule(
                command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_RETRIEVE_RANGES, namespace_id=nsid,
                skip_guard_check=True, lease_ms=lease_ms,
                ranges=[nvmeof_pb2.ValueRange(key=k, offset=0, length=head_bytes) for k in keys[i:i + HEAD_RANGES]])
            try:
                futures.append(self.submit(capsule, timeout_s=timeout_s, slot_wait_s=timeout_s))
            except FabricError as exc:
                failed: concurrent.futures.Future = concurrent.futures.Future()
                failed.set_exception(exc)
                futures.append(failed)
        return futures

    def retrieve_heads(self, nsid: int, keys: Sequence[bytes], head_bytes: int, lease_ms: int = 0,
                       timeout_s: float | None = None) -> list[memoryview | None]:
        """submit_heads, waited for: each key's first head_bytes, or None (absent, shorter, or its command
        failed)."""
        out: list[memoryview | None] = []
        for i, future in enumerate(self.submit_heads(nsid, keys, head_bytes, lease_ms, timeout_s)):
            count = min(HEAD_RANGES, len(keys) - i * HEAD_RANGES)
            try:
                out += heads_of(self._wait(future), count, head_bytes)
            except (FabricError, TimeoutError):
                out += [None] * count
        return out

    def retrieve_ranges(self, nsid: int, ranges: Sequence[tuple[bytes, int, int]],
                        skip_guard_check: bool = False, lease_ms: int = 0) -> Completion:
        """Fetch byte ranges (key, offset, length) of values in one command: completion.frames holds the
        bytes of those that succeeded, in order, and response.range_status each one's status (lease_ms:
        each key read is leased, as retrieve)."""
        capsule = nvmeof_pb2.CommandCapsule(
            command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_RETRIEVE_RANGES, namespace_id=nsid,
            skip_guard_check=skip_guard_check, lease_ms=lease_ms,
            ranges=[nvmeof_pb2.ValueRange(key=k, offset=o, length=n) for k, o, n in ranges])
        return self._wait(self.submit(capsule)).raise_for_status()

    def delete(self, nsid: int, key: bytes) -> Completion:
        """Delete key (raises StorageStatusError "key does not exist" when absent)."""
        capsule = nvmeof_pb2.CommandCapsule(command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_DELETE,
                                            namespace_id=nsid, key=key)
        return self._wait(self.submit(capsule)).raise_for_status()

    def exist(self, nsid: int, key: bytes, lease_ms: int = 0) -> bool:
        """True when key is stored (the node answers "key does not exist" otherwise); lease_ms as retrieve."""
        capsule = nvmeof_pb2.CommandCapsule(command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_EXIST,
                                            namespace_id=nsid, key=key, lease_ms=lease_ms)
        done = self._wait(self.submit(capsule))
        if (done.response.status_code_type, done.response.status_code) == st.KEY_DOES_NOT_EXIST:
            return False
        return done.raise_for_status().response.exists

    def list_keys(self, nsid: int, start_key: bytes = b"", max_keys: int = 1000) -> list[bytes]:
        """Keys greater than start_key, in order, at most max_keys: asked LIST_PAGE_KEYS at a time (a node
        refuses a List over its max_list_keys)."""
        keys: list[bytes] = []
        while len(keys) < max_keys:
            want = min(LIST_PAGE_KEYS, max_keys - len(keys))
            capsule = nvmeof_pb2.CommandCapsule(command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_LIST,
                                                namespace_id=nsid, list_start_key=start_key, max_keys=want)
            page = list(self._wait(self.submit(capsule)).raise_for_status().response.keys)
            keys += page
            if len(page) < want:
                break
            start_key = page[-1]
        return keys

    def flush(self, nsid: int) -> Completion:
        """NVM Flush: everything written to nsid is on stable storage when this returns."""
        capsule = nvmeof_pb2.CommandCapsule(command_set=nvmeof_pb2.NVM, opcode=nvmeof_pb2.NVM_FLUSH,
                                            namespace_id=nsid)
        return self._wait(self.submit(capsule)).raise_for_status()

    # -- I/O thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake.fd, zmq.POLLIN)
        while not self._closed:
            events = dict(poller.poll(self._poll_timeout_ms()))
            if self._wake.fd in events:
                self._wake.answer()
            self._send_outbox()
            if self._sock in events:
                self._receive_all()
            self._expire(time.monotonic())

    def _poll_timeout_ms(self) -> int:
        with self._lock:
            wait = 1000 if not self._deadlines else \
                max(0, int((self._deadlines[0][0] - time.monotonic()) * 1000) + 1)
            return min(wait, 10) if self._outbox else wait  # a message no peer took yet: try again soon

    def _send_outbox(self) -> None:
        while self._outbox:
            try:  # never block the I/O thread: with no peer (refused by CURVE, or not up yet) a send would
                self._sock.send_multipart(self._outbox[0], copy=False, flags=zmq.NOBLOCK)
            except zmq.Again:
                return  # kept, in order (sealed capsules must go out in sequence); deadlines still expire
            self._outbox.popleft()

    def _receive_all(self) -> None:
        while True:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            response = self._open(frames[0].bytes)
            if response is None:
                continue
            if response.data_pdu:
                self._data_pdu(response, frames[1:])
                continue
            with self._lock:
                entry = self._pending.pop(response.command_id, None)
            if entry is None:
                logger.debug("late completion for command id %d dropped", response.command_id)
                continue
            self.sq_head = response.sq_head
            self._slots.release()
            entry.future.set_result(Completion(response, entry.early + frames[1:]))

    def _open(self, header: bytes) -> nvmeof_pb2.ResponseCapsule | None:
        """The response capsule of a message (its MAC checked once authenticated); None to drop it."""
        response = nvmeof_pb2.ResponseCapsule()
        channel = self._channel
        try:
            response.ParseFromString(channel.open(header) if channel is not None else header)
            return response
        except AuthError as exc:
            refused = _plain_invalid_host(header)
            if refused is not None:  # the target forgot us: it can only fail the command
                return refused
            logger.warning("response from %s dropped: %s", self.fabric_address, exc)
        except Exception:  # noqa: BLE001 - protobuf raises DecodeError; log and drop
            logger.warning("unparsable response from %s dropped", self.fabric_address)
        return None

    def _data_pdu(self, response: nvmeof_pb2.ResponseCapsule, frames: list) -> None:
        with self._lock:
            entry = self._pending.get(response.command_id)
        if entry is None:
            logger.debug("late data PDU for command id %d dropped", response.command_id)
        elif entry.on_data is None:
            entry.early.extend(frames)
        else:
            try:
                entry.on_data(response.data_offset, frames)
            except Exception:  # the handler's bug must not stop the I/O thread
                logger.exception("data PDU handler for command id %d failed", response.command_id)

    def _expire(self, now: float) -> None:
        expired = []
        with self._lock:
            while self._deadlines and self._deadlines[0][0] <= now:
                _, seq, cid, timeout_s = heapq.heappop(self._deadlines)
                entry = self._pending.get(cid)
                if entry is not None and entry.seq == seq:
                    del self._pending[cid]
                    expired.append((cid, entry.future, timeout_s))
        for cid, future, timeout_s in expired:
            self._slots.release()
            future.set_exception(FabricTimeout(f"command id {cid} timed out after {timeout_s:g} s"))


def heads_of(completion: Completion, count: int, head_bytes: int) -> list[memoryview | None]:
    """The bytes of each of a head read's count ranges (head_bytes each), or None for one that failed (its
    key absent, or its value shorter) or for all when the command did."""
    statuses = list(completion.response.range_status)
    if not completion.ok or len(statuses) != count:
        return [None] * count
    data = memoryview(b"".join(f.bytes for f in completion.frames)) if len(completion.frames) != 1 \
        else completion.frames[0].buffer
    out: list[memoryview | None] = []
    offset = 0
    for status in statuses:
        if status or offset + head_bytes > data.nbytes:
            out.append(None)
            continue
        out.append(data[offset:offset + head_bytes])
        offset += head_bytes
    return out


def _plain_invalid_host(header: bytes) -> nvmeof_pb2.ResponseCapsule | None:
    """An unsealed response that only says "invalid host" (no data, no value), or None."""
    response = nvmeof_pb2.ResponseCapsule()
    try:
        response.ParseFromString(header)
    except Exception:  # noqa: BLE001
        return None
    if (response.status_code_type, response.status_code) != tuple(st.CONNECT_INVALID_HOST) or \
            response.data_pdu or response.value_length or response.keys or response.exists:
        return None
    return nvmeof_pb2.ResponseCapsule(command_id=response.command_id, status_code_type=response.status_code_type,
                                      status_code=response.status_code, message=response.message)
