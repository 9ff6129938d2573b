"""Steps 2 and 8 from the compute side: each block that fills leaves the pool, as the policy says.

- triggered (the paper's design): the agent armed one standing PUT per block at registration
  (step 1). Here the engine only writes the block's descriptor into the region and stores its
  generation into the block's PUT trigger counter: no RPC, no syscall, no copy. The block stays
  pinned until the agent's PUT-done counter moves.
- cpu (the CPU-centric baseline): the compute process copies the block out and stores it through
  the fabric itself, waiting for the acknowledgement before it goes on (compute_node.cpu_offload).
- resident and recompute: nothing leaves.

Every offloader measures its own stall: the time the engine thread spent inside it.
"""
from __future__ import annotations

import dataclasses
import logging
import time

from compute_node.kv_pool import KvPool
from hostmem.descriptor import Descriptor

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Block:
    """A block of a sequence to store: what the descriptor says about it."""

    block_id: int
    index: int            # its index in the sequence
    token_count: int
    hash: bytes
    parent: bytes
    tenant: str
    user: str
    context: str
    shared: bool = False


@dataclasses.dataclass(frozen=True)
class PendingPut:
    """A triggered PUT in flight: done once its PUT-done counter moved past `base` (success or error)."""

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


class NoOffload:
    """resident and recompute: nothing leaves the pool."""

    offloads = False

    def store(self, block: Block, stats: OffloadStats) -> PendingPut | None:
        return None


class TriggeredOffload:
    """Descriptor write and counter store: the GPU thread's part of a triggered PUT (steps 2, 8)."""

    offloads = True

    def __init__(self, pool: KvPool, drain_timeout_s: float):
        self.pool = pool
        self.layout = pool.layout
        self.drain_timeout_s = drain_timeout_s

    def store(self, block: Block, stats: OffloadStats) -> PendingPut:
        """Describe the block and trigger its standing PUT; the PUT to wait for before the block is reused."""
        start = time.perf_counter()
        trigger, done = self.layout.put_trigger(block.block_id), self.layout.put_done(block.block_id)
        generation = self.pool.read_counter(trigger)[0] + 1
        self.pool.write_descriptor(block.block_id, Descriptor(
            generation, block.index, block.token_count, block.hash, block.parent, block.tenant, block.user,
            block.context, block.shared))
        base = self.pool.read_counter(done)
        self.pool.store_counter(trigger, generation)  # the flag write: the agent's entry fires
        nbytes = self.layout.chunk_payload_bytes(block.token_count)
        stats.chunks += 1
        stats.bytes += nbytes
        stats.stall_s += time.perf_counter() - start
        return PendingPut(block.block_id, done, base, nbytes, time.monotonic() + self.drain_timeout_s)
