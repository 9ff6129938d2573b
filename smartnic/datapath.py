"""The data plane: PUT gathers ranges of a region into ZeroMQ frames, GET scatters frames back.

PUT reads the region when it fires and sends [header, payload...] with copy=False: ranges of
1 MiB or more as views of the region, which it never writes while they are in flight, and
runs of smaller ones joined by one copy (`hostmem.gather` says why). GET asks for a large
value in data PDUs of `get_pdu_bytes` (NVMe/TCP's C2HData within a command) and places each
one as it arrives, so copying one part into the region overlaps receiving the next; it checks
the value's header on the first, copies the received bytes into the region once and checks
them as it copies (`hostmem.dma`): their MAC (keyed BLAKE3, `fabric.chunk_format`), made by
the PUT over the chunk's bytes, key and generation, or, with the KV MAC off, their crc32c; a
mismatch ends the GET with an error, so the bytes are never used. A GET that has not completed
by its deadline fails with "timeout" and never writes afterwards.

Completions run on the fabric client's I/O thread, where the reply arrived: a hand-off to
another thread per chunk would cost more than the completion (the crc and the copy release
the GIL). So they never block: what could (a Delete submitted while the queue pair is full)
goes to a small worker pool.
"""
from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from kvtb import crc32c as _crc
from kvtb_proto import nvmeof_pb2
from fabric import chunk_format as cf
from hostmem import dma, gather
from fabric.nodes import StorageNodes
from fabric.placement import place
from hostmem.region import Region, RegionError
from smartnic.requester import Chunk
from fabric.client import StorageStatusError

logger = logging.getLogger(__name__)

GET_PDU_BYTES = 2 << 20  # a GET asks for values larger than this in data PDUs of this size


class ChunkRef(NamedTuple):
    user_id: str
    context_id: str
    chunk_index: int
    token_start: int
    token_end: int


