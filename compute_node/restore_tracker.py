"""The engine's restore room: restores outside the batch, joined restores whose later layer groups still
land, blocks a late GET may still write (late pins), and swapped sequences waiting for storage.

Steps 5-7 from the engine's side: a follow-up's blocks are allocated and its restore asked for (on the
turn's stream to the agent, or from the cpu store); the sequence waits outside the batch until the
first layer group of every block landed, then joins it (compute_node.restore.join), and the forward
waits before each later group's first layer (LayerWait). The set of restoring sequences is the
scheduler's (`Scheduler.restoring`): this room keeps each one's pending restore on its TurnState, not
a second copy of the set. Engine thread only.
"""
from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable

import numpy as np

from compute_node import restore as rs
from compute_node.preemption_cost import PreemptionCost, restore_wait
from compute_node.scheduler import RestoreRequest, SchedulerOutput
from compute_node.sequence import Sequence
from compute_node.turn import RestoreBlockEvent
from compute_node.turn_state import TurnState
from hostmem.block_hash import salts_of

logger = logging.getLogger(__name__)

LATE_PIN_S = 300.0  # how long a block a timed-out GET may still write stays out of use


class RestoreTracker:
    """Restoring (the scheduler's set), joined and late-pinned blocks, and swap waits."""

    def __init__(self, settings, layout, pool, scheduler, offloads, states: dict[int, TurnState],
                 cost: PreemptionCost, totals: collections.Counter, only: Callable, cpu_store=None):
        self.settings, self.layout, self.pool, self.scheduler = settings, layout, pool, scheduler
        self.offloads, self.states, self.cost, self.totals = offloads, states, cost, totals
        self._only, self.cpu_store = only, cpu_store
        self.joined: dict[int, TurnState] = {}  # sequences in the batch whose later layer groups still land
        self.late_pins: list[tuple[Sequence, rs.BlockRestore, float]] = []  # (seq, block, give up at)
        self.swap_waits: dict[int, float] = {}  # swapped sequences restoring from storage: seq id -> start

    def __bool__(self) -> bool:
        """Whether any restore's I/O is under way (the engine's loop polls, not sleeps)."""
        return bool(self.scheduler.restoring or self.joined or self.late_pins)

    def restoring(self) -> list[TurnState]:
        """The turns restoring outside the batch (the scheduler's set)."""
        return [s for s in map(self.states.get, list(self.scheduler.restoring)) if s is not None]

    # -- asking
    def start(self, state: TurnState, request: RestoreRequest) -> None:
        """Ask for the blocks storage must fill (the agent, on the turn's stream; or the cpu store)."""
        seq, bt, groups = request.seq, self.layout.block_tokens, self.layout.layer_groups
        blocks = []
        for index, block_id in zip(request.block_indexes, request.block_ids):
            tokens = min(bt, request.num_tokens - index * bt)
            described = self.offloads.describe(state, index, block_id, tokens)
            counters = tuple(self.layout.get_done(block_id, g) for g in range(groups))
            blocks.append(rs.BlockRestore(index, block_id, described.hash, tokens, counters,
                                          tuple(self.pool.read_counter(c) for c in counters)))
        pending = rs.PendingRestore(blocks, request.first_token, request.num_tokens, time.time_ns(),
                                    time.monotonic() + self.settings.restore_timeout_s)
        state.restore = pending
        if seq.num_preempted_tokens:  # a swapped sequence comes back from storage: preemption work
            self.swap_waits[seq.seq_id] = time.perf_counter()
        if state.turn.policy == "cpu" and self.cpu_store is not None:
            self.cpu_store.restore(self.pool, seq, pending)  # synchronous: the CPU-centric cost
        else:
            salts = salts_of(seq.salt)
            state.turn.emit("restore", [RestoreBlockEvent(b.block_id, b.hash, b.token_count, b.index,
                                                          salts.is_shared(b.index, b.token_count == bt))
                                        for b in blocks], groups)

    # -- outside the batch
    def poll(self) -> bool:
        """Every restore outside the batch: joined, decided, or still waiting (whether one moved)."""
        done = False
        now = time.monotonic()
        for state in self.restoring():
            with self._only(state):
                done |= self._poll_one(state, now)
        return done

    def _rows(self, pending: rs.PendingRestore) -> np.ndarray:
        return self.pool.counters[np.asarray(pending.counters, dtype=np.intp)]

    def _poll_one(self, state: TurnState, now: float) -> bool:
        """One restore outside the batch: joins, is decided, or waits (whether something happened)."""
        pending, seq = state.restore, state.seq
        rows = self._rows(pending)
        if not pending.landed_ns and bool(pending.landed(rows).any()):
            pending.landed_ns = time.time_ns()
        complete = pending.complete(rows)
        if not complete and now < pending.deadline:
            if not pending.whole and pending.landed(rows)[:, 0].all():
                return self._join(state, rows)
            return False
        outcome = rs.decide(pending, self.pool.read_counter, self._restored_ids, seq.token_ids)
        state.restored(outcome, self.layout.chunk_payload_bytes)
        for block in pending.blocks[:outcome.blocks_ok]:  # they came from storage: stored there
            state.stored.add(block.hash)
            self.offloads.stored(state.turn.policy, block.hash)
        self._swap_waited(seq)
        if not complete:  # late GETs may still write: never use those blocks
            self.scheduler.requeue(seq)
            self._late_pin(seq, pending)
        else:
            self.scheduler.restore_done(seq, outcome.covered)
        return True

    def _restored_ids(self, block: rs.BlockRestore) -> np.ndarray:
        return self.pool.read_token_ids(block.block_id, block.token_count)

    def _join(self, state: TurnState, rows: np.ndarray) -> bool:
        """Group 0 of every block landed: the sequence joins the batch if they all checked out (else it
        waits for every counter and is decided as a whole)."""
        pending, seq = state.restore, state.seq
        outcome = rs.join(pending, rows, self._restored_ids, seq.token_ids)
        if outcome is None:
            pending.whole = True
            return False
        pending.joined = True
        self.joined[seq.seq_id] = state
        for block in pending.blocks:  # stored: a swap-out never stores them again, whatever lands here
            state.stored.add(block.hash)
        self._swap_waited(seq)
        self.scheduler.restore_joined(seq, outcome.covered)
        return True

    def _swap_waited(self, seq: Sequence) -> None:
        """A swapped sequence's restore from storage ended (or it may join the batch): its wait is over."""
        started = self.swap_waits.pop(seq.seq_id, None)
        if started is not None:
            self.cost.swap_wait_s += restore_wait(started, time.perf_counter())

    # -- joined: in the batch while later layer groups land
    def poll_joined(self) -> bool:
        """Joined restores between steps: landed whole (done), or failed (back to waiting outside the batch)."""
        done = False
        now = time.monotonic()
        for state in list(self.joined.values()):
            with self._only(state):
                pending = state.restore
                rows = self._rows(pending)
                if pending.errors(rows).any() or (now >= pending.deadline and not pending.complete(rows)):
                    self._unjoin(state, "a layer group failed or had not landed by the deadline")
                    done = True
                elif pending.complete(rows):
                    self._landed(state)
                    done = True
        return done

    def layer_wait(self, out: SchedulerOutput) -> rs.LayerWait | None:
        """The forward's wait for the layer groups still landing of the joined sequences in this step."""
        joined = {s.seq.seq_id: self.joined[s.seq.seq_id].restore for s in out.scheduled if s.seq.seq_id in self.joined}
        if not joined:
            return None
        groups = [self.layout.group_layers(g) for g in range(self.layout.layer_groups)]
        return rs.LayerWait(joined, groups, lambda counters: self.pool.counters[np.asarray(counters, dtype=np.intp)],
                            self.settings.restore_layer_wait_s)

    def settle_joined(self, wait: rs.LayerWait | None) -> set[int]:
        """After a forward: its joined sequences landed whole, or leave the batch (their output unused)."""
        if wait is None:
            return set()
        self.totals["restore_layer_waits"] += wait.waits
        self.totals["restore_layer_wait_us"] += int(wait.waited_s * 1e6)
        for seq_id in wait.joined:
            state = self.joined[seq_id]
            if seq_id in wait.failed:
                state.step_dropped()
                self._unjoin(state, wait.failed[seq_id])
            else:
                self._landed(state)
        return set(wait.failed)

    def _landed(self, state: TurnState) -> None:
        """Every layer group of a joined restore landed and checked out: done."""
        del self.joined[state.seq.seq_id]
        pending = state.restore
        outcome = rs.decide(pending, self.pool.read_counter, self._restored_ids, state.seq.token_ids)
        state.restored(outcome, self.layout.chunk_payload_bytes)
        for block in pending.blocks[:outcome.blocks_ok]:
            self.offloads.stored(state.turn.policy, block.hash)
        self.scheduler.restore_done(state.seq, outcome.covered)

    def _unjoin(self, state: TurnState, reason: str) -> None:
        """A joined restore that did not land whole: the sequence waits outside the batch until every
        counter moved (or the deadline), then keeps the blocks before the first that failed."""
        del self.joined[state.seq.seq_id]
        state.restore.whole = True
        logger.warning("turn %s leaves the batch until its restore ends: %s", state.turn.request_id, reason,
                       extra={"request_id": state.turn.request_id})
        self.scheduler.unjoin(state.seq)

    def drop_joined(self, seqs) -> None:
        """Preempted sequences that were still landing: their restore's pins wait for the GETs to end."""
        for seq in seqs:
            state = self.joined.pop(seq.seq_id, None)
            if state is not None:
                self._late_pin(seq, state.restore)

    # -- late pins
    def _late_pin(self, seq: Sequence, pending: rs.PendingRestore) -> None:
        """Blocks of the restore the sequence still pins (its blocks released) stay out of use until their
        GETs ended (or LATE_PIN_S passed): a late GET must never write into a block someone else uses."""
        give_up = time.monotonic() + LATE_PIN_S
        pinned = list(seq.pinned_blocks)
        for block in pending.blocks:
            if block.block_id in pinned:
                pinned.remove(block.block_id)
                self.late_pins.append((seq, block, give_up))

    def poll_late_pins(self) -> bool:
        if not self.late_pins:
            return False
        now, keep, done = time.monotonic(), [], False
        for seq, block, give_up in self.late_pins:
            if now < give_up and not self._gets_ended(block):
                keep.append((seq, block, give_up))
                continue
            if block.block_id in seq.pinned_blocks:
                self.scheduler.release_pins(seq, [block.block_id])
            done = True
        self.late_pins = keep
        return done

    def _gets_ended(self, block: rs.BlockRestore) -> bool:
        """Whether every layer group's GET counter of the block has moved since it was asked for."""
        return all(sum(self.pool.read_counter(c)) > s + e for c, (s, e) in zip(block.counters, block.bases))

    # -- a turn that ends early
    def release(self, state: TurnState, held: collections.Counter) -> list[int]:
        """A turn aborted (its sequence out of the scheduler, its restore's pins in seq.pinned_blocks): of
        those pins, the ones nothing will release, to release now. `held` counts those an I/O in flight
        releases when it ends (its PUTs'; the late pins' are added here); a block a GET may still write
        becomes a late pin."""
        seq = state.seq
        self.joined.pop(seq.seq_id, None)
        self.swap_waits.pop(seq.seq_id, None)
        held = held + collections.Counter(block.block_id for s, block, _ in self.late_pins if s is seq)
        landing = {b.block_id: b for b in state.restore.blocks} if state.restore is not None else {}
        idle, give_up = [], time.monotonic() + LATE_PIN_S
        for block_id in seq.pinned_blocks:
            if held[block_id]:  # released when its I/O ends, as any
                held[block_id] -= 1
            elif block_id in landing and not self._gets_ended(landing[block_id]):  # GETs may still write
                self.late_pins.append((seq, landing.pop(block_id), give_up))
            else:  # no I/O in flight will release it
                idle.append(block_id)
        return idle

    def forget(self, seq_id: int) -> None:
        """A turn's record went out (or it was dropped): no swap wait of it is left."""
        self.swap_waits.pop(seq_id, None)
