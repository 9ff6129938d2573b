"""The CPU-centric baseline (policy `cpu`): the compute process moves the KV itself.

At each chunk boundary it copies the chunk out of the slot (the cudaMemcpy of the paper),
sends it to a storage node through the fabric and waits for the acknowledgement before the
next token. On a follow-up it retrieves its own chunks and copies them back into the slot.
Chunks use the agent's format, MAC and keys (fabric.chunk_format) and placement; a restore
checks each chunk's generation and MAC (or, with the KV MAC off, its crc32c) before its bytes
are used, and falls back to recompute otherwise.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time

import numpy as np

from fabric import chunk_format as cf
from fabric.auth import FabricSecurity
from fabric.placement import place
from compute_node.kv_pool import KvPool
from compute_node.offload import OffloadTurn, chunk_bytes
from compute_node.restore import RestoreOutcome

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StoredChunk:
    index: int
    start: int
    end: int
    node: str
    key: bytes
    generation: int = 0


class CpuStore:
    """Fabric clients to the storage nodes and the index of this process's own chunks.

    Used by the engine thread only (the lock guards lazy connection).
    """

    def __init__(self, addresses: tuple[str, ...], host_nqn: str, nsid: int, salt: str,
                 timeout_s: float = 5.0, security: FabricSecurity | None = None, mac_key: bytes | None = None):
        self.nodes = list(addresses)
        self.host_nqn, self.nsid, self.salt, self.timeout_s = host_nqn, nsid, salt, timeout_s
        self.security, self.mac_key = security or FabricSecurity.off(), mac_key
        self.generation = 0
        self.index: dict[tuple[str, str], dict[int, StoredChunk]] = {}
        self._clients: dict[str, object] = {}
        self._lock = threading.Lock()

    def client(self, node: str):
        from fabric.client import FabricClient
        with self._lock:
            client = self._clients.get(node)
            if client is None:
                client = FabricClient(node, self.host_nqn, timeout_s=self.timeout_s, security=self.security)
                client.connect()
                self._clients[node] = client
            return client

    def drop_client(self, node: str) -> None:
        with self._lock:
            client = self._clients.pop(node, None)
        if client is not None:
            client.close()

    def put(self, pool: KvPool, slot: int, user: str, context: str, index: int, start: int,
            end: int) -> int:
        """Copy tokens [start, end) of the slot out, store them and wait for the ack; return bytes."""
        L = pool.layout
        ids = pool.read_token_ids(slot, start, end).astype("<u4").tobytes()
        kv = bytearray((end - start) * L.kv_bytes_per_token)  # the copy out of "GPU memory"
        pos = 0
        for offset, length in L.kv_ranges(slot, start, end):
            kv[pos:pos + length] = pool.region.view(offset, length)
            pos += length
        key = cf.chunk_key(self.salt, user, context, index)
        self.generation = cf.next_generation(self.generation, time.time_ns())
        header = cf.encode_header(cf.ChunkHeader(user, context, index, start, end, len(kv), cf.token_ids_hash(ids),
                                                 self.generation, cf.MAC_BYTES if self.mac_key else 0))
        frames = [header, ids, kv]
        if self.mac_key:
            frames.append(cf.mac_of(self.mac_key, key, self.generation, frames))
        node = place(key, self.nodes)
        self.client(node).store(self.nsid, key, frames, cf.crc32c_of(frames))
        self.index.setdefault((user, context), {})[index] = StoredChunk(index, start, end, node, key,
                                                                        self.generation)
        return sum(len(f) for f in frames)

    def restore(self, pool: KvPool, slot: int, user: str, context: str,
                request_ids: np.ndarray) -> RestoreOutcome | None:
        """Retrieve this context's chunks that match a prefix of request_ids into slot; None if none."""
        chunks = self.index.get((user, context))
        if not chunks:
            return None
        usable = []
        for i in range(len(chunks)):
            chunk = chunks.get(i)
            if chunk is None or chunk.start != (usable[-1].end if usable else 0) or chunk.end > len(request_ids):
                break
            usable.append(chunk)
        announced = usable[-1].end if usable else 0
        covered, nbytes = 0, 0
        for chunk in usable:
            try:
                nbytes += self._get(pool, slot, chunk, user, context, request_ids)
            except Exception as exc:  # noqa: BLE001 - any failure means: recompute from here
                reason = f"restore failed: chunk {chunk.index}: {exc}"
                logger.warning("cpu restore of %s/%s: %s", user, context, reason)
                return RestoreOutcome(0, announced, reason)
            covered = chunk.end
        covered = min(covered, len(request_ids) - 1)
        return RestoreOutcome(covered, announced, "", nbytes if covered else 0)

    def _get(self, pool: KvPool, slot: int, chunk: StoredChunk, user: str, context: str,
             request_ids: np.ndarray) -> int:
        completion = self.client(chunk.node).retrieve(self.nsid, chunk.key)
        value = completion.payload()  # one frame: no copy
        header, hlen = cf.decode_header(cf.leading_bytes([value], cf.MAX_HEADER_BYTES))
        if header.generation != chunk.generation:
            raise ValueError(f"generation {header.generation}, expected {chunk.generation} (an older copy)")
        if cf.value_length(header, hlen) != value.nbytes:
            raise ValueError(f"a value of {value.nbytes} bytes, its header says {cf.value_length(header, hlen)}")
        body = value[:value.nbytes - header.mac_bytes]
        if self.mac_key:
            if header.mac_bytes != cf.MAC_BYTES or not cf.same_mac(
                    cf.mac_of(self.mac_key, chunk.key, chunk.generation, [body]), value[body.nbytes:]):
                raise ValueError("MAC mismatch (forged, moved or damaged)")
        elif cf.crc32c_of([value]) != completion.response.crc32c:
            raise ValueError("crc32c mismatch")
        expected = request_ids[chunk.start:chunk.end].astype("<u4").tobytes()
        if (header.user_id, header.context_id, header.token_start, header.token_end) != \
                (user, context, chunk.start, chunk.end) or header.token_ids_hash != cf.token_ids_hash(expected):
            raise ValueError("chunk does not cover the request's token ids")
        frames = [body]
        L = pool.layout
        offset, length = L.token_ids_range(slot, chunk.start, chunk.end)
        targets = [pool.region.view(offset, length)]
        targets += [pool.region.view(o, n) for o, n in L.kv_ranges(slot, chunk.start, chunk.end)]
        return cf.scatter(cf.skip(frames, hlen), targets)

    def close(self) -> None:
        for node in list(self._clients):
            self.drop_client(node)


