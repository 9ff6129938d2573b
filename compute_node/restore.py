"""Step 7 on the compute node: a restore's blocks landing, and what they cover (pure: no torch or I/O).

The agent GETs each stored block into the pool block the engine allocated for it and bumps that
block's completion counter once per layer group (success or error part). The engine reads the
counters (no RPC) each step; a restore is complete when every counter moved, and covers the
leading blocks that landed without an error and hold the token ids asked for. Anything doubtful
covers less: the blocks before the first failure are kept, the rest is recomputed, never a wrong
token (a block that did not land by the deadline is not used).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class BlockRestore:
    """One block of a restore: where it lands and the counters that say it did."""

    index: int                  # the block's index in the sequence
    block_id: int               # the pool block it lands in
    hash: bytes                 # the stored block's name
    token_count: int            # tokens it holds
    counters: tuple[int, ...]   # get_done(block_id, group) for each layer group
    bases: tuple[tuple[int, int], ...]  # each counter's (success, error) before the GET was asked for


@dataclasses.dataclass
class PendingRestore:
    """A sequence's restore in flight; its blocks in sequence order."""

    blocks: list[BlockRestore]
    first_token: int            # tokens before it came from the pool's prefix cache
    num_tokens: int             # tokens [first_token, num_tokens) are to arrive
    started_ns: int
    deadline: float             # time.monotonic() after which what has not landed is not used
    landed_ns: int = 0          # time.time_ns() the engine first saw a counter move (step 7 begins)

    @property
    def counters(self) -> list[int]:
        return [c for b in self.blocks for c in b.counters]

    @property
    def bases(self) -> np.ndarray:
        """Each counter's total before the GET, in self.counters' order."""
        return np.asarray([s + e for b in self.blocks for s, e in b.bases], dtype=np.uint64)

    def complete(self, totals: np.ndarray) -> bool:
        """Every counter moved (totals: success + error of self.counters, in order)."""
        return bool(np.all(totals > self.bases))

    def landed_groups(self, totals: np.ndarray, groups: int) -> int:
        """Leading layer groups that landed in every block (for a forward that waits per group)."""
        moved = (totals > self.bases).reshape(len(self.blocks), groups)
        done = moved.all(axis=0)
        return int(np.argmin(done)) if not done.all() else groups


@dataclasses.dataclass(frozen=True)
class RestoreOutcome:
    """What a finished (or abandoned) restore left: a verified prefix of the sequence's tokens."""

    covered: int          # tokens whose KV is in the pool (prefix cache and restored blocks)
    blocks_ok: int
    blocks_failed: int
    reason: str = ""      # why blocks failed (empty: none did)


def decide(pending: PendingRestore, read_counter: Callable[[int], tuple[int, int]],
           token_ids_of: Callable[[BlockRestore], np.ndarray], tokens: Sequence[int]) -> RestoreOutcome:
    """Check each block in order: landed (every group's counter moved), no error part, the token ids
    asked for; the blocks before the first that fails are kept."""
    covered, ok, reason = pending.first_token, 0, ""
    for block in pending.blocks:
        states = [read_counter(c) for c in block.counters]
        if any(s + e <= sb + eb for (s, e), (sb, eb) in zip(states, block.bases)):
            reason = f"restore timed out: block {block.index} had not landed by the deadline"
        elif any(e > eb for (_, e), (_, eb) in zip(states, block.bases)):
            reason = f"restore failed: block {block.index} ended with an error"
        else:
            want = np.asarray(tokens[covered:covered + block.token_count], dtype=np.uint32)
            if want.size != block.token_count or not np.array_equal(token_ids_of(block), want):
                reason = f"token ids differ: block {block.index} holds other tokens than the conversation's"
        if reason:
            break
        covered += block.token_count
        ok += 1
    return RestoreOutcome(covered, ok, len(pending.blocks) - ok, reason)
