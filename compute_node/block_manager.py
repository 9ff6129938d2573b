"""The paged KV pool's bookkeeping: blocks, reference counts, the prefix cache, I/O pins (pure).

A full block is named by a hash chain over its token ids, everything before it and the
sequence's salt (block_hash), so identical prefixes with the same salt share blocks and
different salts never do. The SmartNIC agent addresses stored blocks by the same chain
(hash_chain). A block whose reference count drops to 0 keeps its hash and stays findable
until it is needed for something else: never-used (or hashless) free blocks are handed out
first, then cached free blocks, least recently freed first.
"""
from __future__ import annotations

import collections
import dataclasses
import logging

from compute_node.sequence import Sequence
from hostmem.block_hash import hash_chain

logger = logging.getLogger(__name__)

@dataclasses.dataclass
class Block:
    """One block of the pool: how many block tables hold it, its hash if full and computed, its I/O pins."""

    block_id: int
    ref_count: int = 0
    hash: bytes | None = None
    pins: int = 0


class NoFreeBlock(RuntimeError):
    """An allocation was attempted without checking can_allocate / can_append first."""


class BlockManager:
    """Blocks of one pool. Not thread-safe: the engine owns it.

    Invariants: a block's ref_count is the number of block tables holding it; every block is
    in exactly one of: used (ref_count > 0), free-plain (no findable hash), free-cached (its
    hash maps to it, LRU order), free-pinned (ref_count 0 and pins > 0: never handed out);
    hash_to_block maps only to blocks whose `hash` is that key; a block gets a hash only once
    all its tokens are computed, and is never written while its ref_count > 1 or while pinned.
    """

    def __init__(self, num_blocks: int, block_tokens: int, prefix_cache: bool = True):
        if num_blocks <= 0 or block_tokens <= 0:
            raise ValueError(f"num_blocks ({num_blocks}) and block_tokens ({block_tokens}) must be positive")
        self.num_blocks, self.block_tokens = num_blocks, block_tokens
        self.prefix_cache = prefix_cache  # False: lookups never hit (every block is computed or restored)
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block: dict[bytes, int] = {}
        self._plain: collections.deque[int] = collections.deque(range(num_blocks))
        self._cached: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._pinned_free: set[int] = set()
        self._quarantined: set[int] = set()  # pinned by I/O that may never end (quarantine)
        self.prefix_cache_queries = 0  # tokens looked up (vLLM's prefix_cache_queries)
        self.prefix_cache_hits = 0  # tokens found

    # -- statistics
    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds (cached and pinned ones included)."""
        return len(self._plain) + len(self._cached) + len(self._pinned_free)

    @property
    def num_allocatable_blocks(self) -> int:
        return len(self._plain) + len(self._cached)

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self._cached)

    @property
    def num_pinned_free_blocks(self) -> int:
        """Free blocks held back by I/O in flight that will end: allocatable once unpinned (quarantined
        ones are not counted: nobody should wait for them)."""
        return len(self._pinned_free) - sum(1 for b in self._quarantined if b in self._pinned_free)

    @property
    def num_quarantined_blocks(self) -> int:
        return len(self._quarantined)

    @property
    def num_pinned_blocks(self) -> int:
        return sum(1 for b in self.blocks if b.pins)

    @property
    def usage(self) -> float:
        """Blocks not allocatable (held, or pinned by I/O) / total: vLLM's kv_cache_usage_perc as a fraction."""
        return 1.0 - self.num_allocatable_blocks / self.num_blocks

    # -- prefix lookup
    def hashes(self, seq: Sequence, num_full_blocks: int) -> list[bytes]:
        """The hash chain of seq's first num_full_blocks full blocks (computed once, kept on seq)."""
        return self._hashes(seq, num_full_blocks)[:num_full_blocks]

    def _hashes(self, seq: Sequence, num_full_blocks: int) -> list[bytes]:
        """seq.block_hashes extended to num_full_blocks entries."""
        have = len(seq.block_hashes)
        if have < num_full_blocks:
            parent = seq.block_hashes[-1] if have else b""
            seq.block_hashes.extend(hash_chain(seq.token_ids[:num_full_blocks * self.block_tokens],
                                               seq.salt, self.block_tokens, parent, have))
        return seq.block_hashes

    def _prefix_hits(self, seq: Sequence) -> list[int]:
        """Block ids of the leading full blocks found in the cache, leaving >= 1 token to compute."""
        if seq.block_tokens != self.block_tokens:
            raise ValueError("the sequence's block_tokens is not the pool's")
        hits = []
        if not self.prefix_cache:
            return hits
        limit = (len(seq) - 1) // self.block_tokens
        for h in self._hashes(seq, limit)[:limit]:
            block_id = self.hash_to_block.get(h)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def _needs(self, seq: Sequence, hits: list[int]) -> int:
        """Allocatable blocks an allocation of seq consumes."""
        revived = sum(1 for b in hits if b in self._cached)
        return revived + seq.num_blocks - len(hits)

    def can_allocate(self, seq: Sequence) -> bool:
        """Whether allocate(seq) (or allocate_for_restore) would find enough blocks now."""
        return self._needs(seq, self._prefix_hits(seq)) <= self.num_allocatable_blocks

    # -- allocation
    def _take(self) -> int:
        if self._plain:
            block_id = self._plain.popleft()
        elif self._cached:
            block_id, _ = self._cached.popitem(last=False)
            block = self.blocks[block_id]
            del self.hash_to_block[block.hash]
            block.hash = None
        else:
            raise NoFreeBlock("no allocatable block")
        self.blocks[block_id].ref_count = 1
        return block_id

    def _revive(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            self._cached.pop(block_id, None)
            self._pinned_free.discard(block_id)
        block.ref_count += 1

    def allocate(self, seq: Sequence) -> None:
        """Blocks for all of seq's tokens, prefix hits first (they count as computed)."""
        if seq.block_table:
            raise ValueError(f"sequence {seq.seq_id} already holds blocks")
        hits = self._prefix_hits(seq)
        if self._needs(seq, hits) > self.num_allocatable_blocks:
            raise NoFreeBlock(f"sequence {seq.seq_id} needs more blocks than are allocatable")
        for block_id in hits:
            self._revive(block_id)
        seq.block_table = hits + [self._take() for _ in range(seq.num_blocks - len(hits))]
        seq.num_cached_tokens = seq.num_computed_tokens = len(hits) * self.block_tokens
        self.prefix_cache_queries += len(seq)
        self.prefix_cache_hits += seq.num_cached_tokens

    def allocate_for_restore(self, seq: Sequence, num_tokens: int) -> list[int]:
        """allocate(), then pin the blocks storage must fill for tokens [0, num_tokens); return their indexes."""
        self.allocate(seq)
        seq.num_restore_tokens = target = min(num_tokens, len(seq) - 1)
        first = seq.num_cached_tokens // self.block_tokens
        seq.restore_blocks = list(range(first, -(-target // self.block_tokens)))
        for i in seq.restore_blocks:
            self.pin(seq.block_table[i])
        return list(seq.restore_blocks)

    def restore_done(self, seq: Sequence, covered_tokens: int) -> None:
        """Tokens [0, covered_tokens) landed: they become computed; blocks past them are to be prefilled.
        (After restore_joined: its blocks are unpinned and join the prefix cache now.)"""
        for i in seq.restore_blocks:
            self.unpin(seq.block_table[i])
        covered = min(covered_tokens, seq.num_restore_tokens)
        seq.restore_blocks, seq.num_restore_tokens = [], 0
        if covered > seq.num_computed_tokens:
            self.mark_computed(seq, covered - seq.num_computed_tokens)
        else:
            self._register(seq, range(seq.num_cached_tokens // self.block_tokens,
                                      seq.num_computed_tokens // self.block_tokens))

    def restore_joined(self, seq: Sequence, covered_tokens: int) -> None:
        """The first layer group of tokens [0, covered_tokens) landed: they count as computed, so seq can
        run, while the other groups still land: the blocks stay pinned and out of the prefix cache
        (nobody else may read them) until restore_done."""
        covered = min(covered_tokens, seq.num_restore_tokens)
        seq.num_computed_tokens = max(seq.num_computed_tokens, covered)

    def restore_unjoined(self, seq: Sequence) -> None:
        """A joined restore did not land whole: back to the tokens found in the prefix cache."""
        seq.num_computed_tokens = seq.num_cached_tokens

    def mark_computed(self, seq: Sequence, num_tokens: int) -> list[int]:
        """num_tokens more tokens have KV; register the blocks that became full; return their indexes."""
        before = seq.num_computed_tokens
        if before + num_tokens > len(seq):
            raise ValueError(f"sequence {seq.seq_id}: computed past the sequence's tokens")
        seq.num_computed_tokens += num_tokens
        filled = list(range(before // self.block_tokens, seq.num_computed_tokens // self.block_tokens))
        self._register(seq, filled)
        return filled

    def _register(self, seq: Sequence, indexes) -> None:
        """Full computed blocks of seq become findable by their hash (unless that hash is taken)."""
        indexes = list(indexes)
        if not indexes:
            return
        hashes = self._hashes(seq, indexes[-1] + 1)
        for i in indexes:
            block = self.blocks[seq.block_table[i]]
            if block.hash is None and hashes[i] not in self.hash_to_block:
                block.hash = hashes[i]
                self.hash_to_block[block.hash] = block.block_id

    def can_append(self, seq: Sequence) -> bool:
        """Whether the blocks for seq's tokens so far (a decode crossing a block boundary) can be had."""
        return seq.num_blocks - len(seq.block_table) <= self.num_allocatable_blocks

    def blocks_to_append(self, seq: Sequence) -> int:
        """Blocks may_append(seq) would take."""
        return seq.num_blocks - len(seq.block_table)

    def may_append(self, seq: Sequence) -> None:
        """Give seq the blocks its newest tokens need (a new block when a decode crosses a boundary)."""
        while len(seq.block_table) < seq.num_blocks:
            seq.block_table.append(self._take())

    def deallocate(self, seq: Sequence, pin: bool = False) -> list[int]:
        """Release seq's blocks (full ones stay cached); with pin, first pin those holding KV and return them."""
        pinned = []
        if pin:
            pinned = seq.block_table[:-(-seq.num_computed_tokens // self.block_tokens)]
            for block_id in pinned:
                self.pin(block_id)
        # The tail first: released blocks are reused oldest first, so the prefix outlives the tail.
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._park(block)
        for i in seq.restore_blocks:  # a restore in flight: its pins stay until its I/O ends
            seq.pinned_blocks.append(seq.block_table[i])
        seq.restore_blocks, seq.num_restore_tokens = [], 0
        seq.block_table = []
        seq.num_computed_tokens = seq.num_cached_tokens = 0
        seq.pinned_blocks.extend(pinned)
        return pinned

    def forget(self, block_ids) -> int:
        """Drop the cached hashes of these blocks that nobody holds (their KV left compute memory:
        step 4 under the triggered and cpu policies); return how many were dropped."""
        dropped = 0
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count or block.hash is None:
                continue
            if self.hash_to_block.get(block.hash) == block_id:
                del self.hash_to_block[block.hash]
            block.hash = None
            if block_id in self._cached:
                del self._cached[block_id]
                self._plain.append(block_id)
            dropped += 1
        return dropped

    def _park(self, block: Block) -> None:
        """A block nobody holds goes where it belongs among the free ones."""
        if block.pins:
            self._pinned_free.add(block.block_id)
        elif block.hash is not None:
            self._cached[block.block_id] = None
        else:
            self._plain.append(block.block_id)

    # -- I/O pins
    def pin(self, block_id: int) -> None:
        """A PUT or GET on the block is in flight: it must not be handed to anyone else."""
        block = self.blocks[block_id]
        block.pins += 1
        if block.ref_count == 0 and block.pins == 1:
            self._unpark(block_id)
            self._pinned_free.add(block_id)

    def unpin(self, block_id: int) -> None:
        """One I/O on the block ended."""
        block = self.blocks[block_id]
        if block.pins <= 0:
            raise RuntimeError(f"block {block_id} is not pinned")
        block.pins -= 1
        if block.ref_count == 0 and block.pins == 0:
            self._pinned_free.discard(block_id)
            self._park(block)

    def quarantine(self, block_id: int) -> None:
        """One of the block's pins is for I/O that outlived its timeout and may never end: the block stays
        out of use (its pin is kept) but is not counted among the blocks I/O in flight will free soon."""
        if self.blocks[block_id].pins <= 0:
            raise RuntimeError(f"block {block_id} is not pinned")
        self._quarantined.add(block_id)

    def end_quarantine(self, block_id: int) -> None:
        """The quarantined I/O on the block ended at last: its pin goes."""
        if block_id not in self._quarantined:
            raise RuntimeError(f"block {block_id} is not quarantined")
        self._quarantined.discard(block_id)
        self.unpin(block_id)

    def _unpark(self, block_id: int) -> None:
        if block_id in self._cached:
            del self._cached[block_id]
        else:
            self._plain.remove(block_id)
