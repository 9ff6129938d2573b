"""The CPU-centric baseline (policy `cpu`): the compute process moves the KV itself.

When a block fills, the engine thread copies it out of the pool (the paper's cudaMemcpy), stores
it on a storage node through the fabric and waits for the acknowledgement before it goes on
(`CpuOffload(in_flight=1)`, the baseline). With `in_flight=K > 1` the same process keeps up to K
blocks' stores outstanding and waits only when K are out (pipelining alone, without the NIC: the
paper study's `cpu-pipelined` path); its owner calls `drain()` before it counts the transfer done. A
follow-up's stored prefix is found in this process's own index (by the blocks' hash chain, as the
agent finds it), retrieved, checked and copied back into the blocks the engine allocated; then
the blocks' GET completion counters are bumped as the agent would, so the engine waits the same
way. Chunks use the agent's format, MAC, keys and placement (fabric.chunk_format,
fabric.placement); a restore checks each chunk's generation and MAC (or, with the KV MAC off,
its crc32c) before its bytes are used, and falls back to recompute otherwise.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time

from compute_node.kv_pool import KvPool
from compute_node.offload import Block, OffloadStats
from compute_node.restore import PendingRestore
from compute_node.sequence import Sequence
from fabric import chunk_format as cf
from fabric.auth import FabricSecurity
from fabric.placement import place
from hostmem.block_hash import stored_prefix
from kvtb_proto import nvmeof_pb2
from scale import paced

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StoredBlock:
    node: str
    key: bytes
    token_count: int
    length: int
    generation: int


@dataclasses.dataclass
class PendingStore:
    """A block's Store sent and not acknowledged yet; its block is indexed only once the completion succeeded.

    `frames` stay referenced here: the fabric client sends them without a copy until the future resolves."""
    name: bytes             # the block's hash: its key in the index
    stored: StoredBlock
    future: concurrent.futures.Future
    frames: list
    nbytes: int
    wait_s: float           # how long finish() waits for the completion at most


class CpuStore:
    """Fabric clients to the storage nodes and the index of this process's own blocks, by hash.

    Used by the engine thread only (the lock guards lazy connection).
    """

    def __init__(self, addresses: tuple[str, ...], host_nqn: str, nsid: int, salt: str,
                 timeout_s: float = 5.0, security: FabricSecurity | None = None, mac_key: bytes | None = None):
        self.nodes = list(addresses)
        self.host_nqn, self.nsid, self.salt, self.timeout_s = host_nqn, nsid, salt, timeout_s
        self.security, self.mac_key = security or FabricSecurity.off(), mac_key
        self.generation = 0
        self.index: dict[bytes, StoredBlock] = {}
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

    def put(self, pool: KvPool, block: Block) -> int:
        """Copy the block out of the pool, store it and wait for the ack; the bytes stored."""
        return self.finish(self.submit(pool, block))

    def submit(self, pool: KvPool, block: Block) -> PendingStore:
        """Copy the block out of the pool, seal it and send its Store; the Store to finish()."""
        L = pool.layout
        offset, length = L.block_range(block.block_id)
        real_per_token = length // max(1, L.block_tokens)
        copy = paced.ticket("cpu_copy", length, real_per_token)  # under a profile: cudaMemcpy D2H + the host stack
        ids = pool.read_token_ids(block.block_id, block.token_count).astype("<u4").tobytes()
        kv = bytes(pool.region.view(offset, length))  # the copy out of "GPU memory"
        start = block.index * L.block_tokens
        key = cf.block_key(self.salt, block.hash)
        self.generation = cf.next_generation(self.generation, time.time_ns())
        header = cf.ChunkHeader(block.user, block.context, block.index, start, start + block.token_count, len(kv),
                                block.hash, self.generation, cf.MAC_BYTES if self.mac_key else 0, block.tenant,
                                block.parent, block.shared, kv_parts=L.num_layers, kv_dtype=L.kv_dtype)
        frames = cf.sealed(self.mac_key, key, header, [ids], [kv])
        paced.wait(copy)
        wire = paced.ticket("host_to_wire", length, real_per_token)  # the NIC's DMA from host memory, the fabric
        paced.settle(wire)  # its bytes cross while the node waits for them: the node checks they came in time
        node = place(key, self.nodes)
        client = self.client(node)
        nbytes = sum(len(f) for f in frames)
        capsule = nvmeof_pb2.CommandCapsule(  # as FabricClient.store builds it
            command_set=nvmeof_pb2.KEY_VALUE, opcode=nvmeof_pb2.KV_STORE, namespace_id=self.nsid, key=key,
            value_length=sum(memoryview(f).nbytes for f in frames), crc32c=cf.crc32c_of(frames), has_crc32c=True,
            paced_until=paced.end_of(wire))
        future = client.submit(capsule, frames)
        stored = StoredBlock(node, key, block.token_count, nbytes, self.generation)
        return PendingStore(block.hash, stored, future, frames, nbytes, client.timeout_s + 5.0)

    def finish(self, pending: PendingStore) -> int:
        """Wait for a Store's completion (raises on a failure or a non-zero status), then index its block;
        the bytes stored."""
        completion = pending.future.result(timeout=pending.wait_s)
        completion.raise_for_status()
        self.index[pending.name] = pending.stored
        return pending.nbytes

    def stored_tokens(self, seq: Sequence, bm) -> int:
        """Tokens of seq's prefix whose blocks this process stored (one left to compute)."""
        tokens, _ = stored_prefix(seq.token_ids, seq.salt, seq.block_tokens, self.index.__contains__,
                                  len(seq.token_ids) - 1)
        return tokens

    def restore(self, pool: KvPool, seq: Sequence, pending: PendingRestore) -> None:
        """Retrieve each block into its pool block and bump its GET counters (error part on failure)."""
        failed = False
        for block in pending.blocks:
            ok = not failed and self._get(pool, block)
            failed = failed or not ok
            for counter in block.counters:
                pool.region.add_counter(counter, success=1 if ok else 0, error=0 if ok else 1)

    def _get(self, pool: KvPool, block) -> bool:
        stored = self.index.get(block.hash)
        if stored is None or stored.token_count != block.token_count:
            return False
        try:
            completion = self.client(stored.node).retrieve(self.nsid, stored.key)
            value = completion.payload()  # one frame: no copy
            header, layout = cf.check_value(self.mac_key, stored.key, value)  # length and every MAC
            if header.generation != stored.generation:
                raise ValueError(f"generation {header.generation}, expected {stored.generation} (an older copy)")
            if not self.mac_key and cf.crc32c_of([value]) != completion.response.crc32c:
                raise ValueError("crc32c mismatch")
            L = pool.layout
            ids_offset, ids_length = L.token_ids_range(block.block_id, block.token_count)
            kv_offset, kv_length = L.block_range(block.block_id)
            if header.name != block.hash or header.num_tokens != block.token_count or layout.kv_bytes != kv_length:
                raise ValueError("the stored block is not the one asked for")
            if header.kv_dtype != L.kv_dtype:  # never read KV as another type
                raise ValueError(f"the block holds {header.kv_dtype} KV, the pool {L.kv_dtype}")
            cf.scatter(cf.cut([value], layout.ids_offset, ids_length), [pool.region.view(ids_offset, ids_length)])
            cf.scatter(cf.cut([value], layout.kv_offset, layout.kv_bytes), [pool.region.view(kv_offset, kv_length)])
            return True
        except Exception as exc:  # noqa: BLE001 - any failure: this block and the rest are recomputed
            logger.warning("cpu restore of block %d failed: %s", block.index, exc)
            return False

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()


