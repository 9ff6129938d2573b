"""The batching engine: one thread that steps every running sequence at once over the paged pool.

Each loop: take new turns in, see which PUTs and restores have landed (by reading counters in
the region: no RPC), ask the scheduler for the next step, run one forward over every scheduled
sequence (decode tokens and prefill chunks together), sample (every sequence by its own sampling
parameters, in one batched pass: compute_node.sampling), stream the tokens (a stop string or the
end of a structured reply's grammar finishes its sequence there, as a stop token would), and store
each block that filled as the turn's policy says. A sequence whose KV is being restored waits outside
the batch while the others decode, until the first layer group of every block landed; then it
joins, and the forward waits before each later group's first layer until that group landed
(compute_node.restore: join, LayerWait). Between layers, every few ms, the forward also takes new
turns in and settles ended PUTs and restores (_housekeeping), so that a follow-up's restore starts
and a finished turn's record leaves without waiting for the step to end. Under preemption
`swap-host` a victim's blocks are copied into the host swap tier (compute_node.host_swap) right
after scheduling, before the forward, and back when it is re-admitted. The engine's own time in
preemption work is kept in `cost` (compute_node.preemption_cost). Service threads only call
submit() and snapshot().
"""
from __future__ import annotations

import collections
import contextlib
import logging
import secrets
import threading
import time

import numpy as np
import torch

from compute_node import restore as rs
from compute_node.block_manager import BlockManager
from compute_node.chat_template import TokenPieces
from compute_node.host_swap import HostSwapStore, capacity_bytes
from compute_node.model_loader import generation_defaults
from compute_node.model_runner import ModelRunner, SeqRun
from compute_node.offload import Block, PendingPut
from compute_node.preemption_cost import PreemptionCost, restore_wait
from compute_node.sampling import SequenceSampler, TokenLogprobs, sample
from compute_node.scheduler import NeverFits, QueueFull, RestoreRequest, Scheduler, SchedulerOutput, SwapOut
from compute_node.sequence import Sequence, SequenceStatus
from compute_node.settings import ComputeSettings
from compute_node.step_budget import StepBudget
from compute_node.turn import RestoreBlockEvent, StepSpan, Turn
from compute_node.turn_state import TurnState
from hostmem.block_hash import Salts, block_hash, salts_of
from scale import paced

logger = logging.getLogger(__name__)

MAX_KNOWN_CONTEXTS = 100_000
MAX_STORED_NAMES = 1_000_000
LATE_PIN_S = 300.0  # how long a block a timed-out GET may still write stays out of use
# How often a forward stops between two layers to take new turns in and settle ended PUTs and
# restores (Engine._housekeeping): at 32 sequences a step takes ~120 ms here, and a follow-up
# waited for the step's end before its restore was even asked for.
HOUSEKEEPING_S = 0.005
INTERNAL_MESSAGE = "the compute node's engine failed this turn's work (a bug); see its log"


class Stats:
    """Counters over all turns (guarded by the engine's lock)."""

    def __init__(self):
        self.turns = 0
        self.kv_source = collections.Counter()
        self.fallbacks = collections.Counter()
        self.totals = collections.Counter()

    def add(self, rec) -> None:
        self.turns += 1
        self.kv_source[rec.kv_source] += 1
        if rec.fallback_reason:
            self.fallbacks[rec.fallback_reason.split(":")[0]] += 1
        for name in ("bytes_restored", "bytes_offloaded", "tokens_prefilled", "tokens_reused", "tokens_out"):
            self.totals[name] += getattr(rec, name)


