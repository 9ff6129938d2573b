"""The engine's own time in preemption work, defined (pure: no torch, no I/O, no clock).

What the recompute-vs-swap poster calls a strategy's overhead, as the engine sees it:

- recompute: the share of each step's forward time spent on tokens the sequence had computed
  before and lost to a preemption. A sequence keeps `kv_mark`, the most tokens whose KV it held
  at any of its preemptions; a token of the step at a position below its sequence's mark is
  computed again (`recomputed_tokens`). The step's forward time is apportioned by tokens:
  forward_s * (recomputed tokens in the step) / (tokens in the step) (`recompute_share`). Tokens
  found again in the prefix cache, or brought back by a swap, are never scheduled, so they never
  count; the tokens a failed swap-in leaves to prefill do.
- swap: the engine's own time copying a victim's blocks out of the pool (swap-out: the host
  tier's copy, or storing through the turn's offloader what it had not stored yet) and back in
  (the host tier's copy), plus, for swap to storage, the time each swapped sequence waited for
  its blocks to come back: from the restore's start (its GETs asked for) to the moment it may join
  the batch again (its first layer group landed everywhere, or the whole restore ended), summed
  over sequences (`restore_wait`). The copies stop the engine; the wait stops only that sequence
  (the others go on decoding), so the two are also kept apart.

Not counted: a decode that skips a step because a swap victim's blocks are still pinned by their
PUTs, and the scheduling itself.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable


def recomputed_tokens(start: int, num_tokens: int, kv_mark: int) -> int:
    """Tokens of [start, start + num_tokens) below kv_mark: computed before, lost, computed again."""
    if start < 0 or num_tokens < 0 or kv_mark < 0:
        raise ValueError(f"negative start {start}, num_tokens {num_tokens} or kv_mark {kv_mark}")
    return max(0, min(start + num_tokens, kv_mark) - start)


def recompute_share(forward_s: float, runs: Iterable[tuple[int, int, int]]) -> tuple[float, int]:
    """(seconds, tokens): the part of one step's forward time spent recomputing, apportioned by tokens.

    runs: (start, num_tokens, kv_mark) of each sequence in the step.
    """
    if forward_s < 0:
        raise ValueError(f"negative forward time {forward_s}")
    total = again = 0
    for start, num_tokens, kv_mark in runs:
        total += num_tokens
        again += recomputed_tokens(start, num_tokens, kv_mark)
    if not total:
        return 0.0, 0
    return forward_s * again / total, again


def restore_wait(started_s: float, ready_s: float) -> float:
    """A swapped sequence's wait for its blocks: restore start to ready (never negative)."""
    return max(0.0, ready_s - started_s)


@dataclasses.dataclass
class PreemptionCost:
    """Running totals since start (seconds, tokens)."""

    recompute_s: float = 0.0        # forward time on recomputed tokens
    recompute_tokens: int = 0       # tokens computed again
    swap_out_s: float = 0.0         # engine time copying (or storing) victims' blocks out
    swap_in_s: float = 0.0          # engine time copying swapped blocks back in (host tier)
    swap_wait_s: float = 0.0        # swapped sequences' wait for their blocks from storage, summed

    def add_step(self, forward_s: float, runs: Iterable[tuple[int, int, int]]) -> None:
        seconds, tokens = recompute_share(forward_s, runs)
        self.recompute_s += seconds
        self.recompute_tokens += tokens

    @property
    def swap_s(self) -> float:
        """Swap's whole cost: the copies out and in, and the waits for storage."""
        return self.swap_out_s + self.swap_in_s + self.swap_wait_s

    @property
    def engine_s(self) -> float:
        """The time the engine itself spent (the waits excluded: others decode meanwhile)."""
        return self.recompute_s + self.swap_out_s + self.swap_in_s

    def as_dict(self) -> dict:
        return {"preempt_recompute_s": self.recompute_s, "preempt_recompute_tokens": self.recompute_tokens,
                "preempt_swap_s": self.swap_s, "preempt_swap_out_s": self.swap_out_s,
                "preempt_swap_in_s": self.swap_in_s, "preempt_swap_wait_s": self.swap_wait_s}