class CpuOffload:
    """Offload driven by the compute process: store each block as it fills, and wait.

    in_flight=1 (the baseline, as the engine runs it): each block's Store is acknowledged before store()
    returns. in_flight=K > 1: store() returns once the block is sent, waiting first (oldest first) while K
    Stores are out; drain() waits for the rest. Either way a failed Store is counted in `errors` (never
    acknowledged silently) and a block is indexed as stored, and counted in its OffloadStats, only once its
    completion succeeded. Not thread-safe: one thread (the engine's) calls store() and drain().
    """

    offloads = True

    def __init__(self, pool: KvPool, store: CpuStore, in_flight: int = 1):
        if in_flight < 1:
            raise ValueError(f"in_flight must be at least 1, not {in_flight}")
        self.pool = pool
        self.store_ = store
        self.in_flight = in_flight
        self.errors = 0
        self.last_error = ""
        self._outstanding: collections.deque[tuple[PendingStore, Block, OffloadStats]] = collections.deque()

    @property
    def outstanding(self) -> int:
        """Stores sent and not finished yet."""
        return len(self._outstanding)

    def store(self, block: Block, stats: OffloadStats) -> None:
        try:
            pending = self.store_.submit(self.pool, block)
        except Exception as exc:  # noqa: BLE001 - offload failures never fail the turn
            self._failed(block, exc)
            return None
        self._outstanding.append((pending, block, stats))
        while self._outstanding and (len(self._outstanding) >= self.in_flight
                                     or self._outstanding[0][0].future.done()):
            self._finish_oldest()  # in_flight=1: this block's own ack, before the engine goes on
        return None

    def drain(self) -> int:
        """Wait for every outstanding Store (oldest first); how many there were."""
        count = len(self._outstanding)
        while self._outstanding:
            self._finish_oldest()
        return count

    def _finish_oldest(self) -> None:
        pending, block, stats = self._outstanding.popleft()
        try:
            stats.bytes += self.store_.finish(pending)
            stats.chunks += 1
        except Exception as exc:  # noqa: BLE001 - offload failures never fail the turn
            self._failed(block, exc)

    def _failed(self, block: Block, exc: Exception) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        logger.warning("cpu offload of block %d failed: %s", block.index, exc)
