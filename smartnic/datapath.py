"""The data plane: PUT gathers views of a region into ZeroMQ frames, GET scatters frames back.

PUT sends [header, token ids view, KV views...] with copy=False and never writes to those
views while they are in flight. GET checks the value's crc32c and its header on arrival and
copies each received frame into the region once. A GET that has not completed by its
deadline fails with "timeout" and never writes afterwards. Completions run on a small
worker pool, never on a fabric client's I/O thread.
"""
from __future__ import annotations

import concurrent.futures
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from kvtb_proto import nvmeof_pb2
from smartnic import chunk_format as cf
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


class _Deadlines:
    """One thread calling callbacks at their deadlines (monotonic seconds)."""

    def __init__(self):
        self._heap: list = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stop = False
        threading.Thread(target=self._run, name="get-deadlines", daemon=True).start()

    def add(self, deadline: float, callback: Callable[[], None]) -> None:
        with self._cond:
            heapq.heappush(self._heap, (deadline, next(self._seq), callback))
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and (not self._heap or self._heap[0][0] > time.monotonic()):
                    self._cond.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                if self._stop:
                    return
                _, _, callback = heapq.heappop(self._heap)
            callback()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()


class _Once:
    """First caller of claim() wins (the completion or the deadline, never both)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._done = False

    def claim(self) -> bool:
        with self._lock:
            won, self._done = not self._done, True
            return won


class Datapath:
    """PUT/GET between regions and storage nodes. Thread-safe."""

    def __init__(self, nodes: StorageNodes, nsid: int, salt: str, get_timeout_s: float = 3.0,
                 workers: int = 4):
        self.nodes, self.nsid, self.salt, self.get_timeout_s = nodes, nsid, salt, get_timeout_s
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="datapath")
        self._deadlines = _Deadlines()

    def close(self) -> None:
        self._deadlines.stop()
        self._pool.shutdown(wait=True, cancel_futures=True)

    # -- PUT
    def put(self, region: Region, ref: ChunkRef, ranges: Sequence[tuple[int, int]],
            token_ids: tuple[int, int], done: Callable[[Chunk | None, DataError | None], None]) -> None:
        """Gather the chunk from the region now and Store it; done(chunk, None) once durable."""
        try:
            ids_view = region.view(*token_ids)
            kv_views = [region.view(o, n) for o, n in ranges]
        except RegionError as exc:
            return done(None, DataError("bounds", str(exc)))
        if ids_view.nbytes != (ref.token_end - ref.token_start) * cf.TOKEN_ID_BYTES:
            return done(None, DataError("bounds", f"token id range of {ids_view.nbytes} bytes does not "
                                                  f"cover tokens [{ref.token_start}, {ref.token_end})"))
        kv_bytes = sum(v.nbytes for v in kv_views)
        header = cf.encode_header(cf.ChunkHeader(ref.user_id, ref.context_id, ref.chunk_index,
                                                 ref.token_start, ref.token_end, kv_bytes,
                                                 cf.token_ids_hash(ids_view)))
        frames = [header, ids_view, *kv_views]
        crc = cf.crc32c_of(frames)
        key = cf.chunk_key(self.salt, ref.user_id, ref.context_id, ref.chunk_index)
        node = place(key, self.nodes.names, self.nodes.up())
        client = self.nodes.client(node) if node else None
        if client is None:
            return done(None, DataError("storage_unavailable", "no storage node is up"))
        length = len(header) + ids_view.nbytes + kv_bytes
        chunk = Chunk(ref.chunk_index, ref.token_start, ref.token_end, node, key, length, crc,
                      cf.token_ids_hash(ids_view))
        capsule = nvmeof_pb2.CommandCapsule(command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_STORE,
                                            namespace_id=self.nsid, key=key, value_length=length,
                                            crc32c=crc, has_crc32c=True)
        try:
            future = client.submit(capsule, frames)
        except Exception as exc:  # noqa: BLE001 - a closed client: report, never raise into the engine
            return done(None, DataError("storage_unavailable", str(exc)))
        future.add_done_callback(lambda f: self._pool.submit(self._put_done, f, node, chunk, done))

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
            token_ids: tuple[int, int], done: Callable[[int, DataError | None], None]) -> None:
        """Retrieve `chunk` and scatter it into the region; done(bytes, None) or done(0, error)."""
        once = _Once()

        def finish(nbytes: int, error: DataError | None) -> None:
            try:
                done(nbytes, error)
            except Exception:
                logger.exception("GET completion handler failed")

        def expire() -> None:
            if once.claim():
                self.nodes.report_failure(chunk.storage_node, TimeoutError("GET deadline"))
                finish(0, DataError("timeout", f"GET of chunk {chunk.chunk_index} from "
                                               f"{chunk.storage_node} took over {self.get_timeout_s} s"))

        try:
            targets = [region.view(*token_ids)] + [region.view(o, n) for o, n in ranges]
        except RegionError as exc:
            return finish(0, DataError("bounds", str(exc)))
        client = self.nodes.client(chunk.storage_node)
        if client is None:
            return finish(0, DataError("storage_unavailable", f"storage node {chunk.storage_node} is down"))
        capsule = nvmeof_pb2.CommandCapsule(command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_RETRIEVE,
                                            namespace_id=self.nsid, key=chunk.key)
        self._deadlines.add(time.monotonic() + self.get_timeout_s, expire)
        try:
            future = client.submit(capsule)
        except Exception as exc:  # noqa: BLE001
            if once.claim():
                finish(0, DataError("storage_unavailable", str(exc)))
            return
        future.add_done_callback(
            lambda f: self._pool.submit(self._get_done, f, ref, chunk, targets, once, finish))

    def _get_done(self, future, ref: ChunkRef, chunk: Chunk, targets, once: _Once, finish) -> None:
        try:
            completion = future.result().raise_for_status()
        except Exception as exc:  # noqa: BLE001
            self.nodes.report_failure(chunk.storage_node, exc)
            if once.claim():
                kind = "timeout" if isinstance(exc, TimeoutError) else "storage_status"
                finish(0, DataError(kind, f"retrieve from {chunk.storage_node}: {exc}"))
            return
        frames = completion.frames
        try:
            self._check(frames, ref, chunk, targets)
        except DataError as exc:
            if once.claim():
                finish(0, exc)
            return
        if not once.claim():
            return  # the deadline passed: never write late
        nbytes = cf.scatter(cf.skip(frames, chunk.length - sum(t.nbytes for t in targets)), targets)
        finish(nbytes, None)

    @staticmethod
    def _check(frames, ref: ChunkRef, chunk: Chunk, targets) -> None:
        size = sum(memoryview(f).nbytes for f in frames)
        if size != chunk.length:
            raise DataError("length_mismatch", f"chunk {chunk.chunk_index}: got {size} bytes, "
                                               f"expected {chunk.length}")
        if cf.crc32c_of(frames) != chunk.crc32c:
            raise DataError("crc_mismatch", f"chunk {chunk.chunk_index}: crc32c mismatch on arrival")
        try:
            header, header_len = cf.decode_header(cf.leading_bytes(frames, cf.MAX_HEADER_BYTES))
        except cf.ChunkFormatError as exc:
            raise DataError("bad_header", str(exc)) from exc
        got = (header.user_id, header.context_id, header.chunk_index, header.token_start, header.token_end)
        if got != tuple(ref):
            raise DataError("bad_header", f"chunk header says {got}, expected {tuple(ref)}")
        if header_len + header.token_ids_bytes + header.kv_bytes != size or \
                header.token_ids_bytes + header.kv_bytes != sum(t.nbytes for t in targets):
            raise DataError("length_mismatch", f"chunk {chunk.chunk_index} does not fit its ranges")

    # -- housekeeping
    def delete(self, chunk: Chunk) -> None:
        """Delete a chunk on its node (best effort, asynchronous)."""
        client = self.nodes.client(chunk.storage_node)
        if client is None:
            return
        capsule = nvmeof_pb2.CommandCapsule(command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_DELETE,
                                            namespace_id=self.nsid, key=chunk.key)
        try:
            client.submit(capsule)
        except Exception as exc:  # noqa: BLE001
            logger.warning("delete of a chunk on %s failed: %s", chunk.storage_node, exc)


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
