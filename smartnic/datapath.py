"""The data plane: PUT gathers ranges of a region into ZeroMQ frames, GET scatters frames back.

PUT reads the region when it fires and sends [header, payload...] with copy=False: ranges of
1 MiB or more as views of the region, which it never writes while they are in flight, and
runs of smaller ones joined by one copy (`smartnic.gather` says why). GET checks the value's
header on arrival, copies the received bytes into the region once and checks their crc32c as
it copies; a mismatch ends the GET with an error, so the bytes are never used. A GET that has
not completed by its deadline fails with "timeout" and never writes afterwards.

Completions run on the fabric client's I/O thread, where the reply arrived: a hand-off to
another thread per chunk would cost more than the completion (the crc and the copy release
the GIL). So they never block: what could (a Delete submitted while the queue pair is full)
goes to a small worker pool.
"""
from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable, Sequence
from typing import NamedTuple

from kvtb import crc32c as _crc
from kvtb_proto import nvmeof_pb2
from smartnic import chunk_format as cf
from smartnic import gather
from smartnic.fabric import StorageNodes
from smartnic.placement import place
from smartnic.region import Region, RegionError
from smartnic.requester import Chunk
from storage_node.client import StorageStatusError

logger = logging.getLogger(__name__)


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
                 workers: int = 1, view_min_bytes: int = gather.VIEW_MIN_BYTES):
        self.nodes, self.nsid, self.salt, self.get_timeout_s = nodes, nsid, salt, get_timeout_s
        self.view_min_bytes = view_min_bytes
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
        header = cf.encode_header(cf.ChunkHeader(ref.user_id, ref.context_id, ref.chunk_index,
                                                 ref.token_start, ref.token_end, kv_bytes, ids_hash))
        payload, crc = gather.frames(mem, runs, _crc.crc32c(header), _crc.extend, self.view_min_bytes)
        frames = [header, *payload]
        key = cf.chunk_key(self.salt, ref.user_id, ref.context_id, ref.chunk_index)
        node = place(key, self.nodes.names, self.nodes.up())
        client = self.nodes.client(node) if node else None
        if client is None:
            return done(None, DataError("storage_unavailable", "no storage node is up"))
        length = len(header) + ids_view.nbytes + kv_bytes
        chunk = Chunk(ref.chunk_index, ref.token_start, ref.token_end, node, key, length, crc, ids_hash)
        capsule = nvmeof_pb2.CommandCapsule(command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_STORE,
                                            namespace_id=self.nsid, key=key, value_length=length,
                                            crc32c=crc, has_crc32c=True)
        try:
            future = client.submit(capsule, frames)
        except Exception as exc:  # noqa: BLE001 - a closed client: report, never raise into the engine
            return done(None, DataError("storage_unavailable", str(exc)))
        future.add_done_callback(lambda f: self._put_done(f, node, chunk, done))

    def _put_done(self, future, node: str, chunk: Chunk, done) -> None:
        try:
            future.result().raise_for_status()
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
                                            namespace_id=self.nsid, key=chunk.key, skip_guard_check=True)
        try:
            future = client.submit(capsule, timeout_s=self.get_timeout_s)
        except Exception as exc:  # noqa: BLE001
            return finish(0, DataError("storage_unavailable", str(exc)))
        future.add_done_callback(lambda f: self._get_done(f, ref, chunk, mem, targets, finish))

    def _get_done(self, future, ref: ChunkRef, chunk: Chunk, mem, targets, finish) -> None:
        try:
            completion = future.result().raise_for_status()
        except Exception as exc:  # noqa: BLE001
            self.nodes.report_failure(chunk.storage_node, exc)
            if isinstance(exc, TimeoutError):
                return finish(0, DataError("timeout", f"GET of chunk {chunk.chunk_index} from "
                                                      f"{chunk.storage_node}: {exc}"))
            return finish(0, DataError("storage_status", f"retrieve from {chunk.storage_node}: {exc}"))
        frames = completion.frames
        try:
            head = self._check(frames, ref, chunk, targets)
        except DataError as exc:
            return finish(0, exc)
        # The bytes land first and are checksummed as they are copied (still in cache); a
        # mismatch ends on the completion counter's error part, which tells the compute node
        # not to use the slot's contents.
        try:
            nbytes, crc = _scatter(cf.skip(frames, len(head)), mem, targets, _crc.crc32c(head))
        except Exception as exc:  # noqa: BLE001 - a bug must end on the counter, not in a log
            logger.exception("GET of chunk %d: scatter failed", chunk.chunk_index)
            return finish(0, DataError("internal", f"scatter failed: {exc}"))
        if crc != chunk.crc32c:
            return finish(0, DataError("crc_mismatch",
                                       f"chunk {chunk.chunk_index}: crc32c mismatch on arrival"))
        finish(nbytes, None)

    @staticmethod
    def _check(frames, ref: ChunkRef, chunk: Chunk, targets: Sequence[gather.Run]) -> bytes:
        """The header's bytes, once the value's length and header match what was asked for."""
        size = sum(memoryview(f).nbytes for f in frames)
        if size != chunk.length:
            raise DataError("length_mismatch", f"chunk {chunk.chunk_index}: got {size} bytes, "
                                               f"expected {chunk.length}")
        try:
            leading = cf.leading_bytes(frames, cf.MAX_HEADER_BYTES)
            header, header_len = cf.decode_header(leading)
        except cf.ChunkFormatError as exc:
            raise DataError("bad_header", str(exc)) from exc
        got = (header.user_id, header.context_id, header.chunk_index, header.token_start, header.token_end)
        if got != tuple(ref):
            raise DataError("bad_header", f"chunk header says {got}, expected {tuple(ref)}")
        if header_len + header.token_ids_bytes + header.kv_bytes != size or \
                header.token_ids_bytes + header.kv_bytes != _total(targets):
            raise DataError("length_mismatch", f"chunk {chunk.chunk_index} does not fit its ranges")
        return leading[:header_len]

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


def _scatter(payload: list[memoryview], mem, targets: Sequence[gather.Run], crc: int) -> tuple[int, int]:
    """Copy the payload views into the target runs of mem (one copy); (bytes copied, crc extended)."""
    if len(payload) == 1:
        return gather.scatter(payload[0], mem, targets, crc, _crc.extend)
    for view in payload:
        crc = _crc.extend(crc, view)
    views = [memoryview(mem)[o:o + n] for r in targets for o, n in
             ((r.first + i * r.stride, r.length) for i in range(r.count))]
    return cf.scatter(payload, views), crc


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
                                done.response.value_length, done.response.crc32c, header.token_ids_hash)))
        if len(keys) < 1000:
            return found
        start = keys[-1]