class CpuOffload:
    """Offload driven by the compute process: store each chunk as it completes, and wait."""

    def __init__(self, pool: KvPool, store: CpuStore):
        self.pool = pool
        self.store = store
        self.errors = 0

    def begin(self, turn: OffloadTurn, count: int) -> None:
        turn.last_stored = count

    def arm(self, turn: OffloadTurn) -> None:
        pass

    def _store(self, turn: OffloadTurn, start: int, end: int) -> None:
        t0 = time.perf_counter()
        try:
            self.store.put(self.pool, turn.slot, turn.user_id, turn.context_id,
                           start // self.pool.layout.chunk_tokens, start, end)
            turn.chunks += 1
            turn.bytes += chunk_bytes(self.pool, start, end)
        except Exception as exc:  # noqa: BLE001 - offload failures never fail the turn
            self.errors += 1
            logger.warning("cpu offload of tokens [%d, %d) failed: %s", start, end, exc)
        turn.stall_s += time.perf_counter() - t0

    def on_tokens(self, turn: OffloadTurn, count: int) -> None:
        """Store every chunk completed since the last call, before the next token."""
        c = self.pool.layout.chunk_tokens
        first = max(turn.first_chunk, turn.last_stored // c)
        for i in range(first, count // c):
            self._store(turn, i * c, (i + 1) * c)
        if count // c > turn.last_stored // c:
            turn.last_stored = count

    def end(self, turn: OffloadTurn, count: int) -> None:
        c = self.pool.layout.chunk_tokens
        if count % c and count // c >= turn.first_chunk:
            self._store(turn, count // c * c, count)
