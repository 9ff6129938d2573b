"""Step 7 on the compute node: a restore's blocks landing, layer group by layer group (pure: no torch or I/O).

The agent GETs each stored block into the pool block the engine allocated for it and bumps one
completion counter per (block, layer group) as that group lands and checks out (success part),
or fails (error part). The engine reads the counters (no RPC) each step. Once group 0 landed
without an error in every block, with the token ids asked for, the sequence joins the batch
(`join`); the model then waits before the first layer of each later group until that group
landed in every block (`LayerWait`, bounded). A restore that did not land whole (an error, a
deadline) is decided once every counter moved, or at its deadline (`decide`): the leading blocks
that landed without an error and hold the token ids asked for are kept, the rest is recomputed,
never a wrong token (a block that did not land by the deadline is not used).
"""
from __future__ import annotations

import dataclasses
import time
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
    """A sequence's restore in flight; its blocks in sequence order, each with one counter per layer group.

    Counter rows (success, error) are read by the caller, in self.counters' order: [blocks * groups, 2].
    """

    blocks: list[BlockRestore]
    first_token: int            # tokens before it came from the pool's prefix cache
    num_tokens: int             # tokens [first_token, num_tokens) are to arrive
    started_ns: int
    deadline: float             # time.monotonic() after which what has not landed is not used
    landed_ns: int = 0          # time.time_ns() the engine first saw a counter move (step 7 begins)
    joined: bool = False        # the sequence runs while its later groups land
    whole: bool = False         # no joining (any more): wait for every counter, then decide

    @property
    def groups(self) -> int:
        return len(self.blocks[0].counters) if self.blocks else 0

    @property
    def counters(self) -> list[int]:
        return [c for b in self.blocks for c in b.counters]

    @property
    def bases(self) -> np.ndarray:
        """Each counter's (success, error) before the GET: [counters, 2] uint64, in self.counters' order."""
        return np.asarray([base for b in self.blocks for base in b.bases], dtype=np.uint64).reshape(-1, 2)

    def landed(self, rows: np.ndarray) -> np.ndarray:
        """[blocks, groups] bool: the group's GET ended (its counter moved, either part)."""
        moved = rows.astype(np.uint64).sum(axis=1) > self.bases.sum(axis=1)
        return moved.reshape(len(self.blocks), self.groups)

    def errors(self, rows: np.ndarray) -> np.ndarray:
        """[blocks, groups] bool: the group's GET ended with an error."""
        return (rows[:, 1].astype(np.uint64) > self.bases[:, 1]).reshape(len(self.blocks), self.groups)

    def complete(self, rows: np.ndarray) -> bool:
        """Every counter moved."""
        return bool(self.landed(rows).all())

    def landed_groups(self, rows: np.ndarray) -> int:
        """Leading layer groups that landed in every block (whatever the outcome)."""
        done = self.landed(rows).all(axis=0)
        return int(np.argmin(done)) if not done.all() else self.groups

    def usable_groups(self, rows: np.ndarray) -> int:
        """Leading layer groups that landed without an error in every block: the layers a forward may use."""
        done = (self.landed(rows) & ~self.errors(rows)).all(axis=0)
        return int(np.argmin(done)) if not done.all() else self.groups


@dataclasses.dataclass(frozen=True)
class RestoreOutcome:
    """What a finished (or abandoned) restore left: a verified prefix of the sequence's tokens."""

    covered: int          # tokens whose KV is in the pool (prefix cache and restored blocks)
    blocks_ok: int
    blocks_failed: int
    reason: str = ""      # why blocks failed (empty: none did)


def _ids_match(block: BlockRestore, got: np.ndarray, tokens: Sequence[int], start: int) -> bool:
    want = np.asarray(tokens[start:start + block.token_count], dtype=np.uint32)
    return want.size == block.token_count and np.array_equal(got, want)


def join(pending: PendingRestore, rows: np.ndarray, token_ids_of: Callable[[BlockRestore], np.ndarray],
         tokens: Sequence[int]) -> RestoreOutcome | None:
    """The outcome if the sequence may join the batch now: group 0 landed without an error in every block,
    each holding the token ids asked for (its later groups may still land). None otherwise."""
    landed, errors = pending.landed(rows), pending.errors(rows)
    if not landed[:, 0].all() or errors[:, 0].any():
        return None
    covered = pending.first_token
    for block in pending.blocks:
        if not _ids_match(block, token_ids_of(block), tokens, covered):
            return None
        covered += block.token_count
    return RestoreOutcome(covered, len(pending.blocks), 0)


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
        elif not _ids_match(block, token_ids_of(block), tokens, covered):
            reason = f"token ids differ: block {block.index} holds other tokens than the conversation's"
        if reason:
            break
        covered += block.token_count
        ok += 1
    return RestoreOutcome(covered, ok, len(pending.blocks) - ok, reason)


class LayerWait:
    """A forward's wait for the layer groups of the restores still landing in its batch.

    Before the first layer of each group g >= 1 (before_layer), waits until g landed in every block
    of each joined restore, at most wait_s (and never past a restore's deadline); a restore whose
    group ended with an error, or had not landed by then, is given up for this step (`failed`: key ->
    reason): the caller must not use that sequence's output. Polls the counters, spinning briefly,
    then sleeping up to 1 ms. Not thread-safe (the engine thread, inside the forward).
    """

    def __init__(self, joined: dict[int, PendingRestore], group_layers: Sequence[tuple[int, int]],
                 read_rows: Callable[[list[int]], np.ndarray], wait_s: float,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 spin_s: float = 0.0005):
        self.joined, self.read_rows, self.wait_s = joined, read_rows, wait_s
        self.clock, self.sleep, self.spin_s = clock, sleep, spin_s
        self.first_layers = {first: g for g, (first, _) in enumerate(group_layers) if g > 0}
        self.failed: dict[int, str] = {}
        self.waited_s = 0.0   # time spent waiting for groups, in all
        self.waits = 0        # groups that were not there yet when the forward reached them

    def before_layer(self, layer: int) -> None:
        group = self.first_layers.get(layer)
        if group is not None:
            self.wait_group(group)

    def wait_group(self, group: int) -> None:
        """Until `group` landed in every joined restore not given up yet (or they are given up)."""
        live = {k: p for k, p in self.joined.items() if k not in self.failed}
        start, pause, waited = self.clock(), 50e-6, False
        while live:
            for key in list(live):
                pending = live[key]
                rows = self.read_rows(pending.counters)
                landed, errors = pending.landed(rows)[:, group], pending.errors(rows)[:, group]
                if errors.any():
                    block = pending.blocks[int(np.argmax(errors))].index
                    self.failed[key] = f"restore failed: block {block}'s layer group {group} ended with an error"
                    del live[key]
                elif landed.all():
                    del live[key]
            if not live:
                break
            waited, now = True, self.clock()
            for key in [k for k, p in live.items() if now >= min(start + self.wait_s, p.deadline)]:
                pending = live.pop(key)
                block = pending.blocks[int(np.argmin(pending.landed(self.read_rows(pending.counters))[:, group]))]
                self.failed[key] = (f"restore timed out: block {block.index}'s layer group {group} had not "
                                    f"landed after {now - start:.3f} s of the forward's wait")
            if live and now - start >= self.spin_s:
                self.sleep(pause)
                pause = min(pause * 2, 0.001)
        if waited:
            self.waits += 1
            self.waited_s += self.clock() - start
