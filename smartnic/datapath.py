"""The data plane: PUT gathers ranges of a region into ZeroMQ frames, GET scatters frames back.

PUT reads the region when it fires and sends [header, token ids, MACs, KV...] with copy=False:
ranges of 1 MiB or more as views of the region, which it never writes while they are in flight,
and runs of smaller ones joined by one copy (`hostmem.gather` says why); the MACs (keyed BLAKE3,
`fabric.chunk_format` v4: one over header and token ids, one per KV part: a block's layer) are
made over those buffers before they go. GET asks for a large value in data PDUs of
`get_pdu_bytes` (NVMe/TCP's C2HData within a command) and places each one as it arrives
(`smartnic.landing`), so copying one part into the region overlaps receiving the next; it checks
the header on the first and every MAC as the bytes are copied (with the KV MAC off, the value's
crc32c); a mismatch ends the GET with an error, so the bytes are never used.

A restore (`restore`) reads many blocks layer group by layer group: per storage node one
KV_RETRIEVE_RANGES command per group (a vector of (key, offset, length), the group-0 one with
each block's head), all submitted at once, group 0 first; each block's group is reported as soon
as its bytes landed and checked out, so the compute node can start on the first layers while
the others arrive. A GET that has not completed by its deadline fails with "timeout" and never
writes afterwards.

Completions run on the fabric client's I/O thread, where the reply arrived: a hand-off to
another thread per chunk would cost more than the completion (the crc and the copy release
the GIL). So they never block: what could (a Delete submitted while the queue pair is full)
goes to a small worker pool.
"""
from __future__ import annotations

import bisect
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from fabric import chunk_format as cf
from fabric import status as st
from fabric.client import HEAD_RANGES, StorageStatusError, heads_of
from fabric.nodes import StorageNodes
from fabric.placement import place
from hostmem import dma, gather
from hostmem.region import Region, RegionError
from kvtb import crc32c as _crc
from kvtb_proto import nvmeof_pb2
from scale import paced as pacing
from smartnic.landing import DataError, Landing
from smartnic.requester import StoredBlock, stored_block

logger = logging.getLogger(__name__)

GET_PDU_BYTES = 2 << 20  # a GET asks for values larger than this in data PDUs of this size


class ChunkRef(NamedTuple):
    user_id: str
    context_id: str
    chunk_index: int
    token_start: int
    token_end: int


