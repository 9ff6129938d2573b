"""Continuous batching: which sequences run in the next step, and how many tokens each (pure).

One step runs every running decode (1 token each), the running prefills' next chunks, then
admits waiting sequences while max_num_seqs, the token budget and free blocks allow (chunked
prefill mixed with the decodes). Users share fairly (`compute_node.fair_order`): admission picks
the next sequence, restored or waiting, of the user with the fewest sequences running (each user's
own sequences in their order); while a greedy user holds most of the batch, a newcomer's first turn
may take a place past max_num_seqs (`newcomer_slots`) and gets a step of its own for its first
token (`first_token_steps`); the prefill budget is split across users (one user's long prompts do
not hold back another's turn), and when a decode cannot get a block the victim is the most recently
admitted sequence of the user with the most running sequences. With a step budget
(`compute_node.step_budget`), while another user's turn waits or runs beside a prefill (or did
lately), each prefill chunk takes only the tokens that keep the step's predicted time within its
target (time is left for
the next admission's prompt first), so one user's long prompt never holds another's first token for a
long step; alone, prefills take full chunks. A victim is preempted: by recompute (its blocks are freed, it
prefills again later, finding its full blocks in the prefix cache if they are still there),
by swap (its KV blocks are pinned until the engine has stored them, then it is restored; a
sequence whose policy stores nothing is recomputed) or by swap-host (its blocks are freed at
once: the engine copies them into its host swap tier before the step's forward writes
anything, and copies them back into the blocks of its restore; any policy).
The engine drives it: schedule() -> run the model -> postprocess(); restores and swap-outs
go through the block pins and restore_done().
"""
from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Iterable
from collections.abc import Sequence as Seq

from compute_node import fair_order
from compute_node.block_manager import BlockManager
from compute_node.sequence import Sequence, SequenceStatus
from compute_node.step_budget import StepCap

logger = logging.getLogger(__name__)

PREEMPTION_MODES = ("swap", "swap-host", "recompute")
MAX_USERS_REMEMBERED = 10_000  # users whose last admission the round-robin keeps
WAITING, RESTORING, RUNNING = SequenceStatus.WAITING, SequenceStatus.RESTORING, SequenceStatus.RUNNING
SWAPPED, FINISHED = SequenceStatus.SWAPPED, SequenceStatus.FINISHED


class QueueFull(Exception):
    """The wait queue is at max_waiting (the service answers RESOURCE_EXHAUSTED)."""


class NeverFits(ValueError):
    """The sequence needs more blocks than the pool has (the service answers INVALID_ARGUMENT)."""


