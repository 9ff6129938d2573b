"""Per-opcode validation (cheap, on the fabric thread) and execution (on an I/O worker).

Every request is bounded before it runs (`RequestLimits`, from the node's settings): a value's
size, the ranges of a range read (merged first, `storage_node.ranges`), the keys of a List, the
bytes a response carries and the bytes a command reads or checksums on the node. Over a cap a
command is refused whole with "invalid field" (NVMe's generic 0x02).

A Retrieve, range read or Exist with lease_ms leases each key it read to its host for that long
(at most max_lease_ms; `storage_node.leases`); a Delete of a key another host leased answers
"key leased" (1/0x8A) and deletes nothing.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fabric import status as st
from fabric.status import NvmeError, Status
from kvtb.crc32c import crc32c
from kvtb_proto import nvmeof_pb2 as pb
from storage_node import ranges as rg
from storage_node.commit import GroupCommitter
from storage_node.kv_namespace import KvNamespace, PendingDelete, check_key
from storage_node.namespace import LBA_BYTES, BlockNamespace, Namespace, byte_view

logger = logging.getLogger(__name__)


WAITING_FOR_WORKER = "waiting for an I/O worker"


@dataclass
class Command:
    """An admitted command: its capsule, payload buffers and where it runs.

    admitted, stage and waits_on say how long it has been outstanding and on what (the fabric
    thread's stall check reads them): stage is set where the command moves on (a worker starts it,
    it goes to a group commit or a flush), waits_on, when set, describes that stage's holder now.
    """

    session: bytes
    capsule: pb.CommandCapsule
    payload: list  # buffers (memoryviews of received frames), in order
    payload_bytes: int
    controller: Any
    namespace: Namespace
    spec: OpSpec
    admitted: float = field(default_factory=time.monotonic)
    stage: str = WAITING_FOR_WORKER
    waits_on: Callable[[], str] | None = None
    stall_logged: bool = False


@dataclass
class Result:
    """What a command produced: its status and the fields and frames of its response."""

    status: Status = st.SUCCESS
    message: str = ""
    value_length: int = 0
    crc32c: int = 0
    keys: list = field(default_factory=list)
    exists: bool = False
    frames: list = field(default_factory=list)  # sent with copy=False; ZeroMQ holds them until sent
    bytes_written: int = 0
    bytes_read: int = 0
    range_status: list = field(default_factory=list)  # KV_RETRIEVE_RANGES: (sct << 8) | sc per range


Finish = Callable[[Result], None]

RANGE_ENTRIES_PER_RANGE = 4  # a range read's list, as sent, may hold this many times max_ranges
LIST_DEFAULT_KEYS = 1000     # the keys a List answers when it asks for none in particular


@dataclass(frozen=True)
class RequestLimits:
    """What one command may ask for (defaults as StorageSettings'; see there for each one)."""

    max_value_bytes: int = 1 << 30
    max_ranges: int = 1024
    max_list_keys: int = 10_000
    max_response_bytes: int = 1 << 30
    max_read_bytes: int = 4 << 30
    max_lease_ms: int = 60_000

    @classmethod
    def of(cls, settings) -> RequestLimits:
        return cls(settings.max_value_bytes, settings.max_ranges, settings.max_list_keys,
                   settings.max_response_bytes, settings.max_read_bytes, settings.max_lease_ms)


@dataclass(frozen=True)
class OpSpec:
    """An opcode: its name, the namespace kind it needs, its checks and its execution."""

    name: str
    kind: type
    validate: Callable[[pb.CommandCapsule, Namespace, int, RequestLimits], None]
    execute: Callable[[Command, Finish, dict], None]
    inline: bool = False  # cheap enough to run on the fabric thread
    size: Callable[[Command], int] | None = None  # bytes it moves; small ones run inline too
    carries_payload: bool = False


# -- validation ---------------------------------------------------------------------------------

def _no_checks(capsule, ns, payload_bytes, limits: RequestLimits) -> None:
    pass


def _check_key(capsule, ns, payload_bytes, limits: RequestLimits) -> None:
    check_key(capsule.key)


def _check_retrieve(capsule, ns: KvNamespace, payload_bytes, limits: RequestLimits) -> None:
    """A Retrieve answers at most max_response_bytes (a value stored before the cap was lowered may not)."""
    check_key(capsule.key)
    length = ns.value_length(capsule.key)
    answer = max(0, length - capsule.value_offset)
    if capsule.value_length:
        answer = min(answer, capsule.value_length)
    if answer > limits.max_response_bytes:
        raise NvmeError(st.INVALID_FIELD, f"a Retrieve of {answer} bytes, over the {limits.max_response_bytes} "
                                          f"one response may carry (ask for part of it: value_length)")


def _check_store(capsule, ns, payload_bytes, limits: RequestLimits) -> None:
    check_key(capsule.key)
    max_value = limits.max_value_bytes
    if capsule.value_length > max_value:
        raise NvmeError(st.INVALID_VALUE_SIZE, f"value of {capsule.value_length} bytes over {max_value}")
    if payload_bytes != capsule.value_length:
        raise NvmeError(st.INVALID_FIELD,
                        f"payload of {payload_bytes} bytes, header says {capsule.value_length}")
    if capsule.store_only_if_absent and capsule.store_only_if_present:
        raise NvmeError(st.INVALID_FIELD, "store_only_if_absent and store_only_if_present both set")


def _check_ranges(capsule, ns: KvNamespace, payload_bytes, limits: RequestLimits) -> None:
    """A range read within the caps: ranges (merged), bytes answered, bytes read or checked."""
    asked = capsule.ranges
    most = limits.max_ranges * RANGE_ENTRIES_PER_RANGE
    if not 1 <= len(asked) <= most:
        raise NvmeError(st.INVALID_FIELD, f"{len(asked)} ranges (1..{most} as sent, {limits.max_ranges} merged)")
    for r in asked:
        check_key(r.key)
    merged = rg.merged_count(asked)
    if merged > limits.max_ranges:
        raise NvmeError(st.INVALID_FIELD, f"{merged} ranges once adjacent or overlapping ones are merged, "
                                          f"over {limits.max_ranges}")
    answer = sum(r.length for r in asked)
    if answer > limits.max_response_bytes:
        raise NvmeError(st.INVALID_FIELD, f"ranges of {answer} bytes in all, over the "
                                          f"{limits.max_response_bytes} one response may carry")
    read = sum(_span_read_bytes(capsule, ns, key, lo, hi) for key, (lo, hi) in rg.covering(asked).items())
    if read > limits.max_read_bytes:
        raise NvmeError(st.INVALID_FIELD, f"ranges that read or check {read} bytes on the node, over "
                                          f"{limits.max_read_bytes}")


def _span_read_bytes(capsule, ns: KvNamespace, key: bytes, lo: int, hi: int) -> int:
    """Bytes read or checksummed for [lo, hi) of key: the whole value under the guard check."""
    return ns.value_length(key) if not capsule.skip_guard_check else hi - lo


def _check_list(capsule, ns, payload_bytes, limits: RequestLimits) -> None:
    if capsule.max_keys > limits.max_list_keys:
        raise NvmeError(st.INVALID_FIELD, f"a List of {capsule.max_keys} keys, over {limits.max_list_keys} "
                                          f"(ask again from the last key)")


def _check_lbas(capsule, ns, payload_bytes, limits: RequestLimits) -> None:
    ns.check_range(capsule.starting_lba, capsule.number_of_lbas)
    if capsule.number_of_lbas * LBA_BYTES > limits.max_value_bytes:
        raise NvmeError(st.INVALID_FIELD, "transfer larger than the maximum data transfer size")


def _check_write(capsule, ns, payload_bytes, limits: RequestLimits) -> None:
    _check_lbas(capsule, ns, payload_bytes, limits)
    if payload_bytes != capsule.number_of_lbas * LBA_BYTES:
        raise NvmeError(st.INVALID_FIELD,
                        f"payload of {payload_bytes} bytes for {capsule.number_of_lbas} LBAs")


# -- execution ----------------------------------------------------------------------------------

def _verify_payload_crc(cmd: Command) -> int:
    crc = crc32c(cmd.payload)
    if cmd.capsule.has_crc32c and crc != cmd.capsule.crc32c:
        raise NvmeError(st.GUARD_CHECK_ERROR, "payload does not match its crc32c")
    return crc


def _kv_store(cmd: Command, finish: Finish, env: dict) -> None:
    ns: KvNamespace = cmd.namespace
    c = cmd.capsule
    pending = ns.reserve(c.key, c.value_length, only_if_absent=c.store_only_if_absent,
                         only_if_present=c.store_only_if_present)
    try:
        crc = ns.write(pending, cmd.payload)  # checksummed as it is written: one pass over the bytes
    except OSError as exc:
        ns.abort(pending)
        raise NvmeError(st.WRITE_FAULT, str(exc)) from exc
    if c.has_crc32c and crc != c.crc32c:  # never committed: the extents go back, nothing is visible
        ns.abort(pending)
        raise NvmeError(st.GUARD_CHECK_ERROR, "payload does not match its crc32c")
    committer: GroupCommitter = env["committers"][ns.nsid]
    cmd.stage, cmd.waits_on = f"group commit of namespace {ns.nsid}", committer.describe
    committer.submit(pending, lambda status: finish(
        Result(status, crc32c=crc, value_length=c.value_length,
               bytes_written=c.value_length if status.ok else 0)))


def _lease(cmd: Command, keys, env: dict) -> None:
    """Lease the keys read to the command's host for its lease_ms (capped at max_lease_ms), if it asked."""
    ms = min(cmd.capsule.lease_ms, env["limits"].max_lease_ms)
    if ms and keys:
        cmd.namespace.lease(keys, cmd.controller.host_nqn, ms / 1000.0)


def _kv_retrieve(cmd: Command, finish: Finish, env: dict) -> None:
    c = cmd.capsule
    data, length, crc = cmd.namespace.retrieve(c.key, c.value_length, not c.skip_guard_check, c.value_offset)
    _lease(cmd, [c.key], env)
    finish(Result(value_length=length, crc32c=crc, frames=[data], bytes_read=data.nbytes))


def _kv_retrieve_ranges(cmd: Command, finish: Finish, env: dict) -> None:
    """Each range on its own: its bytes (a view, no copy) or its status. Each key is read once, over the
    bytes covering its ranges (and with the guard check its whole value checked once)."""
    ns: KvNamespace = cmd.namespace
    asked = cmd.capsule.ranges
    answers: list = [None] * len(asked)
    for key, indexes in rg.by_key(asked).items():
        spans = [(asked[i].offset, asked[i].length) for i in indexes]
        try:
            got = ns.retrieve_spans(key, spans, not cmd.capsule.skip_guard_check)
        except NvmeError as exc:
            got = [exc] * len(indexes)
        for i, answer in zip(indexes, got):
            answers[i] = answer
    frames, statuses, failed = [], [], ""
    for i, answer in enumerate(answers):
        if isinstance(answer, NvmeError):
            statuses.append(answer.status.sct << 8 | answer.status.sc)
            failed = failed or f"range {i} (key {asked[i].key.hex()}): {answer.message}"
            continue
        frames.append(answer)
        statuses.append(0)
    _lease(cmd, list({asked[i].key: None for i, s in enumerate(statuses) if not s}), env)
    nbytes = sum(byte_view(f).nbytes for f in frames)
    finish(Result(message=failed, value_length=nbytes, frames=frames, bytes_read=nbytes, range_status=statuses))


def _kv_delete(cmd: Command, finish: Finish, env: dict) -> None:
    committer: GroupCommitter = env["committers"][cmd.namespace.nsid]
    cmd.stage, cmd.waits_on = f"group commit of namespace {cmd.namespace.nsid}", committer.describe
    committer.submit(PendingDelete(cmd.capsule.key, cmd.controller.host_nqn), lambda status: finish(Result(status)))


def _kv_exist(cmd: Command, finish: Finish, env: dict) -> None:
    if not cmd.namespace.exist(cmd.capsule.key):
        raise NvmeError(st.KEY_DOES_NOT_EXIST)
    _lease(cmd, [cmd.capsule.key], env)
    finish(Result(exists=True))


def _kv_list(cmd: Command, finish: Finish, env: dict) -> None:
    max_keys = cmd.capsule.max_keys or LIST_DEFAULT_KEYS
    finish(Result(keys=cmd.namespace.list_keys(cmd.capsule.list_start_key, max_keys)))


def _nvm_write(cmd: Command, finish: Finish, env: dict) -> None:
    c = cmd.capsule
    _verify_payload_crc(cmd)
    try:
        cmd.namespace.write(c.starting_lba, c.number_of_lbas, cmd.payload)
    except OSError as exc:
        raise NvmeError(st.WRITE_FAULT, str(exc)) from exc
    finish(Result(bytes_written=cmd.payload_bytes))


def _nvm_read(cmd: Command, finish: Finish, env: dict) -> None:
    c = cmd.capsule
    data = cmd.namespace.read(c.starting_lba, c.number_of_lbas)
    finish(Result(value_length=data.nbytes, crc32c=crc32c(data), frames=[data], bytes_read=data.nbytes))


def _nvm_deallocate(cmd: Command, finish: Finish, env: dict) -> None:
    cmd.namespace.deallocate(cmd.capsule.starting_lba, cmd.capsule.number_of_lbas)
    finish(Result())


def _flush(cmd: Command, finish: Finish, env: dict) -> None:
    """The fdatasync runs on the namespace's own sync thread (never a worker's or the fabric's); concurrent
    Flushes of one namespace share it."""
    def done(error: OSError | None) -> None:
        finish(Result(st.WRITE_FAULT, f"flush failed: {error}") if error else Result())

    syncer = cmd.namespace.syncer
    cmd.stage, cmd.waits_on = f"flush of namespace {cmd.namespace.nsid}", syncer.describe
    syncer.submit(done)


def _retrieve_bytes(cmd: Command) -> int:
    """Bytes a Retrieve copies or checksums: none for a mapped value the host checks itself."""
    return _retrieve_bytes_of(cmd, cmd.capsule.key)


def _retrieve_bytes_of(cmd: Command, key: bytes) -> int:
    ns: KvNamespace = cmd.namespace
    if cmd.capsule.skip_guard_check and ns.maps(key):
        return 0
    return ns.value_length(key)


def _ranges_bytes(cmd: Command) -> int:
    """Bytes a range Retrieve copies or checksums (none for mapped values the host checks itself)."""
    return sum(_retrieve_bytes_of(cmd, key) for key in rg.by_key(cmd.capsule.ranges))


def _lba_bytes(cmd: Command) -> int:
    return cmd.capsule.number_of_lbas * LBA_BYTES


OPS: dict[tuple[int, int], OpSpec] = {
    (pb.KEY_VALUE, pb.KV_STORE): OpSpec("kv_store", KvNamespace, _check_store, _kv_store,
                                        carries_payload=True),
    (pb.KEY_VALUE, pb.KV_RETRIEVE): OpSpec("kv_retrieve", KvNamespace, _check_retrieve, _kv_retrieve,
                                           size=_retrieve_bytes),
    (pb.KEY_VALUE, pb.KV_RETRIEVE_RANGES): OpSpec("kv_retrieve_ranges", KvNamespace, _check_ranges,
                                                  _kv_retrieve_ranges, size=_ranges_bytes),
    (pb.KEY_VALUE, pb.KV_DELETE): OpSpec("kv_delete", KvNamespace, _check_key, _kv_delete, inline=True),
    (pb.KEY_VALUE, pb.KV_EXIST): OpSpec("kv_exist", KvNamespace, _check_key, _kv_exist, inline=True),
    (pb.KEY_VALUE, pb.KV_LIST): OpSpec("kv_list", KvNamespace, _check_list, _kv_list, inline=True),
    (pb.NVM, pb.NVM_WRITE): OpSpec("nvm_write", BlockNamespace, _check_write, _nvm_write,
                                   carries_payload=True),
    (pb.NVM, pb.NVM_READ): OpSpec("nvm_read", BlockNamespace, _check_lbas, _nvm_read, size=_lba_bytes),
    (pb.NVM, pb.NVM_DATASET_MANAGEMENT): OpSpec("nvm_deallocate", BlockNamespace, _check_lbas,
                                                _nvm_deallocate),
    (pb.NVM, pb.NVM_FLUSH): OpSpec("flush", Namespace, _no_checks, _flush),
}


def payload_size(payload: list) -> int:
    """Total bytes of the payload buffers."""
    return sum(byte_view(b).nbytes for b in payload)


def run(cmd: Command, finish: Finish, env: dict) -> None:
    """Execute cmd; every outcome, errors included, reaches finish exactly once."""
    cmd.stage = "executing on the fabric thread" if threading.current_thread().name == "fabric" else \
        "executing on an I/O worker"
    try:
        cmd.spec.execute(cmd, finish, env)
    except NvmeError as exc:
        finish(Result(exc.status, exc.message))
    except Exception as exc:  # a bug must not leave the host waiting
        logger.exception("%s failed", cmd.spec.name)
        finish(Result(st.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"))
