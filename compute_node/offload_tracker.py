"""The engine's offload room: every PUT in flight, the turns waiting for another turn's PUT, the PUTs
that outlived their timeout, the names this node knows are stored, and what polling costs each turn.

Steps 2 and 8 from the engine's side: a block that filled is described (its name, its parent, its
owner) and handed to its turn's policy (compute_node.offload); a triggered PUT stays here, its block
pinned, until its PUT-done counter moves (read from the region: no RPC). A PUT past drain_timeout_s
no longer holds its turn's record back, but its block stays quarantined until the counter moves: the
NIC may still read it. Engine thread only.

With an offload thread (compute_node.offload_thread; setting offload_thread), a triggered block is
named, admitted and pinned here, and its record enters `puts` at once with no PUT yet (`put` None:
handed over); the thread writes the descriptors and stores the triggers, and the PUTs come back at the
next poll. A handed block counts as in flight for everything here (a second PUT of it waits, a
swap-out's pins wait for it, an aborted turn's pins stay with it), so nothing changes for the engine
but who makes the store.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable

import numpy as np

from compute_node.offload import Block, PendingPut
from compute_node.offload_thread import OffloadThread
from compute_node.scheduler import SwapOut
from compute_node.sequence import Sequence
from compute_node.turn_state import TurnState
from hostmem.block_hash import block_hash, salts_of

logger = logging.getLogger(__name__)

MAX_STORED_NAMES = 1_000_000
# PUTs in flight from which a poll reads the counters as one numpy gather: below it, reading the few
# counters one by one through the region's memoryview costs less than numpy's call overheads
VECTOR_MIN = 8


def _clock() -> tuple[float, float]:
    """Now, in wall seconds and in this thread's CPU seconds: a stall is charged in both."""
    return time.perf_counter(), time.thread_time()


def _since(start: tuple[float, float], share: int = 1) -> tuple[float, float]:
    """The wall and CPU seconds since `start` (a _clock()), split `share` ways."""
    wall, cpu = _clock()
    return (wall - start[0]) / share, (cpu - start[1]) / share


@dataclasses.dataclass(eq=False)
class PutRecord:
    """One PUT in flight: the offloader's handle (None: handed to the offload thread, not triggered yet),
    the turn it stores for (None: none), the swapped-out sequence whose pin it also holds (None: none)
    and the block's name."""

    put: PendingPut | None
    state: TurnState | None
    owner: Sequence | None
    name: bytes


