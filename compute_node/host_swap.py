"""The host swap tier (preemption `swap-host`): vLLM's CPU swap space inside the compute node.

When the scheduler preempts a sequence by `swap-host`, the engine copies the pool blocks holding
its KV (each block one contiguous extent of the region: every layer, K and V, and the block's
token ids row) into this bounded store in host memory, before the step's forward can write
anything into them, and the blocks are free at once. When the sequence is admitted again, blocks
are allocated and the copies go back in, bit for bit; the sequence goes on decoding without
prefilling again. The pool plays the GPU's memory, so both copies are memcpy here, where vLLM's
cross PCIe.

Bounded: a victim whose blocks do not all fit (`fits`) is preempted by recompute instead (the
caller counts the fallback). Wrong KV is worse than none: a swap-in copies back only the leading
blocks whose copy is there, of the right size, holding the token ids the sequence has at those
positions; whatever follows the first doubtful block is prefilled again.

Thread-safety: none; the engine thread only.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence as Seq

import numpy as np

from hostmem.kv_layout import TOKEN_ID_BYTES, KvLayout
from scale import paced


def bytes_per_block(layout: KvLayout) -> int:
    """Host bytes one swapped block takes: its KV extent and its token ids row."""
    return layout.block_bytes + layout.block_tokens * TOKEN_ID_BYTES


def capacity_bytes(layout: KvLayout, swap_space_tokens: int) -> int:
    """The store's bound for a swap space of swap_space_tokens tokens (whole blocks)."""
    if swap_space_tokens < 0:
        raise ValueError(f"swap_space_tokens must not be negative, got {swap_space_tokens}")
    return swap_space_tokens // layout.block_tokens * bytes_per_block(layout)


@dataclasses.dataclass
class Swapped:
    """One sequence's blocks in host memory: row k is its block indexes[k]."""

    indexes: list[int]
    kv: np.ndarray    # [blocks, block_bytes] uint8
    ids: np.ndarray   # [blocks, block_tokens] uint32

    @property
    def nbytes(self) -> int:
        return int(self.kv.nbytes + self.ids.nbytes)


@dataclasses.dataclass
class SwapIn:
    """What a swap-in put back: tokens [0, covered) hold their KV (the prefix cache's and the copies')."""

    covered: int
    blocks: int        # copied back
    nbytes: int
    reason: str = ""   # why it stopped short (empty: everything asked for came back)


@dataclasses.dataclass
class HostSwapStats:
    swap_outs: int = 0
    swap_ins: int = 0
    blocks_out: int = 0
    blocks_in: int = 0
    bytes_out: int = 0
    bytes_in: int = 0
    fallbacks: int = 0     # victims (or parts of them) recomputed instead: tier full, or a doubtful copy
    full: int = 0          # of those, because the tier was full
    discarded: int = 0     # copies dropped unused (the sequence found its KV elsewhere, or ended)