class Datapath:
    """PUT/GET between regions and storage nodes. Thread-safe."""

    def __init__(self, nodes: StorageNodes, nsid: int, salt: str, get_timeout_s: float = 3.0,
                 workers: int = 1, view_min_bytes: int = gather.VIEW_MIN_BYTES,
                 get_pdu_bytes: int = GET_PDU_BYTES, mac_key: bytes | None = None, lease_ms: int = 0):
        self.nodes, self.nsid, self.salt, self.get_timeout_s = nodes, nsid, salt, get_timeout_s
        self.lease_ms = lease_ms  # what a GET or range read leases on its node (no other host deletes it)
        self.view_min_bytes, self.get_pdu_bytes = view_min_bytes, get_pdu_bytes
        self.mac_key = mac_key  # None: chunks are written without a MAC and checked by crc32c alone
        self._generation, self._generation_lock = 0, threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="datapath")

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- PUT
    def put(self, region: Region, header: cf.ChunkHeader, key: bytes, runs: Sequence[gather.Run],
            done: Callable[[StoredBlock | None, DataError | None], None], kv_parts: int = 1) -> None:
        """Gather the chunk (token ids, then KV: `runs` of the region) now and Store it under `key`
        with `header` (its generation, MACs and `kv_parts` added here); done(block, None) once durable."""
        try:
            mem = _memory(region)
            _check_span(region, runs)
        except (RegionError, ValueError, TypeError) as exc:  # out of bounds, or the region is closed
            return done(None, DataError("bounds", str(exc)))
        total, ids_bytes = sum(r.nbytes for r in runs), header.token_ids_bytes
        tokens = max(1, header.token_end - header.token_start)
        slot = pacing.ticket("nic_put", total - ids_bytes, (total - ids_bytes) // tokens)  # under a profile
        if total < ids_bytes or (total - ids_bytes) % kv_parts:
            return done(None, DataError("bounds", f"runs of {total} bytes do not hold tokens [{header.token_start}, "
                                                  f"{header.token_end}) and {kv_parts} equal KV parts"))
        generation = self._next_generation()
        header = dataclasses.replace(header, kv_bytes=total - ids_bytes, generation=generation, kv_parts=kv_parts,
                                     mac_bytes=cf.MAC_BYTES if self.mac_key else 0)
        if self.mac_key:  # the MACs guard the bytes end to end: the node's crc32c serves its media alone
            payload, crc = dma.frames(mem, runs, None, self.view_min_bytes)
            frames = cf.sealed(self.mac_key, key, header, cf.cut(payload, 0, ids_bytes),
                               cf.cut(payload, ids_bytes, header.kv_bytes))
        else:
            encoded = cf.encode_header(header)
            payload, crc = dma.frames(mem, runs, _crc.crc32c(encoded), self.view_min_bytes)
            frames = [encoded, *payload]
        node = place(key, self.nodes.names, self.nodes.up())
        client = self.nodes.client(node) if node else None
        if client is None:
            return done(None, DataError("storage_unavailable", "no storage node is up"))
        length = cf.value_length(header, len(frames[0]))
        block = stored_block(header, node, key, length, crc or 0, len(frames[0]))
        capsule = nvmeof_pb2.CommandCapsule(command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_STORE,
                                            namespace_id=self.nsid, key=key, value_length=length,
                                            crc32c=crc or 0, has_crc32c=crc is not None)
        capsule.paced_until = pacing.end_of(slot)  # under a profile: the node's drive starts then at the earliest
        try:
            future = client.submit(capsule, frames)
        except Exception as exc:  # noqa: BLE001 - a closed client: report, never raise into the engine
            pacing.wait(slot)
            return done(None, DataError("storage_unavailable", str(exc)))
        pacing.wait(slot)  # the modeled NIC puts the bytes on the wire meanwhile: the PUT thread is its engine
        future.add_done_callback(lambda f: self._put_done(f, node, block, done))

    def _next_generation(self) -> int:
        with self._generation_lock:
            self._generation = cf.next_generation(self._generation, time.time_ns())
            return self._generation

    def _put_done(self, future, node: str, chunk: StoredBlock, done) -> None:
        try:
            chunk.crc32c = future.result().raise_for_status().response.crc32c  # as the node stored it
        except Exception as exc:  # noqa: BLE001 - every failure ends on the completion counter
            self.nodes.report_failure(node, exc)
            kind = "timeout" if isinstance(exc, TimeoutError) else "storage_status"
            return done(None, DataError(kind, f"store on {node}: {exc}"))
        done(chunk, None)

    # -- GET
    def get(self, region: Region, chunk: StoredBlock, runs: Sequence[gather.Run],
            done: Callable[[int, DataError | None], None]) -> None:
        """Retrieve `chunk` whole and scatter its token ids and KV into `runs` of the region; done(bytes,
        None) or done(0, error). A GET not answered within get_timeout_s ends with "timeout"; its
        answer, if it comes later, is dropped (nothing is written after the deadline)."""
        try:
            mem = _memory(region)  # held until the GET ends, as a DMA target stays pinned
            _check_span(region, runs)
        except (RegionError, ValueError, TypeError) as exc:
            return _call(done, 0, DataError("bounds", str(exc)))
        landing = Landing(chunk, mem, runs, self.mac_key, None,
                          lambda _, err: _call(done, 0 if err else landing.placed_bytes, err))
        client = self.nodes.client(chunk.storage_node)
        if client is None:
            return landing.fail(DataError("storage_unavailable", f"storage node {chunk.storage_node} is down"))
        # The MAC (or crc32c) is checked here on arrival, end to end, so the node need not check it too.
        capsule = nvmeof_pb2.CommandCapsule(command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_RETRIEVE,
                                            namespace_id=self.nsid, key=chunk.key, skip_guard_check=True,
                                            data_pdu_bytes=self.get_pdu_bytes, lease_ms=self.lease_ms)
        try:
            future = client.submit(capsule, timeout_s=self.get_timeout_s,
                                   on_data=lambda offset, frames: landing.take(0, offset, frames))
        except Exception as exc:  # noqa: BLE001
            return landing.fail(DataError("storage_unavailable", str(exc)))
        future.add_done_callback(lambda f: self._get_done(f, chunk, landing))

    def _get_done(self, future, chunk: StoredBlock, landing: Landing) -> None:
        try:
            completion = future.result().raise_for_status()
        except Exception as exc:  # noqa: BLE001
            self.nodes.report_failure(chunk.storage_node, exc)
            return landing.fail(_fetch_error(exc, f"GET of chunk {chunk.chunk_index} from {chunk.storage_node}"))
        # under a profile: the NIC lands the value once the node sent it (the drive's time was the node's)
        slot = pacing.ticket("nic_get", chunk.length, chunk.length // max(1, chunk.token_count))
        landing.take(0, completion.response.data_offset, completion.frames)
        pacing.finish(slot, lambda: landing.end_range(0))

    def restore(self, region: Region, blocks: Sequence[tuple[StoredBlock, Sequence[gather.Run]]],
                groups: Sequence[tuple[int, int]], on_group: Callable[[int, int, DataError | None], None],
                on_end: Callable[[int, DataError | None], None], kv_dtype: str = "") -> None:
        """GET each (block, runs) layer group by layer group (groups: [first, end) KV parts, a block's
        layers): per storage node one range command per group, group 0 first. on_group(i, group, error)
        reports block i's group once it landed and checked out (or failed: a block that fails reports
        every group it had not); on_end(i, error) follows block i's last report. kv_dtype: the pool's (a
        header of another fails the block, "dtype_mismatch"; "": not checked)."""
        try:
            mem = _memory(region)
            for _, runs in blocks:
                _check_span(region, runs)
        except (RegionError, ValueError, TypeError) as exc:
            for i in range(len(blocks)):
                for g in range(len(groups)):
                    _call(on_group, i, g, DataError("bounds", str(exc)))
                _call(on_end, i, DataError("bounds", str(exc)))
            return
        landings, by_node = [], {}
        for i, (chunk, runs) in enumerate(blocks):
            landing = Landing(chunk, mem, runs, self.mac_key, groups,
                              lambda g, err, i=i: on_group(i, g, err), lambda err, i=i: on_end(i, err), kv_dtype)
            landings.append(landing)
            if not landing.usable:
                landing.fail(DataError("length_mismatch", f"chunk {chunk.chunk_index}: its record cannot describe "
                                                          f"a value of this pool's layout"))
                continue
            by_node.setdefault(chunk.storage_node, []).append(landing)
        for group in range(len(groups)):
            for node, members in by_node.items():
                self._fetch_group(node, group, members)

    def _fetch_group(self, node: str, group: int, members: list[Landing]) -> None:
        """One range command for `group` of every block of `members` (all on `node`)."""
        client = self.nodes.client(node)
        if client is None:
            for landing in members:
                landing.fail(DataError("storage_unavailable", f"storage node {node} is down"))
            return
        bulk = _Bulk(group, members)
        # Without MACs only the node can vouch for the bytes: it checks each whole value's crc32c first.
        capsule = nvmeof_pb2.CommandCapsule(
            command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_RETRIEVE_RANGES, namespace_id=self.nsid,
            skip_guard_check=self.mac_key is not None, data_pdu_bytes=self.get_pdu_bytes, lease_ms=self.lease_ms,
            ranges=[nvmeof_pb2.ValueRange(key=m.chunk.key, offset=o, length=n) for m, (o, n) in zip(members, bulk.ranges)])
        try:
            future = client.submit(capsule, timeout_s=self.get_timeout_s, on_data=bulk.take)
        except Exception as exc:  # noqa: BLE001
            for landing in members:
                landing.end_range(group, DataError("storage_unavailable", str(exc)))
            return
        future.add_done_callback(lambda f: self._group_done(f, node, bulk))

    def _group_done(self, future, node: str, bulk: _Bulk) -> None:
        try:
            completion = future.result().raise_for_status()
        except Exception as exc:  # noqa: BLE001
            self.nodes.report_failure(node, exc)
            error = _fetch_error(exc, f"GET of layer group {bulk.group} from {node}")
            for landing in bulk.members:
                landing.end_range(bulk.group, error)
            return
        # under a profile: the NIC lands the group once the node sent it (the drive's time was the node's)
        tokens = sum(m.chunk.token_count for m in bulk.members)
        bulk.slot = pacing.ticket("nic_get", bulk.starts[-1],
                                  sum(m.chunk.length for m in bulk.members) // max(1, tokens))
        statuses = list(completion.response.range_status)
        if len(statuses) != len(bulk.members):
            statuses = [st.INTERNAL_ERROR.sct << 8 | st.INTERNAL_ERROR.sc] * len(bulk.members)
        bulk.take_frames(statuses, completion.frames)
        pacing.finish(bulk.slot, lambda: self._group_landed(node, bulk, statuses))

    def _group_landed(self, node: str, bulk: _Bulk, statuses: list[int]) -> None:
        for landing, status in zip(bulk.members, statuses):
            error = None
            if status:
                name = st.status_name(status >> 8, status & 0xFF)
                error = DataError(_status_kind(st.Status(status >> 8, status & 0xFF)),
                                  f"retrieve of chunk {landing.chunk.chunk_index}'s layer group {bulk.group} from "
                                  f"{node}: {name}")
            landing.end_range(bulk.group, error)

    # -- the miss path: headers of many keys, one round trip per node
    def read_heads(self, keys_by_node: dict[str, Sequence[bytes]], head_bytes: int, timeout_s: float,
                   lease_ms: int = 0) -> tuple[dict[str, list[memoryview | None]], set[str]]:
        """The first head_bytes of each key's value on its node, every node's range reads sent before any
        answer is waited for, each key leased for lease_ms: (per node, per key, its bytes, or None when it is
        absent or shorter, or its node is down or did not answer by timeout_s (a later answer is dropped);
        the nodes that did not answer in full)."""
        deadline = time.monotonic() + timeout_s
        futures = {}
        for node, keys in keys_by_node.items():
            client = self.nodes.client(node)
            left = max(0.001, deadline - time.monotonic())
            futures[node] = client.submit_heads(self.nsid, keys, head_bytes, lease_ms, left) if client else []
        pending = [f for fs in futures.values() for f in fs]
        concurrent.futures.wait(pending, timeout=max(0.0, deadline - time.monotonic()))
        silent = {node for node, fs in futures.items() if not fs or any(not f.done() or f.exception() for f in fs)}
        return {node: _heads(futures[node], len(keys), head_bytes) for node, keys in keys_by_node.items()}, silent

    # -- housekeeping
    def delete(self, chunk: StoredBlock, on_refused: Callable[[StoredBlock], None] | None = None) -> None:
        """Delete a chunk on its node (best effort, asynchronous; never blocks the caller); on_refused(chunk)
        when the node kept it because another host leased it ("key leased")."""
        self._pool.submit(self._delete, chunk, on_refused)

    def _delete(self, chunk: StoredBlock, on_refused=None) -> None:
        client = self.nodes.client(chunk.storage_node)
        if client is None:
            return
        capsule = nvmeof_pb2.CommandCapsule(command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_DELETE,
                                            namespace_id=self.nsid, key=chunk.key)
        try:
            future = client.submit(capsule)
        except Exception as exc:  # noqa: BLE001
            logger.warning("delete of a chunk on %s failed: %s", chunk.storage_node, exc)
            return
        if on_refused is not None:
            future.add_done_callback(lambda f: _if_leased(f, chunk, on_refused))


class _Bulk:
    """One range command's blocks: maps its data PDUs (offsets in the concatenation of the ranges asked
    for, none spanning two) to each block's landing."""

    def __init__(self, group: int, members: list[Landing]):
        self.group, self.members = group, members
        self.slot = None  # its slot on the modeled NIC, under a hardware profile
        self.ranges = [m.range(group) for m in members]
        self.starts = [0]
        for _, length in self.ranges:
            self.starts.append(self.starts[-1] + length)

    def take(self, offset: int, frames: Sequence) -> None:
        """A data PDU at `offset` of the concatenation (on the fabric client's I/O thread)."""
        size = sum(memoryview(f).nbytes for f in frames)
        while size:
            i = bisect.bisect_right(self.starts, offset) - 1
            if not 0 <= i < len(self.members):
                logger.warning("layer group %d: %d bytes past the ranges asked for dropped", self.group, size)
                return
            n = min(size, self.starts[i + 1] - offset)
            piece = cf.cut(frames, 0, n)
            self.members[i].take(self.group, self.ranges[i][0] + offset - self.starts[i], piece)
            frames, offset, size = cf.skip(frames, n), offset + n, size - n

    def take_frames(self, statuses: list[int], frames: Sequence) -> None:
        """Bytes that came in the response itself (no data PDUs): the ranges that succeeded, in order."""
        offset = 0
        for i, status in enumerate(statuses):
            if frames and not status:
                n = self.ranges[i][1]
                self.take(self.starts[i], cf.cut(frames, offset, n))
                offset += n


def _fetch_error(exc: Exception, what: str) -> DataError:
    if isinstance(exc, TimeoutError):
        return DataError("timeout", f"{what}: {exc}")
    if isinstance(exc, StorageStatusError):
        return DataError(_status_kind(exc.status), f"{what}: {exc}")
    return DataError("storage_status", f"{what}: {exc}")


def _status_kind(status: st.Status) -> str:
    """A failed read's DataError kind: "key_does_not_exist" (someone deleted it: the node is the authority
    on what it holds), else "storage_status"."""
    return "key_does_not_exist" if status == st.KEY_DOES_NOT_EXIST else "storage_status"


def _heads(futures: list, count: int, head_bytes: int) -> list[memoryview | None]:
    """Each key's head from a node's head reads (HEAD_RANGES keys each); None past the deadline or failed."""
    out: list[memoryview | None] = []
    for i, future in enumerate(futures):
        n = min(HEAD_RANGES, count - i * HEAD_RANGES)
        done = future.done() and future.exception() is None
        out += heads_of(future.result(), n, head_bytes) if done else [None] * n
    return out + [None] * (count - len(out))


def _if_leased(future, chunk: StoredBlock, on_refused) -> None:
    """A Delete completed: call on_refused(chunk) when the node answered "key leased"."""
    try:
        refused = future.exception() is None and \
            (future.result().response.status_code_type, future.result().response.status_code) == tuple(st.KEY_LEASED)
        if refused:
            on_refused(chunk)
    except Exception:
        logger.exception("handling a refused delete failed")


def _call(callback, *args) -> None:
    try:
        callback(*args)
    except Exception:
        logger.exception("GET completion handler failed")


def _memory(region: Region):
    """The region's bytes as a numpy array; RegionError once it is closed."""
    if region.array is None:
        raise RegionError(f"region {region.name!r} is closed")
    return region.array


def _check_span(region: Region, runs: Sequence[gather.Run]) -> None:
    """RegionError unless every byte of runs lies in the region."""
    lo, hi = gather.span(runs)
    region.check(lo, hi - lo)


def read_headers(client, nsid: int, node: str) -> list[tuple[str, StoredBlock]]:
    """(context id, block) of every chunk on a node, from List and a partial Retrieve of each header
    (for rebuild)."""
    found, start = [], b""
    while True:
        keys = client.list_keys(nsid, start_key=start, max_keys=1000)
        for key in keys:
            try:
                done = client.retrieve(nsid, key, max_bytes=cf.MAX_HEADER_BYTES)
                header, header_bytes = cf.decode_header(done.payload())
            except (StorageStatusError, cf.ChunkFormatError) as exc:
                logger.warning("skipping key %s on %s: %s", key.hex(), node, exc)
                continue
            found.append((header.context_id, stored_block(header, node, key, done.response.value_length,
                                                          done.response.crc32c, header_bytes, origin="rebuilt")))
        if len(keys) < 1000:
            return found
        start = keys[-1]