class OffloadTracker:
    """PUTs in flight by block id, their waiters, stuck PUTs, stored names and the poll's cost."""

    def __init__(self, settings, layout, pool, bm, scheduler, offloaders: dict, totals: collections.Counter,
                 record: Callable[[TurnState], None], thread: OffloadThread | None = None):
        self.thread = thread  # triggered stores off the engine's thread (None: on it)
        self.settings, self.layout, self.pool, self.bm, self.scheduler = settings, layout, pool, bm, scheduler
        self.offloaders, self.totals, self._record = offloaders, totals, record
        self.puts: dict[int, PutRecord] = {}  # by block id
        self.put_waiters: dict[int, list[TurnState]] = {}  # turns sharing a block whose PUT is in flight
        self.stuck_puts: dict[int, PendingPut] = {}  # by block id: PUTs past drain_timeout_s, their block pinned
        self.stored_names: collections.OrderedDict[tuple[str, bytes], None] = collections.OrderedDict()
        self._poll_cost: list[tuple[TurnState, tuple[float, float]]] = []  # the last poll's reading time (wall, CPU), per turn

    def close(self) -> None:
        """Stop the offload thread (what it was handed is stored first)."""
        if self.thread is not None:
            self.thread.close()

    def __bool__(self) -> bool:
        """Whether any PUT is in flight or stuck (the engine's loop polls, not sleeps)."""
        return bool(self.puts or self.stuck_puts)

    # -- naming and handing over
    def describe(self, state: TurnState, index: int, block_id: int, tokens: int) -> Block:
        """Block `index` of the turn's sequence (in pool block block_id, `tokens` long) as a descriptor says it."""
        seq, turn, bt = state.seq, state.turn, self.layout.block_tokens
        full = self.bm.hashes(seq, (index * bt + tokens) // bt)
        parent = full[index - 1] if index else b""
        salts = salts_of(seq.salt)
        name = full[index] if tokens == bt else block_hash(parent, seq.token_ids[index * bt:index * bt + tokens],
                                                           salts.private)
        return Block(block_id, index, tokens, name, parent, turn.tenant, turn.user_id, turn.context_id,
                     salts.is_shared(index, tokens == bt))

    def offloads(self, state: TurnState) -> bool:
        """Whether the turn's policy stores anything."""
        return self.offloaders[state.turn.policy].offloads

    def offload(self, state: TurnState, index: int, block_id: int, tokens: int, owner: Sequence | None = None) -> None:
        """Store block `index` of the turn's sequence (in pool block block_id) as its policy says; the
        time spent here is the turn's offload stall."""
        offloader = self.offloaders[state.turn.policy]
        if not offloader.offloads or index in state.storing:
            return
        start = _clock()
        block = self.describe(state, index, block_id, tokens)
        self._store_block(state, offloader, block, index, block_id, owner)
        state.offload.charge(*_since(start))

    def offload_filled(self, filled: list[tuple[TurnState, int, int]]) -> None:
        """The full blocks that filled in one step, (turn, index, pool block) each, stored as one batch: each
        policy's offloader takes its blocks together (triggered: every descriptor written, then every
        trigger stored, and the doorbell rung once: `TriggeredOffload.store_many`). The time spent here
        is shared among the turns by their blocks."""
        start, bt = _clock(), self.layout.block_tokens
        batches: dict[str, list[tuple[TurnState, int, int, Block]]] = {}
        for state, index, block_id in filled:
            if not self.offloaders[state.turn.policy].offloads or index in state.storing:
                continue
            block = self.describe(state, index, block_id, bt)
            if self._admit(state, block, block_id):
                batches.setdefault(state.turn.policy, []).append((state, index, block_id, block))
        for policy, batch in batches.items():
            offloader = self.offloaders[policy]
            if self._hand(offloader, [(s, i, b, block, None) for s, i, b, block in batch]):
                continue
            many = getattr(offloader, "store_many", None)
            puts = (many([b for *_, b in batch], [s.offload for s, *_ in batch]) if many is not None
                    else [offloader.store(b, s.offload) for s, _, _, b in batch])
            for (state, index, block_id, block), put in zip(batch, puts):
                self._track(state, index, block_id, block, put, None)
        share = _since(start, max(1, len(filled)))
        for state, _, _ in filled:
            state.offload.charge(*share)

    def store_found(self, state: TurnState) -> None:
        """Blocks a sequence found in the pool's prefix cache that no PUT of ours stored yet (another
        policy's turn computed them): store them now, so that its follow-ups can restore them."""
        seq, bt = state.seq, self.layout.block_tokens
        if not self.offloads(state):
            return
        for index in range(seq.num_cached_tokens // bt):
            if (state.turn.policy, seq.block_hashes[index]) not in self.stored_names:
                self.offload(state, index, seq.block_table[index], bt)

    def swap_out(self, state: TurnState, swap: SwapOut) -> None:
        """Store what a swap victim has not stored yet; each of its pins goes once its block is stored."""
        bt = self.layout.block_tokens
        for index, block_id in enumerate(swap.block_ids):
            tokens = min(bt, swap.num_tokens - index * bt)
            if self.describe(state, index, block_id, tokens).hash in state.stored:
                self.scheduler.release_pins(swap.seq, [block_id])
            elif index in state.storing:
                self.puts[state.storing[index]].owner = swap.seq
            else:
                self.offload(state, index, block_id, tokens, owner=swap.seq)
                if index not in state.storing:  # stored synchronously, or not at all
                    self.scheduler.release_pins(swap.seq, [block_id])

    def _store_block(self, state: TurnState, offloader, block: Block, index: int, block_id: int,
                     owner: Sequence | None) -> None:
        """Hand a described block to its policy's offloader, unless stored already or in flight for another turn."""
        if self._admit(state, block, block_id) and not self._hand(offloader, [(state, index, block_id, block, owner)]):
            self._track(state, index, block_id, block, offloader.store(block, state.offload), owner)

    def _admit(self, state: TurnState, block: Block, block_id: int) -> bool:
        """Whether the block goes to the offloader: not when stored already, or in flight (for another turn:
        this one then waits for it), or its block still read by a PUT that outlived its timeout."""
        if block.hash in state.stored:  # this block, with these tokens, is stored already
            return False
        if block_id in self.stuck_puts:  # a PUT that outlived its timeout may still read it: no second one
            state.offload_failures += 1
            return False
        if block_id in self.puts:  # another turn's PUT of this shared block is in flight: wait for it
            state.awaiting.add(block_id)  # (a second PUT would rewrite its descriptor under the first)
            self.put_waiters.setdefault(block_id, []).append(state)
            return False
        return True

    def _hand(self, offloader, batch: list[tuple[TurnState, int, int, Block, Sequence | None]]) -> bool:
        """Hand admitted blocks (turn, index, pool block, block, swap owner) to the offload thread, each
        pinned and in flight from now on; False (nothing done) without a thread, for an offloader that
        stores synchronously (cpu), or while the thread has all the batches it may hold."""
        if self.thread is None or getattr(offloader, "store_many", None) is None or not self.thread.room:
            return False
        for state, index, block_id, block, owner in batch:
            self._in_flight(state, index, block_id, block.hash, None, owner)
        self.thread.hand(offloader, [block for *_, block, _ in batch])
        return True

    def _take_stored(self) -> None:
        """The offload thread's answers: each handed block's PUT, now in flight (its chunk counted for its
        turn), or, where the store raised, the block not stored (never triggered: the offloader checks every
        block of a batch before it writes anything; unpinned at once)."""
        for stored in self.thread.take():
            start = _clock()
            states = [self._took(block.block_id, put) for block, put in
                      zip(stored.blocks, stored.puts if stored.puts is not None else [None] * len(stored.blocks))]
            share = _since(start, len(states))
            for state in states:
                if state is not None:
                    state.offload.charge(*share)

    def _took(self, block_id: int, put: PendingPut | None) -> TurnState | None:
        """A handed block's PUT, now in flight (its turn, to charge), or None: its store raised (not stored)."""
        rec = self.puts[block_id]
        if put is not None:
            rec.put = put
            if rec.state is not None:
                rec.state.offload.count(put.bytes)
            return rec.state
        self.totals["offload_thread_failures"] += 1
        self._settle(block_id, stored=False, ended=True)
        return None

    def _track(self, state: TurnState, index: int, block_id: int, block: Block, put: PendingPut | None,
               owner: Sequence | None) -> None:
        """The offloader's answer: stored already (None), or a PUT in flight, its block pinned until it ends."""
        if put is None:  # stored already (cpu: synchronously)
            state.stored.add(block.hash)
            self.stored(state.turn.policy, block.hash)
            return
        self._in_flight(state, index, block_id, block.hash, put, owner)

    def _in_flight(self, state: TurnState, index: int, block_id: int, name: bytes, put: PendingPut | None,
                   owner: Sequence | None) -> None:
        """The block's PUT is in flight (put None: handed to the offload thread): pinned until it ends."""
        self.bm.pin(block_id)
        state.storing[index] = block_id
        self.puts[block_id] = PutRecord(put, state, owner, name)

    def stored(self, policy: str, name: bytes) -> None:
        """A block of this name is on the policy's storage (as far as this node knows: the agent's
        index, or the cpu store's, may have dropped it since)."""
        self.stored_names[(policy, name)] = None
        self.stored_names.move_to_end((policy, name))
        while len(self.stored_names) > MAX_STORED_NAMES:
            self.stored_names.popitem(last=False)

    # -- the counters
    def waited_for(self) -> list[int]:
        """The PUTs something waits for: a finished turn's record, a swap-out's pins (a running turn's own
        PUTs are read once per step: reading them more often would only add to its offload stall)."""
        return [b for b, r in self.puts.items() if r.owner is not None or r.state is None or r.state.finished_ns]

    def poll(self, blocks: list[int] | None = None) -> bool:
        """Release the blocks (default: all in flight) whose PUT ended (or timed out). Each ended PUT's
        bookkeeping is its turn's offload stall; reading the counters is shared by the turns whose PUTs
        were read (charge_poll_cost, when a step follows: a poll while the engine has nothing else to do
        stalls nothing)."""
        if self.thread is not None and self.thread.pending:
            self._take_stored()
        blocks = list(self.puts) if blocks is None else blocks
        blocks = [b for b in blocks if self.puts[b].put is not None]  # not the ones still being handed over
        if not blocks:
            return False
        start = _clock()
        puts = [self.puts[b].put for b in blocks]
        if len(puts) < VECTOR_MIN:
            words = self.pool.words
            rows = [(words[2 * p.counter], words[2 * p.counter + 1]) for p in puts]
            now = time.monotonic()
            ended = [(b, s, e) for b, p, (s, e) in zip(blocks, puts, rows) if p.ended(s, e) or now >= p.deadline]
        else:  # one vectorised read of every counter, compared with their bases at once
            rows = self.pool.counters[np.fromiter((p.counter for p in puts), np.intp, len(puts))]  # [n, 2] u64
            base = np.fromiter((p.base[0] + p.base[1] for p in puts), np.uint64, len(puts))
            due = np.fromiter((p.deadline for p in puts), np.float64, len(puts)) <= time.monotonic()
            hits = np.flatnonzero((rows[:, 0] + rows[:, 1] > base) | due)
            ended = [(blocks[i], int(rows[i, 0]), int(rows[i, 1])) for i in hits.tolist()]
        share = _since(start, len(blocks))
        self._poll_cost = [(self.puts[b].state, share) for b in blocks if self.puts[b].state is not None]
        for block_id, success, error in ended:
            self._ended(block_id, success, error)
        return bool(ended)

    def _ended(self, block_id: int, success: int, error: int) -> None:
        put = self.puts[block_id].put
        self._settle(block_id, put.stored(success, error), put.ended(success, error))

    def _settle(self, block_id: int, stored: bool, ended: bool) -> None:
        """A PUT is over for the engine: stored or not, and ended (else it timed out, its block quarantined
        until it ends)."""
        start = _clock()
        rec = self.puts.pop(block_id)
        put, state = rec.put, rec.state
        self._wake_waiters(block_id, rec.name, stored)
        if ended:
            self.bm.unpin(block_id)
        else:  # the turn goes on without it, but the NIC may still read the block: it stays pinned
            logger.warning("block %d: PUT not done after %.0f s; the block stays out of use until it ends",
                           block_id, self.settings.drain_timeout_s)
            self.totals["puts_timed_out"] += 1
            self.stuck_puts[block_id] = put
            self.bm.quarantine(block_id)
        if rec.owner is not None:  # a swap-out's block: the scheduler held it too
            self.scheduler.release_pins(rec.owner, [block_id])
        if state is not None:
            index = next(i for i, b in state.storing.items() if b == block_id)
            del state.storing[index]
            if stored:
                state.stored.add(rec.name)
                self.stored(state.turn.policy, rec.name)
            else:
                state.offload_failures += 1
            state.offload.charge(*_since(start))
            self._record(state)

    def poll_stuck(self) -> bool:
        """PUTs past their drain timeout whose counter moved at last: their blocks may be reused now."""
        if not self.stuck_puts:
            return False
        words = self.pool.words
        ended = [b for b, put in self.stuck_puts.items() if put.ended(words[2 * put.counter], words[2 * put.counter + 1])]
        for block_id in ended:
            del self.stuck_puts[block_id]
            self.bm.end_quarantine(block_id)
        return bool(ended)

    def forget_poll_cost(self) -> None:
        """A new loop: the last poll's cost is charged or dropped."""
        self._poll_cost = []

    def charge_poll_cost(self) -> None:
        """The last poll's reading time, to the turns whose PUTs it read: a step waits for it."""
        for state, (wall_s, cpu_s) in self._poll_cost:
            state.offload.charge(wall_s, cpu_s)
        self._poll_cost = []

    def _wake_waiters(self, block_id: int, name: bytes, stored: bool) -> None:
        """The turns that waited for another turn's PUT of this block: it ended."""
        for waiter in self.put_waiters.pop(block_id, []):
            waiter.awaiting.discard(block_id)
            if stored:
                waiter.stored.add(name)
            if not waiter.finished:
                self._record(waiter)

    # -- a turn that ends early
    def release(self, state: TurnState) -> collections.Counter:
        """A turn aborted: it waits for no other turn's PUT; the pins of its sequence that a PUT in flight
        will release when it ends (block id -> how many), which nobody else may release."""
        for waiters in self.put_waiters.values():
            if state in waiters:
                waiters.remove(state)
        return collections.Counter(b for b, r in self.puts.items() if r.owner is state.seq)