class DataError(Exception):
    """A failed PUT or GET; kind is what the statistics and ReadErrors report."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class Datapath:
    """PUT/GET between regions and storage nodes. Thread-safe."""

    def __init__(self, nodes: StorageNodes, nsid: int, salt: str, get_timeout_s: float = 3.0,
                 workers: int = 1, view_min_bytes: int = gather.VIEW_MIN_BYTES,
                 get_pdu_bytes: int = GET_PDU_BYTES, mac_key: bytes | None = None):
        self.nodes, self.nsid, self.salt, self.get_timeout_s = nodes, nsid, salt, get_timeout_s
        self.view_min_bytes, self.get_pdu_bytes = view_min_bytes, get_pdu_bytes
        self.mac_key = mac_key  # None: chunks are written without a MAC and checked by crc32c alone
        self._generation, self._generation_lock = 0, threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="datapath")

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- PUT
    def put(self, region: Region, ref: ChunkRef, ranges: Sequence[tuple[int, int]],
            token_ids: tuple[int, int], done: Callable[[Chunk | None, DataError | None], None],
            runs: Sequence[gather.Run] | None = None) -> None:
        """Gather the chunk from the region now and Store it; done(chunk, None) once durable.

        runs: gather.runs_of((token_ids, *ranges)), when the caller has it already.
        """
        try:
            mem = _memory(region)
            runs = runs if runs is not None else gather.runs_of((token_ids, *ranges))
            _check_span(region, runs)
            ids_view = region.view(*token_ids)
        except (RegionError, ValueError, TypeError) as exc:  # out of bounds, or the region is closed
            return done(None, DataError("bounds", str(exc)))
        if ids_view.nbytes != (ref.token_end - ref.token_start) * cf.TOKEN_ID_BYTES:
            return done(None, DataError("bounds", f"token id range of {ids_view.nbytes} bytes does not "
                                                  f"cover tokens [{ref.token_start}, {ref.token_end})"))
        kv_bytes = sum(r.nbytes for r in runs) - ids_view.nbytes
        ids_hash = cf.token_ids_hash(ids_view)
        key = cf.chunk_key(self.salt, ref.user_id, ref.context_id, ref.chunk_index)
        generation = self._next_generation()
        header = cf.encode_header(cf.ChunkHeader(ref.user_id, ref.context_id, ref.chunk_index,
                                                 ref.token_start, ref.token_end, kv_bytes, ids_hash, generation,
                                                 cf.MAC_BYTES if self.mac_key else 0))
        mac = cf.chunk_mac(self.mac_key, key, generation) if self.mac_key else None
        if mac is not None:  # the MAC guards the bytes end to end: the node's crc32c serves its media alone
            mac.update(header)
            payload, crc = dma.frames(mem, runs, None, self.view_min_bytes, mac=mac)
            trailer = mac.digest(cf.MAC_BYTES)
            frames = [header, *payload, trailer]
        else:
            payload, crc = dma.frames(mem, runs, _crc.crc32c(header), self.view_min_bytes)
            frames = [header, *payload]
        node = place(key, self.nodes.names, self.nodes.up())
        client = self.nodes.client(node) if node else None
        if client is None:
            return done(None, DataError("storage_unavailable", "no storage node is up"))
        length = len(header) + ids_view.nbytes + kv_bytes + (cf.MAC_BYTES if mac is not None else 0)
        chunk = Chunk(ref.chunk_index, ref.token_start, ref.token_end, node, key, length, crc or 0, ids_hash,
                      generation)
        capsule = nvmeof_pb2.CommandCapsule(command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_STORE,
                                            namespace_id=self.nsid, key=key, value_length=length,
                                            crc32c=crc or 0, has_crc32c=crc is not None)
        try:
            future = client.submit(capsule, frames)
        except Exception as exc:  # noqa: BLE001 - a closed client: report, never raise into the engine
            return done(None, DataError("storage_unavailable", str(exc)))
        future.add_done_callback(lambda f: self._put_done(f, node, chunk, done))

    def _next_generation(self) -> int:
        with self._generation_lock:
            self._generation = cf.next_generation(self._generation, time.time_ns())
            return self._generation

    def _put_done(self, future, node: str, chunk: Chunk, done) -> None:
        try:
            chunk.crc32c = future.result().raise_for_status().response.crc32c  # as the node stored it
        except Exception as exc:  # noqa: BLE001 - every failure ends on the completion counter
            self.nodes.report_failure(node, exc)
            kind = "timeout" if isinstance(exc, TimeoutError) else "storage_status"
            return done(None, DataError(kind, f"store on {node}: {exc}"))
        done(chunk, None)

    # -- GET
    def get(self, region: Region, ref: ChunkRef, chunk: Chunk, ranges: Sequence[tuple[int, int]],
            token_ids: tuple[int, int], done: Callable[[int, DataError | None], None],
            runs: Sequence[gather.Run] | None = None) -> None:
        """Retrieve `chunk` and scatter it into the region; done(bytes, None) or done(0, error).

        runs: gather.runs_of((token_ids, *ranges)), when the caller has it already. A GET not
        answered within get_timeout_s ends with "timeout"; its answer, if it comes later, is dropped.
        """
        def finish(nbytes: int, error: DataError | None) -> None:
            try:
                done(nbytes, error)
            except Exception:
                logger.exception("GET completion handler failed")

        try:
            mem = _memory(region)  # held until the GET ends, as a DMA target stays pinned
            targets = runs if runs is not None else gather.runs_of((token_ids, *ranges))
            _check_span(region, targets)
        except (RegionError, ValueError, TypeError) as exc:
            return finish(0, DataError("bounds", str(exc)))
        client = self.nodes.client(chunk.storage_node)
        if client is None:
            return finish(0, DataError("storage_unavailable", f"storage node {chunk.storage_node} is down"))
        # The crc32c is checked here on arrival, end to end, so the node need not check it too.
        capsule = nvmeof_pb2.CommandCapsule(command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_RETRIEVE,
                                            namespace_id=self.nsid, key=chunk.key, skip_guard_check=True,
                                            data_pdu_bytes=self.get_pdu_bytes)
        arrival = Arrival(ref, chunk, mem, targets, self.mac_key)
        try:
            future = client.submit(capsule, timeout_s=self.get_timeout_s, on_data=arrival.take)
        except Exception as exc:  # noqa: BLE001
            return finish(0, DataError("storage_unavailable", str(exc)))
        future.add_done_callback(lambda f: self._get_done(f, chunk, arrival, finish))

    def _get_done(self, future, chunk: Chunk, arrival: Arrival, finish) -> None:
        try:
            completion = future.result().raise_for_status()
        except Exception as exc:  # noqa: BLE001
            self.nodes.report_failure(chunk.storage_node, exc)
            if isinstance(exc, TimeoutError):
                return finish(0, DataError("timeout", f"GET of chunk {chunk.chunk_index} from "
                                                      f"{chunk.storage_node}: {exc}"))
            return finish(0, DataError("storage_status", f"retrieve from {chunk.storage_node}: {exc}"))
        arrival.take(completion.response.data_offset, completion.frames)
        try:
            finish(arrival.end(), None)
        except DataError as exc:
            finish(0, exc)

    # -- housekeeping
    def delete(self, chunk: Chunk) -> None:
        """Delete a chunk on its node (best effort, asynchronous; never blocks the caller)."""
        self._pool.submit(self._delete, chunk)

    def _delete(self, chunk: Chunk) -> None:
        client = self.nodes.client(chunk.storage_node)
        if client is None:
            return
        capsule = nvmeof_pb2.CommandCapsule(command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_DELETE,
                                            namespace_id=self.nsid, key=chunk.key)
        try:
            client.submit(capsule)
        except Exception as exc:  # noqa: BLE001
            logger.warning("delete of a chunk on %s failed: %s", chunk.storage_node, exc)


class Arrival:
    """A GET's value as it arrives, whole or in data PDUs, placed into the region piece by piece.

    The first piece must hold the header, which must name the chunk asked for, in the generation
    the requester knows, and fit its ranges; each piece must start where the last ended. The
    bytes land as they come and are hashed (with mac_key: the chunk's MAC) or checksummed as they
    are copied (still in cache); the MAC trailer is kept aside. end() says whether all of them
    came and match the MAC (or the chunk's crc32c). After the first failure nothing more is
    written. Pieces come on the fabric client's I/O thread, one at a time.
    """

    def __init__(self, ref: ChunkRef, chunk: Chunk, mem, targets: Sequence[gather.Run],
                 mac_key: bytes | None = None):
        self.ref, self.chunk, self.mem, self.targets = ref, chunk, mem, targets
        self.mac_key = mac_key
        self.received = 0          # bytes of the value taken so far
        self.header_bytes = -1     # known once the first piece came
        self.body_end = 0          # where the MAC trailer starts
        self.crc: int | None = 0   # None while a MAC is checked instead
        self.mac = None
        self.trailer = bytearray()
        self.error: DataError | None = None

    def take(self, offset: int, frames: Sequence) -> None:
        """Place the piece of the value that starts at `offset` (its frames, in order)."""
        if self.error is not None:
            return
        try:
            self._take(offset, frames)
        except DataError as exc:
            self.error = exc
        except Exception as exc:  # noqa: BLE001 - a bug must end on the counter, not in a log
            logger.exception("GET of chunk %d: placing a piece failed", self.chunk.chunk_index)
            self.error = DataError("internal", f"scatter failed: {exc}")

    def _take(self, offset: int, frames: Sequence) -> None:
        index = self.chunk.chunk_index
        size = sum(memoryview(f).nbytes for f in frames)
        if offset != self.received or offset + size > self.chunk.length:
            raise DataError("length_mismatch", f"chunk {index}: bytes [{offset}, {offset + size}) "
                                               f"after {self.received} of {self.chunk.length}")
        pos = offset
        if self.header_bytes < 0:  # offset 0: the piece starts with the header
            header, head = _check_header(frames, self.ref, self.chunk, self.targets, self.mac_key is not None)
            self.header_bytes, self.crc, pos = len(head), _crc.crc32c(head), len(head)
            self.body_end = self.chunk.length - header.mac_bytes
            if self.mac_key is not None:
                self.mac, self.crc = cf.chunk_mac(self.mac_key, self.chunk.key, header.generation), None
                self.mac.update(head)
        for view in cf.skip(frames, pos - offset):
            body = view[:max(0, self.body_end - pos)]
            if body.nbytes:
                runs = gather.cut(self.targets, pos - self.header_bytes, body.nbytes)
                _, self.crc = dma.scatter(body, self.mem, runs, self.crc, mac=self.mac)
            self.trailer += view[body.nbytes:]
            pos += view.nbytes
        self.received = pos

    def end(self) -> int:
        """The bytes placed, once the whole value came intact; DataError otherwise."""
        if self.error is not None:
            raise self.error
        if self.received != self.chunk.length:
            raise DataError("length_mismatch", f"chunk {self.chunk.chunk_index}: got {self.received} "
                                               f"bytes, expected {self.chunk.length}")
        if self.mac is not None:
            if not cf.same_mac(self.mac.digest(cf.MAC_BYTES), self.trailer):
                raise DataError("mac_mismatch", f"chunk {self.chunk.chunk_index}: MAC mismatch (forged, "
                                                f"moved or damaged)")
        elif self.crc != self.chunk.crc32c:
            raise DataError("crc_mismatch", f"chunk {self.chunk.chunk_index}: crc32c mismatch on arrival")
        return self.body_end - self.header_bytes


def _check_header(frames, ref: ChunkRef, chunk: Chunk, targets: Sequence[gather.Run],
                  mac: bool) -> tuple[cf.ChunkHeader, bytes]:
    """(header, its bytes), once the header matches what was asked for, in the generation the
    requester knows, carries a MAC when one is checked, and fits the ranges."""
    try:
        leading = cf.leading_bytes(frames, cf.MAX_HEADER_BYTES)
        header, header_len = cf.decode_header(leading)
    except cf.ChunkFormatError as exc:
        raise DataError("bad_header", str(exc)) from exc
    got = (header.user_id, header.context_id, header.chunk_index, header.token_start, header.token_end)
    if got != tuple(ref):
        raise DataError("bad_header", f"chunk header says {got}, expected {tuple(ref)}")
    if mac and header.mac_bytes != cf.MAC_BYTES:
        raise DataError("mac_mismatch", f"chunk {chunk.chunk_index} carries no MAC: unauthenticated")
    if header.generation != chunk.generation:
        raise DataError("stale_generation", f"chunk {chunk.chunk_index} is generation {header.generation}, "
                                            f"expected {chunk.generation} (an older copy)")
    if cf.value_length(header, header_len) != chunk.length or \
            header.token_ids_bytes + header.kv_bytes != _total(targets):
        raise DataError("length_mismatch", f"chunk {chunk.chunk_index} does not fit its ranges")
    return header, leading[:header_len]


def _memory(region: Region):
    """The region's bytes as a numpy array; RegionError once it is closed."""
    if region.array is None:
        raise RegionError(f"region {region.name!r} is closed")
    return region.array


def _check_span(region: Region, runs: Sequence[gather.Run]) -> None:
    """RegionError unless every byte of runs lies in the region."""
    lo, hi = gather.span(runs)
    region.check(lo, hi - lo)


def _total(runs: Sequence[gather.Run]) -> int:
    return sum(r.nbytes for r in runs)


def read_headers(client, nsid: int, node: str) -> list[tuple[str, str, Chunk]]:
    """Every chunk on a node, from List and a partial Retrieve of each header (for rebuild)."""
    found, start = [], b""
    while True:
        keys = client.list_keys(nsid, start_key=start, max_keys=1000)
        for key in keys:
            try:
                done = client.retrieve(nsid, key, max_bytes=cf.MAX_HEADER_BYTES)
                header, _ = cf.decode_header(done.payload())
            except (StorageStatusError, cf.ChunkFormatError) as exc:
                logger.warning("skipping key %s on %s: %s", key.hex(), node, exc)
                continue
            found.append((header.user_id, header.context_id,
                          Chunk(header.chunk_index, header.token_start, header.token_end, node, key,
                                done.response.value_length, done.response.crc32c, header.token_ids_hash,
                                header.generation)))
        if len(keys) < 1000:
            return found
        start = keys[-1]