class HostSwapStore:
    """Copies of swapped sequences' blocks, by sequence id, with byte accounting against a bound."""

    def __init__(self, layout: KvLayout, region_array: np.ndarray, capacity: int):
        """region_array: the pool's region as uint8 (Region.array); capacity: bytes."""
        if capacity < 0:
            raise ValueError(f"capacity must not be negative, got {capacity}")
        self.layout, self.capacity = layout, capacity
        L = layout
        # block-major views of the region: row b is block b's KV extent / token ids row
        self._kv = region_array[L.kv_offset:L.kv_offset + L.num_blocks * L.block_bytes].reshape(
            L.num_blocks, L.block_bytes)
        ids_bytes = L.num_blocks * L.block_tokens * TOKEN_ID_BYTES
        self._ids = region_array[L.token_ids_offset:L.token_ids_offset + ids_bytes].view("<u4").reshape(
            L.num_blocks, L.block_tokens)
        self.swapped: dict[int, Swapped] = {}
        self.used = 0
        self.stats = HostSwapStats()

    # -- queries
    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.swapped

    def __len__(self) -> int:
        return len(self.swapped)

    def fits(self, num_blocks: int) -> bool:
        return self.used + num_blocks * bytes_per_block(self.layout) <= self.capacity

    # -- out and in
    def swap_out(self, seq_id: int, block_ids: Seq[int]) -> int | None:
        """Copy the blocks holding a victim's KV (block_ids[i] is its block i) out of the pool; the bytes
        copied, or None when they do not fit (nothing kept: the caller recomputes and counts it)."""
        if seq_id in self.swapped:
            raise ValueError(f"sequence {seq_id} is swapped out already")
        if not block_ids:
            return 0
        if not self.fits(len(block_ids)):
            self.stats.fallbacks += 1
            self.stats.full += 1
            return None
        rows = np.asarray(block_ids, dtype=np.intp)
        kv_bytes = len(block_ids) * self.layout.block_bytes
        slot = paced.ticket("swap_out", kv_bytes, self.layout.block_bytes // self.layout.block_tokens)
        entry = Swapped(list(range(len(block_ids))), self._kv[rows], self._ids[rows])  # fancy indexing: copies
        paced.wait(slot)  # under a profile: the copy over the modeled PCIe link
        self.swapped[seq_id] = entry
        self.used += entry.nbytes
        self.stats.swap_outs += 1
        self.stats.blocks_out += len(block_ids)
        self.stats.bytes_out += entry.nbytes
        return entry.nbytes

    def swap_in(self, seq_id: int, token_ids: Seq[int], first_token: int, num_tokens: int,
                block_indexes: Seq[int], block_ids: Seq[int]) -> SwapIn:
        """Copy a re-admitted sequence's blocks back: block_indexes[k] of the sequence into pool block
        block_ids[k], for tokens [first_token, num_tokens) (those before first_token were found in the
        prefix cache). Copies the leading blocks that check out and stops at the first that does not.
        The sequence's copies leave the store either way."""
        bt = self.layout.block_tokens
        entry = self.swapped.pop(seq_id, None)
        if entry is not None:
            self.used -= entry.nbytes
        covered, rows, pool_rows, reason = first_token, [], [], ""
        if entry is None:
            reason = "no copy of the sequence in the host swap tier"
        else:
            where = {index: row for row, index in enumerate(entry.indexes)}
            for index, block_id in zip(block_indexes, block_ids):
                tokens = min(bt, num_tokens - index * bt)
                row = where.get(index)
                if index * bt != covered or tokens <= 0:
                    reason = f"block {index} does not follow token {covered}"
                elif row is None:
                    reason = f"no copy of block {index}"
                elif entry.kv.shape[1] != self.layout.block_bytes or entry.ids.shape[1] != bt:
                    reason = f"block {index}'s copy is {entry.kv.shape[1]} bytes, a block is {self.layout.block_bytes}"
                elif not np.array_equal(entry.ids[row, :tokens],
                                        np.asarray(token_ids[covered:covered + tokens], dtype=np.uint32)):
                    reason = f"block {index}'s copy holds other token ids"
                if reason:
                    break
                rows.append(row)
                pool_rows.append(block_id)
                covered += tokens
        nbytes = 0
        if rows:
            # rows are consecutive (the blocks checked in order from the first restored one): a slice of
            # the copy, so the KV is copied once, straight into the pool's blocks
            src, dst = slice(rows[0], rows[0] + len(rows)), np.asarray(pool_rows, dtype=np.intp)
            if rows != list(range(src.start, src.stop)):
                raise RuntimeError(f"swap-in rows {rows} are not consecutive")
            slot = paced.ticket("swap_in", len(rows) * self.layout.block_bytes,
                                self.layout.block_bytes // self.layout.block_tokens)
            self._kv[dst] = entry.kv[src]
            self._ids[dst] = entry.ids[src]
            paced.wait(slot)  # under a profile: the copy over the modeled PCIe link
            nbytes = len(rows) * bytes_per_block(self.layout)
        self.stats.swap_ins += 1
        self.stats.blocks_in += len(rows)
        self.stats.bytes_in += nbytes
        if reason:
            self.stats.fallbacks += 1
        return SwapIn(covered, len(rows), nbytes, reason)

    def fallback(self) -> None:
        """A victim preempted by swap-host that the caller recomputes for a reason of its own."""
        self.stats.fallbacks += 1

    def discard(self, seq_id: int) -> None:
        """Drop a sequence's copies (it ended, or came back without them)."""
        entry = self.swapped.pop(seq_id, None)
        if entry is not None:
            self.used -= entry.nbytes
            self.stats.discarded += 1

    def snapshot(self) -> dict:
        s = self.stats
        return {"swap_host_bytes_out": s.bytes_out, "swap_host_bytes_in": s.bytes_in,
                "swap_host_blocks_out": s.blocks_out, "swap_host_blocks_in": s.blocks_in,
                "swap_host_fallbacks": s.fallbacks, "swap_host_full": s.full,
                "swap_host_used_bytes": self.used, "swap_host_capacity_bytes": self.capacity,
                "swap_host_sequences": len(self.swapped)}