class Engine:
    """Owns the model runner, the pool's bookkeeping and every turn's state.

    Thread-safety: submit(), stop() and snapshot() from any thread (they take `lock`); everything
    else runs on the engine thread.
    """

    def __init__(self, settings: ComputeSettings, model, tokenizer, pool, offloaders: dict, *,
                 cpu_store=None, setup_span: StepSpan | None = None):
        self.settings, self.tokenizer, self.pool = settings, tokenizer, pool
        self.layout = pool.layout
        self.offloaders, self.cpu_store = offloaders, cpu_store
        self.stop_token_ids = {tokenizer.eos_token_id} - {None}
        self.vocab_size = model.config.vocab_size
        self.pieces = TokenPieces(tokenizer)  # each token's text alone (logprobs)
        self.generation_defaults = generation_defaults(model)
        self.bm = BlockManager(self.layout.num_blocks, self.layout.block_tokens, settings.prefix_cache)
        self.step_budget = StepBudget(settings.step_target_s) if settings.step_target_s else None  # fed by _iterate
        self.scheduler = Scheduler(self.bm, settings.max_num_seqs, settings.max_num_batched_tokens,
                                   settings.preemption, settings.queue_bound, self.stop_token_ids,
                                   newcomer_slots=settings.newcomer_slots,
                                   first_token_steps=settings.first_token_steps, step_budget=self.step_budget)
        self.runner = ModelRunner(model, pool.kv, settings.device)
        # preemption swap-host: the host swap tier (vLLM's CPU swap space)
        self.host_swap = (HostSwapStore(self.layout, pool.region.array,
                                        capacity_bytes(self.layout, settings.swap_space_blocks * self.layout.block_tokens))
                          if settings.preemption == "swap-host" else None)
        self.cost = PreemptionCost()  # the engine's own time in preemption work
        self._swap_waits: dict[int, float] = {}  # swapped sequences restoring from storage: seq id -> start
        self.states: dict[int, TurnState] = {}
        self.puts: dict[int, tuple[PendingPut, TurnState | None, Sequence | None, bytes]] = {}  # by block id
        self.put_waiters: dict[int, list[TurnState]] = {}  # turns sharing a block whose PUT is in flight
        self.stored_names: collections.OrderedDict[tuple[str, bytes], None] = collections.OrderedDict()
        self.restores: dict[int, TurnState] = {}  # restoring sequences by seq id (outside the batch)
        self.joined: dict[int, TurnState] = {}    # sequences in the batch whose later layer groups still land
        self.late_pins: list[tuple[Sequence, rs.BlockRestore, float]] = []  # (seq, block, give up at): GETs that may still write
        self.stuck_puts: dict[int, PendingPut] = {}  # by block id: PUTs past drain_timeout_s, their block still pinned
        self._touched: set[int] | None = None  # seq ids the work under way touches (None: every live turn)
        self.steps_failed = 0
        self._poll_cost: list[tuple[TurnState, float]] = []  # this loop's share of polling PUTs, per turn
        self.known: collections.OrderedDict[tuple[str, str], int] = collections.OrderedDict()
        self.stats = Stats()
        self.steps = 0
        self._layer_waited = 0.0  # this step's wall seconds waiting for restored layers (a stall, under a profile)
        self.setup_span = setup_span
        self.region_id = lambda: 0  # the pool's region at the agent (the node sets it once registered)
        self.lock = threading.Condition()
        self._intake: collections.deque[Turn] = collections.deque()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)

    # -- service threads
    def start(self) -> Engine:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        with self.lock:
            self._stopping = True
            self.lock.notify_all()
        self._thread.join(timeout_s)

    def policies(self) -> list[str]:
        return sorted(self.offloaders)

    def submit(self, turn: Turn) -> None:
        """Hand a turn to the engine thread (QueueFull when the wait queue is at its bound)."""
        with self.lock:
            if self._stopping:
                raise QueueFull("the compute node is shutting down")
            if len(self._intake) + self.scheduler.num_waiting >= self.settings.queue_bound:
                raise QueueFull(f"{self.settings.queue_bound} turns are already waiting (queue_bound)")
            self._intake.append(turn)
            self.lock.notify_all()

    def check_fits(self, num_prompt_tokens: int, max_new_tokens: int) -> None:
        """NeverFits when a turn could never have its blocks in this pool."""
        bt = self.layout.block_tokens
        need = -(-(num_prompt_tokens + max_new_tokens - 1) // bt)
        if need > self.layout.num_blocks:
            raise NeverFits(f"{num_prompt_tokens} prompt tokens + {max_new_tokens} new tokens need {need} "
                            f"blocks of {bt} tokens; the pool has {self.layout.num_blocks}")

    def snapshot(self) -> dict:
        with self.lock:
            sched, bm = self.scheduler, self.bm
            return {"turns": self.stats.turns, "num_requests_running": sched.num_running,
                    "num_requests_waiting": sched.num_waiting + len(self._intake),
                    "num_requests_restoring": len(sched.restoring), "restores_landing": len(self.joined),
                    "kv_cache_usage_perc": bm.usage,
                    "preemptions": dict(sched.stats.preemptions), "preempted_tokens": dict(sched.stats.preempted_tokens),
                    "prefix_cache_queries": bm.prefix_cache_queries, "prefix_cache_hits": bm.prefix_cache_hits,
                    "kv_source": dict(self.stats.kv_source), "fallbacks": dict(self.stats.fallbacks),
                    "steps": self.steps, "steps_failed": self.steps_failed,
                    "puts_timed_out": self.stats.totals["puts_timed_out"], "blocks_quarantined": len(self.stuck_puts),
                    **self.stats.totals, **self.cost.as_dict(), **self._host_swap_snapshot()}

    def _host_swap_snapshot(self) -> dict:
        if self.host_swap is not None:
            return self.host_swap.snapshot()
        return {"swap_host_bytes_out": 0, "swap_host_bytes_in": 0, "swap_host_blocks_out": 0,
                "swap_host_blocks_in": 0, "swap_host_fallbacks": 0, "swap_host_full": 0, "swap_host_used_bytes": 0,
                "swap_host_capacity_bytes": 0, "swap_host_sequences": 0}

    # -- the engine thread
    def _loop(self) -> None:
        idle_sleep = 50e-6
        while True:
            with self.lock:
                if self._stopping:
                    break
                new = list(self._intake)
                self._intake.clear()
            try:
                worked = self._iterate(new)
            except Exception:  # a bug must fail the turns it touches, not the node
                logger.exception("engine step failed")
                self._fail_touched()
                worked = False
            if worked:
                idle_sleep = 50e-6
                continue
            with self.lock:
                if self._intake or self._stopping:
                    continue
                busy = self.restores or self.joined or self.puts or self.late_pins or self.stuck_puts
                self.lock.wait(idle_sleep if busy else 0.5)
            idle_sleep = min(idle_sleep * 2, 1e-3)
        self._fail_all("UNAVAILABLE", "the compute node is shutting down")

    def _iterate(self, new: list[Turn]) -> bool:
        """One turn of the loop; whether it did anything. What a failure fails: the turn being taken in or
        polled, the step's sequences once scheduled, every live turn otherwise (`_touched`)."""
        self._touched = None
        self._take_in(new)
        self._drop_cancelled()
        self._poll_cost = []
        progressed = self._poll_puts() | self._poll_restores() | self._poll_joined() | self._poll_late_pins()
        progressed |= self._poll_stuck_puts()
        out = self.scheduler.schedule()
        self._touched = {s.seq.seq_id for s in out.scheduled} | {seq.seq_id for seq, _ in out.preempted} \
            | {r.seq.seq_id for r in out.restores} | {seq.seq_id for seq in out.admitted}
        self._swap_out(out)
        self._drop_joined([seq for seq, _ in out.preempted])
        for request in out.restores:
            if self.host_swap is not None and request.seq.seq_id in self.host_swap:
                self._swap_in(request)
            else:
                self._start_restore(self.states[request.seq.seq_id], request)
        if self.host_swap is not None and len(self.host_swap):
            touched, self._touched = self._touched, None
            self._drop_unused_copies()
            self._touched = touched
        if out.is_empty:
            return progressed or bool(new)
        self._charge_poll_cost()
        started = time.perf_counter()
        self._step(out)
        if self.step_budget is not None:  # the time the scheduler's step cap learns from (restore waits excluded)
            self.step_budget.observe([(s.start, s.num_tokens) for s in out.scheduled],
                                     max(0.0, time.perf_counter() - started - self._layer_waited))
        return True

    # -- turns in and out
    def _take_in(self, turns: list[Turn]) -> None:
        """New turns into the engine; one that fails (a bug) fails alone."""
        for turn in turns:
            try:
                self._admit_turn(turn)
            except Exception:  # a bug in one turn's admission fails that turn, not the node
                logger.exception("taking turn %s in failed", turn.request_id, extra={"request_id": turn.request_id})
                state = next((s for s in self.states.values() if s.turn is turn), None)
                if state is not None:
                    self._abort(state, "INTERNAL", INTERNAL_MESSAGE)
                else:
                    turn.emit("error", "INTERNAL", INTERNAL_MESSAGE)

    @contextlib.contextmanager
    def _only(self, state: TurnState):
        """Work on one turn's state: a failure (a bug) aborts that turn alone, and the engine goes on."""
        try:
            yield
        except Exception:
            logger.exception("turn %s failed", state.turn.request_id, extra={"request_id": state.turn.request_id})
            self._abort(state, "INTERNAL", INTERNAL_MESSAGE)

    def _admit_turn(self, turn: Turn) -> None:
        if turn.cancelled.is_set():
            return
        salt = (Salts(secrets.token_bytes(16)) if turn.policy == "recompute"  # nothing reused, ever
                else Salts.of(turn.tenant, turn.user_id, turn.shared_prefix_tokens, self.layout.block_tokens))
        offloader = self.offloaders[turn.policy]
        # the scheduler's fair share is per user of a tenant
        params = turn.sampling
        seq = Sequence(turn.token_ids, turn.max_new_tokens, self.layout.block_tokens, (turn.tenant, turn.user_id),
                       turn.context_id, salt, payload=turn, ignore_eos=turn.ignore_eos,
                       can_swap=offloader.offloads, stop_token_ids=frozenset(params.stop_token_ids),
                       min_tokens=params.min_tokens)
        eos = () if turn.ignore_eos else self.stop_token_ids
        sampler = SequenceSampler(params, self.vocab_size, turn.token_ids if params.repetition_penalty_on else (),
                                  eos, turn.matcher)
        state = TurnState(turn, seq, self.tokenizer, self.known.get(turn.context, 0) > 0, sampler, self.pieces)
        self.states[seq.seq_id] = state  # from here a failure aborts it (_take_in)
        stored = turn.stored_tokens if turn.policy == "triggered" else 0
        if turn.policy == "cpu" and self.cpu_store is not None:
            stored = self.cpu_store.stored_tokens(seq, self.bm)
        try:
            if stored and self.bm.can_allocate(seq):
                request = self.scheduler.start_restore(seq, stored)
                if request is not None:
                    self._start_restore(state, request)
                    return
            else:
                seq.num_stored_tokens = stored
            if seq.status.value == "waiting" and seq not in self.scheduler.ready:
                self.scheduler.add(seq)
        except NeverFits as exc:
            del self.states[seq.seq_id]
            return turn.emit("error", "INVALID_ARGUMENT", str(exc))
        except QueueFull as exc:
            del self.states[seq.seq_id]
            return turn.emit("error", "RESOURCE_EXHAUSTED", str(exc))

    def _drop_cancelled(self) -> None:
        for state in [s for s in self.states.values() if s.turn.cancelled.is_set() and not s.finished]:
            self._abort(state)

    def _abort(self, state: TurnState, code: str = "", message: str = "") -> None:
        """End a live turn wherever it is (cancelled, or failed with code and message): every transition of
        its sequence's cleanup, in one place. Its sequence leaves the scheduler and its blocks are freed;
        a block its I/O may still touch stays pinned until that I/O ends: a restore's GETs (late pins), a
        PUT (released when its counter moves, as any PUT's); any other pin goes at once."""
        seq = state.seq
        if code:
            state.turn.emit("error", code, message)
            state.aborted = True  # it had its answer: never a record after it
        state.finished = True  # before anything that may raise: never aborted twice
        try:
            self.scheduler.abort(seq)  # its blocks are freed; the pins of a restore move to seq.pinned_blocks
        finally:
            self.restores.pop(seq.seq_id, None)
            self.joined.pop(seq.seq_id, None)
            held = collections.Counter(block.block_id for s, block, _ in self.late_pins if s is seq)
            held.update(b for b, (_, _, owner, _) in self.puts.items() if owner is seq)
            landing = {b.block_id: b for b in state.restore.blocks} if state.restore is not None else {}
            idle, give_up = [], time.monotonic() + LATE_PIN_S
            for block_id in seq.pinned_blocks:
                if held[block_id]:  # released when its I/O ends, as any
                    held[block_id] -= 1
                elif block_id in landing and not self._gets_ended(landing[block_id]):  # GETs may still write
                    self.late_pins.append((seq, landing.pop(block_id), give_up))
                else:  # no I/O in flight will release it
                    idle.append(block_id)
            self.scheduler.release_pins(seq, idle)
            for waiters in self.put_waiters.values():
                if state in waiters:
                    waiters.remove(state)
            self._forget(state)

    def _forget(self, state: TurnState) -> None:
        state.finished = True
        self.states.pop(state.seq.seq_id, None)
        self._swap_waits.pop(state.seq.seq_id, None)
        if self.host_swap is not None:
            self.host_swap.discard(state.seq.seq_id)

    def _fail_touched(self) -> None:
        """A failed step: abort the live turns it touched (every one when that is not known)."""
        self.steps_failed += 1
        touched, self._touched = self._touched, None
        for state in [s for s in self.states.values() if not s.finished and (touched is None or s.seq.seq_id in touched)]:
            try:
                self._abort(state, "INTERNAL", INTERNAL_MESSAGE)
            except Exception:  # a state too broken to clean: forget it at least
                logger.exception("aborting turn %s failed", state.turn.request_id)
                self._forget(state)

    def _fail_all(self, code: str, message: str) -> None:
        for state in list(self.states.values()):
            if state.finished:
                continue
            try:
                self._abort(state, code, message)
            except Exception:
                logger.exception("aborting turn %s failed", state.turn.request_id)
                self._forget(state)
        with self.lock:
            for turn in self._intake:
                turn.emit("error", code, message)
            self._intake.clear()

    # -- one forward
    def _step(self, out: SchedulerOutput) -> None:
        bt = self.layout.block_tokens
        runs, tables, sizes = [], [], len(out.scheduled)
        for s in out.scheduled:
            seq = s.seq
            ids = seq.token_ids[s.start:s.start + s.num_tokens]
            self._write_token_ids(seq, s.start, ids)
            runs.append(SeqRun(ids, s.start, seq.block_table))
            tables.append((seq.block_table.copy(), s.start + s.num_tokens))
            state = self.states[seq.seq_id]
            if not state.first_step_perf:
                self._store_found(state)
            state.scheduled(sizes)
        wait = self._layer_wait(out)
        start = time.perf_counter()
        slot = paced.step_ticket([(s.start, s.num_tokens) for s in out.scheduled])  # under a profile: the modeled GPU
        self._layer_waited = 0.0
        logits = self.runner.step(runs, self._between_layers(wait))  # [S, vocab]
        paced.wait(slot, stalled=self._layer_waited)  # a wait for restored layers stalls the modeled GPU too
        self.cost.add_step(time.perf_counter() - start, [(s.start, s.num_tokens, s.seq.kv_mark) for s in out.scheduled])
        dropped = self._settle_joined(wait)
        rows = [i for i, s in enumerate(out.scheduled) if s.samples and s.seq.seq_id not in dropped]
        sampled, logprobs = self._sample(logits, rows, [out.scheduled[i].seq for i in rows])
        by_seq = {out.scheduled[i].seq.seq_id: lp for i, lp in zip(rows, logprobs)}
        drawn = dict(zip(rows, sampled))  # a dropped row draws nothing: its seed's draws stay for its reply
        tokens = [drawn.get(i, 0) for i, s in enumerate(out.scheduled) if s.samples]
        finished = self.scheduler.postprocess(out, tokens)  # skips the dropped: no longer running
        self.steps += 1
        now = time.perf_counter()
        for s, (table, computed) in zip(out.scheduled, tables):
            state = self.states.get(s.seq.seq_id)
            if state is None or s.seq.seq_id in dropped:
                continue
            for index in s.filled_blocks:
                self._offload(state, index, table[index], bt)
            if s.samples and s.seq.status in (SequenceStatus.RUNNING, SequenceStatus.FINISHED):
                self._streamed(state, by_seq[s.seq.seq_id], now, finished)
        for seq in finished:
            state = self.states.get(seq.seq_id)
            if state is None:  # failed while streaming its last token (aborted: its blocks went then)
                continue
            table, computed = tables[[x.seq for x in out.scheduled].index(seq)]
            self._finish(state, table, computed)

    def _between_layers(self, wait: rs.LayerWait | None):
        """The forward's before_layer: the joined restores' layer waits, and at most every HOUSEKEEPING_S
        the work that need not wait for the step to end (_housekeeping)."""
        last = time.perf_counter()

        def before_layer(layer: int) -> None:
            nonlocal last
            if wait is not None:
                started = time.perf_counter()
                wait.before_layer(layer)
                self._layer_waited += time.perf_counter() - started
            now = time.perf_counter()
            if now - last >= HOUSEKEEPING_S:
                last = now
                self._housekeeping()
        return before_layer

    def _housekeeping(self) -> None:
        """Between two layers of a forward: new turns come in (a follow-up's blocks are allocated and its
        restore asked for at once, not a step later), ended PUTs release their blocks and their turns'
        records go out, ended restores wait for the next step in the ready queue.

        Safe inside a forward because none of it touches a block the step uses: it allocates free blocks
        only, and frees only blocks of sequences outside the step (finished, swapped out, restoring).
        Cancellations, joined restores and scheduling wait for the step's end.
        """
        touched, self._touched = self._touched, None  # what fails in here is not the step's
        with self.lock:
            new = list(self._intake)
            self._intake.clear()
        self._take_in(new)
        # only the PUTs something waits for: a finished turn's record, a swap-out's pins (a running
        # turn's own PUTs are read once per step, as before: reading them more often would only add
        # to its offload stall)
        self._poll_puts([b for b, (_, state, owner, _) in self.puts.items()
                         if owner is not None or state is None or state.finished_ns])
        self._poll_restores()
        self._charge_poll_cost()  # polled during a step: engine time the step waits for
        self._touched = touched

    def _write_token_ids(self, seq: Sequence, start: int, ids: list[int]) -> None:
        """The token ids of positions [start, start + len(ids)) into their blocks' rows of the pool."""
        bt, pos, done = self.layout.block_tokens, start, 0
        while done < len(ids):
            block, offset = seq.block_table[pos // bt], pos % bt
            n = min(bt - offset, len(ids) - done)
            self.pool.write_token_ids(block, offset, ids[done:done + n])
            pos, done = pos + n, done + n

    def _sample(self, logits: torch.Tensor, rows: list[int],
                seqs: list[Sequence]) -> tuple[list[int], list[TokenLogprobs | None]]:
        """The next token of each sampling row (and its logprobs when asked), every sequence by its own
        parameters (compute_node.sampling: the argmax alone when all are plain greedy)."""
        if not rows:
            return [], []
        picked = logits if len(rows) == logits.shape[0] else logits[rows]  # [n, vocab]; no copy when all sample
        return sample(picked, [self.states[seq.seq_id].sampler for seq in seqs])

    def _streamed(self, state: TurnState, logprobs: TokenLogprobs | None, now: float, finished: list[Sequence]) -> None:
        """Stream the token the sequence appended; a stop string it completed (or its grammar's end) ends
        the sequence now, as a stop token would (its blocks then go as any finished sequence's)."""
        seq = state.seq
        with self._only(state):
            why = state.token(seq.token_ids[-1], now, logprobs)
            if why is None:
                return
            if seq.is_finished:  # by length or a stop token in the same token: the stop string says why
                seq.finish_reason, seq.stop_reason = "stop", why
                return
            self.scheduler.stop(seq, why)
            finished.append(seq)

    # -- offload
    def _describe(self, state: TurnState, index: int, block_id: int, tokens: int) -> Block:
        seq, turn, bt = state.seq, state.turn, self.layout.block_tokens
        full = self.bm.hashes(seq, (index * bt + tokens) // bt)
        parent = full[index - 1] if index else b""
        salts = salts_of(seq.salt)
        name = full[index] if tokens == bt else block_hash(parent, seq.token_ids[index * bt:index * bt + tokens],
                                                           salts.private)
        return Block(block_id, index, tokens, name, parent, turn.tenant, turn.user_id, turn.context_id,
                     salts.is_shared(index, tokens == bt))

    def _store_found(self, state: TurnState) -> None:
        """Blocks a sequence found in the pool's prefix cache that no PUT of ours stored yet (another
        policy's turn computed them): store them now, so that its follow-ups can restore them."""
        seq, bt = state.seq, self.layout.block_tokens
        if not self.offloaders[state.turn.policy].offloads:
            return
        for index in range(seq.num_cached_tokens // bt):
            if (state.turn.policy, seq.block_hashes[index]) not in self.stored_names:
                self._offload(state, index, seq.block_table[index], bt)

    def _offload(self, state: TurnState, index: int, block_id: int, tokens: int, owner: Sequence | None = None) -> None:
        """Store block `index` of the turn's sequence (in pool block block_id) as its policy says; the
        time spent here is the turn's offload stall."""
        offloader = self.offloaders[state.turn.policy]
        if not offloader.offloads or index in state.storing:
            return
        start = time.perf_counter()
        block = self._describe(state, index, block_id, tokens)
        self._store_block(state, offloader, block, index, block_id, owner)
        state.offload.stall_s += time.perf_counter() - start

    def _store_block(self, state: TurnState, offloader, block: Block, index: int, block_id: int,
                     owner: Sequence | None) -> None:
        """Hand a described block to its policy's offloader, unless stored already or in flight for another turn."""
        if block.hash in state.stored:  # this block, with these tokens, is stored already
            return
        if block_id in self.stuck_puts:  # a PUT that outlived its timeout may still read it: no second one
            state.offload_failures += 1
            return
        if block_id in self.puts:  # another turn's PUT of this shared block is in flight: wait for it
            state.awaiting.add(block_id)  # (a second PUT would rewrite its descriptor under the first)
            self.put_waiters.setdefault(block_id, []).append(state)
            return
        put = offloader.store(block, state.offload)
        if put is None:  # stored already (cpu: synchronously)
            state.stored.add(block.hash)
            self._stored(state.turn.policy, block.hash)
            return
        self.bm.pin(block_id)
        state.storing[index] = block_id
        self.puts[block_id] = (put, state, owner, block.hash)

    def _poll_puts(self, blocks: list[int] | None = None) -> bool:
        """Release the blocks (default: all in flight) whose PUT ended (or timed out). Each ended PUT's
        bookkeeping is its turn's offload stall; reading the counters is shared by the turns whose PUTs
        were read (`_poll_cost`, charged when a step follows: a poll while the engine has nothing else
        to do stalls nothing)."""
        blocks = list(self.puts) if blocks is None else blocks
        if not blocks:
            return False
        start = time.perf_counter()
        words = self.pool.words
        rows = [(words[2 * c], words[2 * c + 1]) for c in (self.puts[b][0].counter for b in blocks)]
        now = time.monotonic()
        ended = [(b, s, e) for b, (s, e) in zip(blocks, rows)
                 if self.puts[b][0].ended(s, e) or now >= self.puts[b][0].deadline]
        share = (time.perf_counter() - start) / len(blocks)
        self._poll_cost = [(self.puts[b][1], share) for b in blocks if self.puts[b][1] is not None]
        for block_id, success, error in ended:
            start = time.perf_counter()
            put, state, owner, name = self.puts.pop(block_id)
            self._wake_waiters(block_id, name, put.stored(success, error))
            if put.ended(success, error):
                self.bm.unpin(block_id)
            else:  # the turn goes on without it, but the NIC may still read the block: it stays pinned
                logger.warning("block %d: PUT not done after %.0f s; the block stays out of use until it ends",
                               block_id, self.settings.drain_timeout_s)
                self.stats.totals["puts_timed_out"] += 1
                self.stuck_puts[block_id] = put
                self.bm.quarantine(block_id)
            if owner is not None:  # a swap-out's block: the scheduler held it too
                self.scheduler.release_pins(owner, [block_id])
            if state is not None:
                index = next(i for i, b in state.storing.items() if b == block_id)
                del state.storing[index]
                if put.stored(success, error):
                    state.stored.add(name)
                    self._stored(state.turn.policy, name)
                else:
                    state.offload_failures += 1
                state.offload.stall_s += time.perf_counter() - start
                self._maybe_record(state)
        return bool(ended)

    def _poll_stuck_puts(self) -> bool:
        """PUTs past their drain timeout whose counter moved at last: their blocks may be reused now."""
        if not self.stuck_puts:
            return False
        words = self.pool.words
        ended = [b for b, put in self.stuck_puts.items() if put.ended(words[2 * put.counter], words[2 * put.counter + 1])]
        for block_id in ended:
            del self.stuck_puts[block_id]
            self.bm.end_quarantine(block_id)
        return bool(ended)

    def _charge_poll_cost(self) -> None:
        """The last PUT poll's reading time, to the turns whose PUTs it read: a step waits for it."""
        for state, seconds in self._poll_cost:
            state.offload.stall_s += seconds
        self._poll_cost = []

    def _wake_waiters(self, block_id: int, name: bytes, stored: bool) -> None:
        """The turns that waited for another turn's PUT of this block: it ended."""
        for waiter in self.put_waiters.pop(block_id, []):
            waiter.awaiting.discard(block_id)
            if stored:
                waiter.stored.add(name)
            if not waiter.finished:
                self._maybe_record(waiter)

    def _stored(self, policy: str, name: bytes) -> None:
        """A block of this name is on the policy's storage (as far as this node knows: the agent's
        index, or the cpu store's, may have dropped it since)."""
        self.stored_names[(policy, name)] = None
        self.stored_names.move_to_end((policy, name))
        while len(self.stored_names) > MAX_STORED_NAMES:
            self.stored_names.popitem(last=False)

    def _swap_out(self, out: SchedulerOutput) -> None:
        """Store what each swap victim has not stored yet (its pins go once all of it is stored), or copy
        a swap-host victim's blocks into the host swap tier."""
        bt = self.layout.block_tokens
        for swap in out.swapped_out:
            start = time.perf_counter()
            state = self.states[swap.seq.seq_id]
            if swap.kind == "swap-host":
                self._swap_out_host(swap)
                state.preemptions += 1
                self.cost.swap_out_s += time.perf_counter() - start
                continue
            for index, block_id in enumerate(swap.block_ids):
                tokens = min(bt, swap.num_tokens - index * bt)
                if self._describe(state, index, block_id, tokens).hash in state.stored:
                    self.scheduler.release_pins(swap.seq, [block_id])
                elif index in state.storing:
                    put, st, _, name = self.puts[state.storing[index]]
                    self.puts[state.storing[index]] = (put, st, swap.seq, name)
                else:
                    self._offload(state, index, block_id, tokens, owner=swap.seq)
                    if index not in state.storing:  # stored synchronously, or not at all
                        self.scheduler.release_pins(swap.seq, [block_id])
            state.preemptions += 1
            self.cost.swap_out_s += time.perf_counter() - start

    def _swap_out_host(self, swap: SwapOut) -> None:
        """Copy the victim's blocks into the host tier now, before the step's forward writes any of them;
        recompute it instead when they do not fit, or when its KV is still landing (a joined restore)."""
        seq, store = swap.seq, self.host_swap
        if store is None:
            raise RuntimeError("a swap-host preemption without the host swap tier")
        if seq.seq_id in self.joined:  # later layer groups may not be there: never keep doubtful KV
            store.fallback()
            self.scheduler.swap_failed(seq)
        elif store.swap_out(seq.seq_id, swap.block_ids) is None:  # the tier is full (counted there)
            self.scheduler.swap_failed(seq)

    def _swap_in(self, request: RestoreRequest) -> None:
        """Copy a swap-host sequence's blocks back from the host tier into the blocks its restore got; what
        did not come back (a missing or doubtful copy) is prefilled again."""
        start = time.perf_counter()
        seq = request.seq
        got = self.host_swap.swap_in(seq.seq_id, seq.token_ids, request.first_token, request.num_tokens,
                                     request.block_indexes, request.block_ids)
        if got.reason:
            logger.warning("sequence %s: swap-in stopped at token %d of %d (%s); the rest is prefilled again",
                           seq.seq_id, got.covered, request.num_tokens, got.reason)
        self.scheduler.restore_done(seq, got.covered)
        self.cost.swap_in_s += time.perf_counter() - start

    def _drop_unused_copies(self) -> None:
        """Host copies of sequences that are no longer swapped out (found their KV in the prefix cache, fell
        back to recompute, ended): they will never be copied back."""
        for seq_id in list(self.host_swap.swapped):
            state = self.states.get(seq_id)
            if state is None or state.seq.status is not SequenceStatus.SWAPPED:
                self.host_swap.discard(seq_id)

    # -- restores
    def _start_restore(self, state: TurnState, request: RestoreRequest) -> None:
        """Ask for the blocks storage must fill (the agent, on the turn's stream; or the cpu store)."""
        seq, bt, groups = request.seq, self.layout.block_tokens, self.layout.layer_groups
        blocks = []
        for index, block_id in zip(request.block_indexes, request.block_ids):
            tokens = min(bt, request.num_tokens - index * bt)
            described = self._describe(state, index, block_id, tokens)
            counters = tuple(self.layout.get_done(block_id, g) for g in range(groups))
            blocks.append(rs.BlockRestore(index, block_id, described.hash, tokens, counters,
                                          tuple(self.pool.read_counter(c) for c in counters)))
        pending = rs.PendingRestore(blocks, request.first_token, request.num_tokens, time.time_ns(),
                                    time.monotonic() + self.settings.restore_timeout_s)
        state.restore = pending
        if seq.num_preempted_tokens:  # a swapped sequence comes back from storage: preemption work
            self._swap_waits[seq.seq_id] = time.perf_counter()
        if state.turn.policy == "cpu" and self.cpu_store is not None:
            self.cpu_store.restore(self.pool, seq, pending)  # synchronous: the CPU-centric cost
        else:
            salts = salts_of(seq.salt)
            state.turn.emit("restore", [RestoreBlockEvent(b.block_id, b.hash, b.token_count, b.index,
                                                          salts.is_shared(b.index, b.token_count == bt))
                                        for b in blocks], groups)
        self.restores[seq.seq_id] = state

    def _poll_restores(self) -> bool:
        done = False
        now = time.monotonic()
        for seq_id, state in list(self.restores.items()):
            with self._only(state):
                done |= self._poll_restore(seq_id, state, now)
        return done

    def _poll_restore(self, seq_id: int, state: TurnState, now: float) -> bool:
        """One restore outside the batch: joins, is decided, or waits (whether something happened)."""
        pending, seq = state.restore, state.seq
        rows = self.pool.counters[np.asarray(pending.counters, dtype=np.intp)]
        if not pending.landed_ns and bool(pending.landed(rows).any()):
            pending.landed_ns = time.time_ns()
        complete = pending.complete(rows)
        if not complete and now < pending.deadline:
            if not pending.whole and pending.landed(rows)[:, 0].all():
                return self._join(state, rows)
            return False
        del self.restores[seq_id]
        outcome = rs.decide(pending, self.pool.read_counter, self._restored_ids, seq.token_ids)
        state.restored(outcome, self.layout.chunk_payload_bytes)
        for block in pending.blocks[:outcome.blocks_ok]:  # they came from storage: stored there
            state.stored.add(block.hash)
            self._stored(state.turn.policy, block.hash)
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
        del self.restores[seq.seq_id]
        self.joined[seq.seq_id] = state
        for block in pending.blocks:  # stored: a swap-out never stores them again, whatever lands here
            state.stored.add(block.hash)
        self._swap_waited(seq)
        self.scheduler.restore_joined(seq, outcome.covered)
        return True

    def _swap_waited(self, seq: Sequence) -> None:
        """A swapped sequence's restore from storage ended (or it may join the batch): its wait is over."""
        started = self._swap_waits.pop(seq.seq_id, None)
        if started is not None:
            self.cost.swap_wait_s += restore_wait(started, time.perf_counter())

    def _poll_joined(self) -> bool:
        """Joined restores between steps: landed whole (done), or failed (back to waiting outside the batch)."""
        done = False
        now = time.monotonic()
        for state in list(self.joined.values()):
            with self._only(state):
                pending = state.restore
                rows = self.pool.counters[np.asarray(pending.counters, dtype=np.intp)]
                if pending.errors(rows).any() or (now >= pending.deadline and not pending.complete(rows)):
                    self._unjoin(state, "a layer group failed or had not landed by the deadline")
                    done = True
                elif pending.complete(rows):
                    self._landed(state)
                    done = True
        return done

    def _layer_wait(self, out: SchedulerOutput) -> rs.LayerWait | None:
        """The forward's wait for the layer groups still landing of the joined sequences in this step."""
        joined = {s.seq.seq_id: self.joined[s.seq.seq_id].restore for s in out.scheduled if s.seq.seq_id in self.joined}
        if not joined:
            return None
        groups = [self.layout.group_layers(g) for g in range(self.layout.layer_groups)]
        return rs.LayerWait(joined, groups, lambda counters: self.pool.counters[np.asarray(counters, dtype=np.intp)],
                            self.settings.restore_layer_wait_s)

    def _settle_joined(self, wait: rs.LayerWait | None) -> set[int]:
        """After a forward: its joined sequences landed whole, or leave the batch (their output unused)."""
        if wait is None:
            return set()
        self.stats.totals["restore_layer_waits"] += wait.waits
        self.stats.totals["restore_layer_wait_us"] += int(wait.waited_s * 1e6)
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
            self._stored(state.turn.policy, block.hash)
        self.scheduler.restore_done(state.seq, outcome.covered)

    def _unjoin(self, state: TurnState, reason: str) -> None:
        """A joined restore that did not land whole: the sequence waits outside the batch until every
        counter moved (or the deadline), then keeps the blocks before the first that failed."""
        del self.joined[state.seq.seq_id]
        state.restore.whole = True
        logger.warning("turn %s leaves the batch until its restore ends: %s", state.turn.request_id, reason,
                       extra={"request_id": state.turn.request_id})
        self.scheduler.unjoin(state.seq)
        self.restores[state.seq.seq_id] = state

    def _drop_joined(self, seqs) -> None:
        """Preempted sequences that were still landing: their restore's pins wait for the GETs to end."""
        for seq in seqs:
            state = self.joined.pop(seq.seq_id, None)
            if state is not None:
                self._late_pin(seq, state.restore)

    def _late_pin(self, seq: Sequence, pending: rs.PendingRestore) -> None:
        """Blocks of the restore the sequence still pins (its blocks released) stay out of use until their
        GETs ended (or LATE_PIN_S passed): a late GET must never write into a block someone else uses."""
        give_up = time.monotonic() + LATE_PIN_S
        pinned = list(seq.pinned_blocks)
        for block in pending.blocks:
            if block.block_id in pinned:
                pinned.remove(block.block_id)
                self.late_pins.append((seq, block, give_up))

    def _poll_late_pins(self) -> bool:
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

    # -- the end of a turn
    def _finish(self, state: TurnState, table: list[int], computed: int) -> None:
        """Store the partial last block, release the KV (step 4), send the record once stored."""
        bt = self.layout.block_tokens
        state.finish(time.time_ns())
        tail = computed % bt
        if tail and self.offloaders[state.turn.policy].offloads:
            self._offload(state, computed // bt, table[computed // bt], tail)
        if self.offloaders[state.turn.policy].offloads:
            self.bm.forget(table)  # the KV left compute memory: a follow-up restores it (step 4)
        self._remember(state.turn.context, computed)
        self._maybe_record(state)

    def _maybe_record(self, state: TurnState) -> None:
        if not state.finished_ns or state.storing or state.awaiting or state.recorded or state.aborted:
            return
        rec = state.record(self.policy_name(state), time.time_ns())
        if self.setup_span is not None:
            rec.steps.insert(0, self.setup_span)
            self.setup_span = None
        with self.lock:
            self.stats.add(rec)
        state.recorded = True
        state.turn.emit("record", rec)
        self._forget(state)

    @staticmethod
    def policy_name(state: TurnState) -> str:
        return state.turn.policy

    def _remember(self, context: tuple[str, str], tokens: int) -> None:
        self.known[context] = tokens
        self.known.move_to_end(context)
        while len(self.known) > MAX_KNOWN_CONTEXTS:
            self.known.popitem(last=False)