@dataclasses.dataclass
class ScheduledSeq:
    """One sequence's work in a step: tokens [start, start + num_tokens) are computed."""

    seq: Sequence
    start: int
    num_tokens: int
    samples: bool  # the step computes the sequence's last token: its logits give the next token

    @property
    def filled_blocks(self) -> range:
        """Indexes of the blocks this step completes (their last token is computed by it)."""
        bt = self.seq.block_tokens
        return range(self.start // bt, (self.start + self.num_tokens) // bt)


@dataclasses.dataclass
class SwapOut:
    """A swap victim: block_ids hold its KV tokens [0, num_tokens).

    kind "swap": each block is pinned once; unpin once stored. kind "swap-host": the blocks are free
    already; the engine must copy them out before this step's forward (nothing writes them before),
    or call swap_failed.
    """

    seq: Sequence
    block_ids: list[int]
    num_tokens: int
    kind: str = "swap"


@dataclasses.dataclass
class RestoreRequest:
    """Blocks the engine must fill from storage: block_ids[k] is seq.block_table[block_indexes[k]] (pinned)."""

    seq: Sequence
    block_indexes: list[int]
    block_ids: list[int]
    first_token: int  # tokens before it were found in the prefix cache
    num_tokens: int  # tokens [first_token, num_tokens) are to arrive


@dataclasses.dataclass
class SchedulerOutput:
    """What one step does; plain values for the engine and the model runner."""

    scheduled: list[ScheduledSeq] = dataclasses.field(default_factory=list)
    preempted: list[tuple[Sequence, str]] = dataclasses.field(default_factory=list)  # (seq, kind)
    swapped_out: list[SwapOut] = dataclasses.field(default_factory=list)
    restores: list[RestoreRequest] = dataclasses.field(default_factory=list)  # swapped ones re-admitted
    admitted: list[Sequence] = dataclasses.field(default_factory=list)
    stalled: list[Sequence] = dataclasses.field(default_factory=list)  # decodes waiting for pinned blocks

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def sampling(self) -> list[Sequence]:
        """The sequences whose next token postprocess() expects, in order."""
        return [s.seq for s in self.scheduled if s.samples]

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclasses.dataclass
class SchedulerStats:
    """Counters since start."""

    preemptions: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # by kind
    preempted_tokens: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    tokens_recomputed: int = 0  # KV tokens lost to preemption and prefilled again
    tokens_restored: int = 0  # KV tokens of swapped sequences brought back from storage
    finished: int = 0  # aborted ones included


class Scheduler:
    """Waiting, restoring, ready and running sequences over one BlockManager. Not thread-safe.

    Invariants: a sequence is in exactly one of waiting (no blocks, or SWAPPED), restoring
    (RESTORING, blocks allocated), ready (restored, holds blocks, waits for a place in the
    batch) and running (RUNNING, in admission order); len(running) <= max_num_seqs +
    newcomer_slots, and past max_num_seqs only by newcomers admitted beside a greedy user; every
    running sequence has at least one token to compute.
    """

    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 preemption: str = "recompute", max_waiting: int = 64, stop_token_ids: Iterable[int] = (),
                 pin_finished: bool = False, newcomer_slots: int = 0, first_token_steps: bool = False,
                 step_budget=None):
        if preemption not in PREEMPTION_MODES:
            raise ValueError(f"preemption must be one of {PREEMPTION_MODES}")
        if max_num_seqs <= 0 or max_waiting <= 0:
            raise ValueError(f"max_num_seqs ({max_num_seqs}) and max_waiting ({max_waiting}) must be positive")
        if newcomer_slots < 0 or max_num_batched_tokens < max_num_seqs + newcomer_slots:
            raise ValueError("the token budget must fit a decode per sequence (newcomer slots included)")
        self.bm = block_manager
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.preemption, self.max_waiting = preemption, max_waiting
        self.stop_token_ids = frozenset(stop_token_ids)
        self.pin_finished = pin_finished  # pin a finished sequence's KV blocks (so its tail can be stored)
        self.newcomer_slots, self.first_token_steps = newcomer_slots, first_token_steps  # fair_order
        self._first_token_step_last = False  # the last step was a first-token step: the next one is not
        self.step_budget = step_budget  # step_budget.StepBudget, fed by the engine (None: tokens bound a step)
        self._cap = StepCap(None)  # this step's cap on prefill chunks (the step budget's target, or none)
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.ready: collections.deque[Sequence] = collections.deque()
        self.restoring: dict[int, Sequence] = {}
        self.running: list[Sequence] = []
        self.stats = SchedulerStats()
        self._admissions = 0  # sequences taken from the wait queue, ever
        self._last_admitted: collections.OrderedDict = collections.OrderedDict()  # user -> its last admission

    # -- queries
    @property
    def num_waiting(self) -> int:
        """Sequences waiting for the batch (restoring ones included): vLLM's num_requests_waiting."""
        return len(self.waiting) + len(self.ready) + len(self.restoring)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def has_work(self) -> bool:
        return bool(self.waiting or self.ready or self.restoring or self.running)

    # -- entry
    def _check_fits(self, seq: Sequence) -> None:
        if seq.max_blocks > self.bm.num_blocks:
            raise NeverFits(f"{seq.num_prompt_tokens} prompt tokens + {seq.max_new_tokens} new tokens need "
                            f"{seq.max_blocks} blocks of {self.bm.block_tokens} tokens; the pool has "
                            f"{self.bm.num_blocks}")

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence (NeverFits if it could never run; QueueFull past max_waiting)."""
        if seq.block_table or seq.status is not WAITING:
            raise ValueError("add() takes a new sequence")
        self._check_fits(seq)
        if len(self.waiting) >= self.max_waiting:
            raise QueueFull(f"{len(self.waiting)} requests are already waiting (max_waiting {self.max_waiting})")
        seq.status = WAITING
        self.waiting.append(seq)

    def start_restore(self, seq: Sequence, num_tokens: int) -> RestoreRequest | None:
        """A new sequence whose first num_tokens tokens storage will fill: allocate now (None: no blocks)."""
        self._check_fits(seq)
        if not self.bm.can_allocate(seq):
            return None
        return self._restore(seq, num_tokens)

    def _restore(self, seq: Sequence, num_tokens: int) -> RestoreRequest | None:
        """Allocate for a restore; RESTORING if blocks must be filled, else ready at once (None)."""
        indexes = self.bm.allocate_for_restore(seq, num_tokens)
        if not indexes:
            self._make_ready(seq)
            return None
        seq.status = RESTORING
        self.restoring[seq.seq_id] = seq
        return RestoreRequest(seq, indexes, [seq.block_table[i] for i in indexes], seq.num_cached_tokens,
                              seq.num_restore_tokens)

    def restore_done(self, seq: Sequence, covered_tokens: int) -> None:
        """The restore's I/O ended with tokens [0, covered_tokens) in place: seq may join the batch (a
        joined one stays where it is: its blocks are unpinned and shared in the prefix cache now).

        For a sequence aborted while restoring, this releases the pins its restore still held.
        """
        if seq.is_finished:
            self.release_pins(seq)
            return
        if self.restoring.get(seq.seq_id) is not seq:
            if seq.status not in (WAITING, RUNNING):
                raise RuntimeError(f"sequence {seq.seq_id} is not restoring")
            self.bm.restore_done(seq, covered_tokens)  # joined: already ready or running
            return
        del self.restoring[seq.seq_id]
        self.bm.restore_done(seq, covered_tokens)
        self._make_ready(seq)

    def restore_joined(self, seq: Sequence, covered_tokens: int) -> None:
        """The first layer group of tokens [0, covered_tokens) landed in every block: seq may join the
        batch while the other groups land (the model waits for each; its blocks stay pinned until
        restore_done, or go back to RESTORING by unjoin)."""
        self._stop_restoring(seq)
        self.bm.restore_joined(seq, covered_tokens)
        self._make_ready(seq)

    def unjoin(self, seq: Sequence) -> None:
        """A joined restore failed to land (an error, or not in time): seq leaves the batch, or the ready
        queue, and waits restoring until its I/O ended (then restore_done or requeue)."""
        if seq in self.ready:
            self.ready.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
        self.bm.restore_unjoined(seq)
        seq.status = RESTORING
        self.restoring[seq.seq_id] = seq

    def _stop_restoring(self, seq: Sequence) -> None:
        """seq leaves `restoring` (RuntimeError, and nothing changes, if it is not there)."""
        if self.restoring.get(seq.seq_id) is not seq:
            raise RuntimeError(f"sequence {seq.seq_id} is not restoring")
        del self.restoring[seq.seq_id]

    def _make_ready(self, seq: Sequence) -> None:
        if seq.num_preempted_tokens:  # a swapped sequence is back: what storage gave, and what it did not
            restored = max(0, min(seq.num_computed_tokens, seq.num_preempted_tokens) - seq.num_cached_tokens)
            self.stats.tokens_restored += restored
            self.stats.tokens_recomputed += max(0, seq.num_preempted_tokens - seq.num_computed_tokens)
            seq.num_preempted_tokens = 0
        seq.status = WAITING
        self.ready.append(seq)

    def swap_failed(self, seq: Sequence) -> None:
        """A swap-host victim whose KV the engine did not keep (its tier was full, or the copy was
        doubtful): it waits where it is, to be prefilled again on admission (preemption by recompute)."""
        if seq.status is not SWAPPED:
            raise ValueError(f"sequence {seq.seq_id} is not swapped out")
        seq.status = WAITING

    def release_pins(self, seq: Sequence, block_ids: Iterable[int] | None = None) -> None:
        """The I/O on these of seq.pinned_blocks (default: all) ended: unpin them."""
        for block_id in list(seq.pinned_blocks if block_ids is None else block_ids):
            seq.pinned_blocks.remove(block_id)
            self.bm.unpin(block_id)

    def requeue(self, seq: Sequence) -> None:
        """A restore that did not land in time: give up its blocks (the pins of GETs still in flight
        move to seq.pinned_blocks, released by the engine when they end) and prefill it again."""
        self._stop_restoring(seq)
        self.bm.deallocate(seq)
        seq.status, seq.num_stored_tokens = WAITING, 0
        if seq.num_preempted_tokens:
            self.stats.tokens_recomputed += seq.num_preempted_tokens
            seq.num_preempted_tokens = 0
        self.waiting.appendleft(seq)

    def abort(self, seq: Sequence) -> None:
        """Drop a sequence wherever it is (its restore's pins move to seq.pinned_blocks)."""
        if seq.status is FINISHED:
            return
        for queue in (self.waiting, self.ready, self.running):
            if seq in queue:
                queue.remove(seq)
        self.restoring.pop(seq.seq_id, None)
        self._finish(seq, "abort")

    # -- one step
    def schedule(self) -> SchedulerOutput:
        """Choose the next step's work (decodes, prefill chunks, admissions), preempting if blocks run out;
        or, beside a greedy user, a first-token step: newcomers' whole prompts and nothing else."""
        out = SchedulerOutput()
        self._cap = StepCap(self.step_budget, *self._users())
        if self._first_token_step(out):
            return out
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget:  # decodes first, in admission order
            seq = self.running[i]
            if seq.is_decode:
                room = self._make_room(i, out)
                if room == "preempted":
                    continue  # seq itself left: running[i] is the next one
                if room == "ok":
                    self.bm.may_append(seq)
                    budget -= self._run(seq, 1, out)
            i += 1
        prefills = [seq for seq in self.running if not seq.is_decode]
        if prefills and budget:  # then the prefills already under way, the budget split across users
            admitting = not out.preempted and len(self.running) < self.max_num_seqs
            other = self._other_user_admissible(prefills) if admitting else None
            shares = fair_order.prefill_shares(prefills, budget, other is not None)
            # under the step budget the next admission's prompt is counted in first: the prefills leave it time
            reserved = [(other.num_computed_tokens, min(other.num_tokens_to_compute, budget))] \
                if other is not None and self._cap.on else []
            for seq in prefills:
                tokens = self._timed_tokens(seq, min(seq.num_tokens_to_compute, shares[seq.user_id], budget),
                                            out, reserved)
                if tokens:
                    shares[seq.user_id] -= tokens
                    budget -= self._run(seq, tokens, out)
        if not out.preempted:  # no admission while memory is short
            self._admit(out, budget)
        return out

    def _first_token_step(self, out: SchedulerOutput) -> bool:
        """Beside a greedy user (fair_order), and unless the last step was one: admit the newcomers whose
        whole prompt fits the budget and run only their prompts, so their first tokens wait for one short
        step, not for a full batch's. False when none was scheduled (restores it began stay in out)."""
        if not self.first_token_steps or self._first_token_step_last or not fair_order.has_greedy_user(self.running):
            self._first_token_step_last = False
            return False
        self._admit(out, self.max_num_batched_tokens, newcomers_only=True)
        self._first_token_step_last = bool(out.scheduled)
        return self._first_token_step_last

    def _other_user_admissible(self, prefills: list[Sequence]) -> Sequence | None:
        """The next sequence admission would take if it is another user's than those prefilling, and could
        be admitted now (its blocks are there): then the prefills leave it a share of the budget."""
        running = collections.Counter(s.user_id for s in self.running)
        served = fair_order.in_service(self.running, self.ready, self.restoring.values())
        seq = fair_order.next_admission(self.ready, self.waiting, running, served, self._last_admitted)
        if seq is None or seq.user_id in {s.user_id for s in prefills}:
            return None
        return seq if seq in self.ready or (not seq.pinned_blocks and self.bm.can_allocate(seq)) else None

    def _users(self) -> tuple[int, int]:
        """How many users have a sequence here (running, ready, restoring or waiting), and running."""
        running = {seq.user_id for seq in self.running}
        return len(running.union(*({q.user_id for q in queue} for queue in
                                   (self.ready, self.restoring.values(), self.waiting)))), len(running)

    def _timed_tokens(self, seq: Sequence, tokens: int, out: SchedulerOutput, reserved=()) -> int:
        """Of `tokens` of seq's prefill, those the step's cap allows beside what out scheduled."""
        return self._cap.tokens([(s.start, s.num_tokens, s.seq.is_decode) for s in out.scheduled],
                                seq.num_computed_tokens, tokens, reserved)

    def _make_room(self, index: int, out: SchedulerOutput) -> str:
        """Blocks for running[index]'s decode: "ok", "stalled" (pinned blocks will do) or "preempted" (it
        was the victim itself). A victim is never one this step scheduled already (before index)."""
        seq = self.running[index]
        while not self.bm.can_append(seq):
            need = self.bm.blocks_to_append(seq) - self.bm.num_allocatable_blocks
            if self.bm.num_pinned_free_blocks >= need:
                out.stalled.append(seq)  # I/O in flight will release enough: skip one step
                return "stalled"
            victim = self._victim(index)
            self._preempt(victim, out)
            if victim is seq:
                return "preempted"
        return "ok"

    def _victim(self, index: int) -> Sequence:
        """Among running[index:], the most recently admitted sequence of the user with the most running
        sequences (one user alone: the most recently admitted)."""
        counts = collections.Counter(seq.user_id for seq in self.running)
        candidates = self.running[index:]
        most = max(counts[seq.user_id] for seq in candidates)
        return next(seq for seq in reversed(candidates) if counts[seq.user_id] == most)

    def _took_turn(self, user) -> None:
        """user's turn in the round-robin was taken."""
        self._admissions += 1
        self._last_admitted[user] = self._admissions
        self._last_admitted.move_to_end(user)
        while len(self._last_admitted) > MAX_USERS_REMEMBERED:  # a forgotten user just counts as new
            self._last_admitted.popitem(last=False)

    def _admit(self, out: SchedulerOutput, budget: int, newcomers_only: bool = False) -> None:
        """Take sequences into the batch in fair order (fair_order) while places, the budget and blocks
        allow; newcomers_only: only users with nothing running, each with its whole prompt."""
        served = fair_order.in_service(self.running, self.ready, self.restoring.values())
        running = collections.Counter(seq.user_id for seq in self.running)
        greedy = fair_order.has_greedy_user(self.running)
        blocked = False  # a waiting sequence found no blocks: only restored (ready) ones may still come in

        def eligible(seq: Sequence) -> bool:
            if blocked and seq not in self.ready:
                return False
            return not newcomers_only or (running[seq.user_id] == 0 and seq.num_tokens_to_compute <= budget)
        while budget:
            seq = fair_order.next_admission(self.ready, self.waiting, running, served, self._last_admitted,
                                            eligible)
            if seq is None:
                break
            newcomer = greedy and running[seq.user_id] == 0
            if len(self.running) >= self.max_num_seqs + (self.newcomer_slots if newcomer else 0):
                break
            if not newcomers_only and not self._timed_tokens(seq, 1, out):
                break  # the step's time is spent: it waits for the next
            if seq in self.ready:
                self.ready.remove(seq)
                self._took_turn(seq.user_id)
            elif seq.status is SWAPPED or seq.num_stored_tokens:
                if seq.pinned_blocks or not self.bm.can_allocate(seq):
                    blocked = True  # its swap-out is still being stored, or no blocks yet
                    continue
                self.waiting.remove(seq)
                self._took_turn(seq.user_id)
                served[seq.user_id] += 1
                restore = self._restore(seq, max(seq.num_preempted_tokens, seq.num_stored_tokens))
                seq.num_stored_tokens = 0
                if restore is not None:
                    out.restores.append(restore)
                continue  # RESTORING, or now in ready
            else:
                if not self.bm.can_allocate(seq):
                    blocked = True
                    continue
                self.waiting.remove(seq)
                self._took_turn(seq.user_id)
                served[seq.user_id] += 1
                self.bm.allocate(seq)
                if seq.num_preempted_tokens:
                    self.stats.tokens_recomputed += max(0, seq.num_preempted_tokens - seq.num_cached_tokens)
                    seq.num_preempted_tokens = 0
            seq.status = RUNNING
            self.running.append(seq)
            running[seq.user_id] += 1
            out.admitted.append(seq)
            tokens = min(seq.num_tokens_to_compute, budget)
            if not newcomers_only:  # a newcomer's first-token step takes its whole prompt
                tokens = max(1, self._timed_tokens(seq, tokens, out))
            budget -= self._run(seq, tokens, out)

    def _run(self, seq: Sequence, num_tokens: int, out: SchedulerOutput) -> int:
        start = seq.num_computed_tokens
        out.scheduled.append(ScheduledSeq(seq, start, num_tokens, start + num_tokens == len(seq)))
        return num_tokens

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        kind = self.preemption if seq.can_swap or self.preemption == "swap-host" else "recompute"
        tokens = seq.num_computed_tokens
        self.stats.preemptions[kind] += 1
        self.stats.preempted_tokens[kind] += tokens
        seq.num_preemptions += 1
        seq.num_preempted_tokens = tokens
        seq.kv_mark = max(seq.kv_mark, tokens)
        if kind == "swap" and tokens:
            block_ids = self.bm.deallocate(seq, pin=True)
            out.swapped_out.append(SwapOut(seq, block_ids, tokens))
            seq.status = SWAPPED
        elif kind == "swap-host" and tokens:
            block_ids = seq.block_table[:-(-tokens // self.bm.block_tokens)]
            self.bm.deallocate(seq)
            out.swapped_out.append(SwapOut(seq, block_ids, tokens, kind))
            seq.status = SWAPPED
        else:
            self.bm.deallocate(seq)
            seq.status = WAITING
        out.preempted.append((seq, kind))
        self.waiting.appendleft(seq)
        logger.debug("preempted sequence %s by %s (%d KV tokens)", seq.seq_id, kind, tokens)

    # -- after the step
    def postprocess(self, output: SchedulerOutput, sampled_tokens: Seq[int]) -> list[Sequence]:
        """Advance computed tokens, append sampled ones (aligned with output.sampling); return the finished."""
        if len(sampled_tokens) != len(output.sampling):
            raise ValueError("one sampled token per sampling sequence")
        tokens = iter(sampled_tokens)
        finished = []
        for s in output.scheduled:
            token = next(tokens) if s.samples else None
            seq = s.seq
            if seq.status is not RUNNING:  # aborted since the step was scheduled
                continue
            if seq.num_computed_tokens != s.start:
                raise RuntimeError("postprocess called twice for a step")
            self.bm.mark_computed(seq, s.num_tokens)
            if token is None:
                continue
            seq.append_token(token)
            reason = seq.check_stop(token, self.stop_token_ids)
            if reason is None:
                continue
            self.running.remove(seq)
            self._finish(seq, reason)
            finished.append(seq)
        return finished

    def stop(self, seq: Sequence, stop_reason: str = "") -> None:
        """End a running sequence after its step's postprocess (a stop string matched, or its grammar ended),
        its blocks released (or pinned) as any finished sequence's."""
        if seq.status is not RUNNING:
            raise ValueError(f"sequence {seq.seq_id} is not running")
        self.running.remove(seq)
        seq.stop_reason = stop_reason
        self._finish(seq, "stop")

    def _finish(self, seq: Sequence, reason: str) -> None:
        if seq.block_table:
            self.bm.deallocate(seq, pin=self.pin_finished and reason != "abort")
        seq.status, seq.finish_reason = FINISHED, reason
        self.stats.finished += 1
