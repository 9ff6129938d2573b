"""Steps 2 and 8 from the compute side: each block that fills leaves the pool, as the policy says.

- triggered (the paper's design): the agent armed one standing PUT per block at registration
  (step 1). Here the engine only writes the block's descriptor into the region and stores its
  generation into the block's PUT trigger counter: no RPC, no copy, and no syscall unless the
  agent's watcher went to sleep since the last burst of stores (then one, to ring its doorbell:
  hostmem.bell). The blocks that filled in one step go as one batch (`store_many`: every descriptor,
  then every trigger, then the doorbell once). The block stays pinned until the agent's PUT-done counter moves, however long that
  takes (past drain_timeout_s the turn no longer waits for it, but the block is not reused). Where
  hostmem/_trigger.c is built, a batch's records, stamps and trigger stores are one C call.
- cpu (the CPU-centric baseline): the compute process copies the block out and stores it through
  the fabric itself, waiting for the acknowledgement before it goes on (compute_node.cpu_offload).
- resident and recompute: nothing leaves.

The engine measures the stall (the time its thread spends offloading a block: naming it, the
offloader's store, its bookkeeping and polling the PUT-done counters), not the offloaders: in wall
time, and in its thread's CPU time (the difference is the thread waiting: for the interpreter lock
another thread of the process held, or for a CPU).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import NamedTuple

from compute_node.kv_pool import KvPool
from hostmem.bell import Bell
from hostmem.descriptor import Writer, store_batch
from hostmem.kv_layout import DESCRIPTOR_BYTES, TOKEN_ID_BYTES

logger = logging.getLogger(__name__)


class Block(NamedTuple):
    """A block of a sequence to store: what the descriptor says about it (a tuple: one per block filled)."""

    block_id: int
    index: int            # its index in the sequence
    token_count: int
    hash: bytes
    parent: bytes
    tenant: str
    user: str
    context: str
    shared: bool = False


class PendingPut(NamedTuple):
    """A triggered PUT in flight: done once its PUT-done counter moved past `base` (success or error).

    Past `deadline` (drain_timeout_s) the turn goes on without it (counted as not stored), but the block
    stays pinned until the counter moves: the NIC may still be reading it (the engine's stuck_puts).
    """

    block_id: int
    counter: int
    base: tuple[int, int]   # the counter's (success, error) before the trigger
    bytes: int
    deadline: float

    def ended(self, success: int, error: int) -> bool:
        return success + error > sum(self.base)

    def stored(self, success: int, error: int) -> bool:
        return success > self.base[0] and error == self.base[1]


@dataclasses.dataclass
class OffloadStats:
    """What offload cost one turn."""

    chunks: int = 0
    bytes: int = 0
    stall_s: float = 0.0
    stall_cpu_s: float = 0.0  # of stall_s, the engine thread's CPU time (the rest: waits, for the GIL or a CPU)

    def count(self, nbytes: int) -> None:
        """A chunk of nbytes went out (or its PUT is in flight)."""
        self.chunks += 1
        self.bytes += nbytes

    def charge(self, wall_s: float, cpu_s: float) -> None:
        self.stall_s += wall_s
        self.stall_cpu_s += cpu_s


class NoOffload:
    """resident and recompute: nothing leaves the pool."""

    offloads = False

    def store(self, block: Block, stats: OffloadStats) -> PendingPut | None:
        return None


class TriggeredOffload:
    """Descriptor write and counter store: the GPU thread's part of a triggered PUT (steps 2, 8).

    The layout's offsets are read once here: a block's store is a few integer operations, one
    record packed into the region and one 8-byte store (`kvtb bench offload` times it per block).
    """

    offloads = True

    def __init__(self, pool: KvPool, drain_timeout_s: float, compiled: bool = True):
        self.pool = pool
        self.compiled = compiled and store_batch is not None  # records and triggers in one C call (hostmem/_trigger.c)
        self.layout = L = pool.layout
        self.drain_timeout_s = drain_timeout_s
        self.words = pool.words  # [counter * 2 + success|error] u64: the region's counters
        self.writer = Writer(pool.region.buffer)
        self.bell = Bell(L, pool.counters)
        self._per_block = L.counters_per_block
        self._descriptors = L.descriptor_offset
        self._block_bytes = L.block_bytes

    def store(self, block: Block, stats: OffloadStats) -> PendingPut:
        """Describe the block and trigger its standing PUT; the PUT to wait for before the block is reused."""
        return self.store_many([block], [stats])[0]

    def store_many(self, blocks: list[Block], stats: list[OffloadStats | None]) -> list[PendingPut]:
        """Describe every block, then trigger their standing PUTs, then ring the doorbell once (the blocks
        that filled in one step: one batch); stats[i] is blocks[i]'s turn's (None: the caller counts the
        PUT itself, as the offload thread's engine does). The PUTs to wait for."""
        bases = self._trigger_compiled(blocks) if self.compiled else self._trigger(blocks)
        puts, deadline = [], time.monotonic() + self.drain_timeout_s
        for block, s, base in zip(blocks, stats, bases):
            nbytes = block.token_count * TOKEN_ID_BYTES + self._block_bytes  # KvLayout.chunk_payload_bytes
            if s is not None:
                s.count(nbytes)
            puts.append(PendingPut(block.block_id, block.block_id * self._per_block + 1, base, nbytes, deadline))
        if puts:
            self.bell.ring()  # a read; a wake-up only when the watcher sleeps
        return puts

    def _trigger(self, blocks: list[Block]) -> list[tuple[int, int]]:
        """Every record written and stamped, then each trigger stored (in Python); each block's PUT-done
        counter (success, error) before its trigger."""
        words, n = self.words, self.layout.num_blocks
        for block in blocks:
            if not 0 <= block.block_id < n:
                raise ValueError(f"block {block.block_id} out of range [0, {n})")
        triggers = []
        for block in blocks:
            trigger = block.block_id * self._per_block  # KvLayout.put_trigger and put_done
            generation = words[2 * trigger] + 1
            record = self._descriptors + block.block_id * DESCRIPTOR_BYTES
            self.writer.write(record, generation, block.index, block.token_count, block.hash, block.parent,
                              block.tenant, block.user, block.context, block.shared)
            self.writer.stamp(record)  # trigger-to-fire is timed from here
            triggers.append((trigger, generation))
        bases = []
        for trigger, generation in triggers:
            done = trigger + 1
            bases.append((words[2 * done], words[2 * done + 1]))
            words[2 * trigger] = generation  # the flag write (one aligned 8-byte store): the agent's entry fires
        return bases

    def _trigger_compiled(self, blocks: list[Block]) -> list[tuple[int, int]]:
        """_trigger in one C call (hostmem/_trigger.c: the same records and stores, in the same order)."""
        owner = self.writer.owner
        rows = store_batch(self.pool.region.buffer, self._descriptors, self.layout.counter_offset, self._per_block,
                           self.layout.num_blocks,
                           [(b.block_id, b.index, b.token_count, b.hash, b.parent, owner(b.tenant, b.user, b.context),
                             b.shared) for b in blocks])
        return [(success, error) for _, success, error in rows]
