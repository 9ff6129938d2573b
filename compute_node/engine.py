"""The batching engine: one thread that steps every running sequence at once over the paged pool.

Each loop: take new turns in, see which PUTs and restores have landed (by reading counters in
the region: no RPC), ask the scheduler for the next step, run one forward over every scheduled
sequence (decode tokens and prefill chunks together), sample (every sequence by its own sampling
parameters, in one batched pass: compute_node.sampling), stream the tokens (a stop string or the
end of a structured reply's grammar finishes its sequence there, as a stop token would), and store
each block that filled as the turn's policy says. Between layers, every few ms, the forward also
takes new turns in and settles ended PUTs and restores (_housekeeping), so that a follow-up's restore
starts and a finished turn's record leaves without waiting for the step to end.

The engine is the step loop and the turns' lives; the I/O in flight lives in three rooms, each owning
its state and answering for the pins of an aborted turn (`release`):

- compute_node.offload_tracker: PUTs in flight, their waiters, stuck PUTs, stored names, poll cost
  (the triggered stores themselves, descriptors, triggers and doorbell, on compute_node.offload_thread's);
- compute_node.restore_tracker: restores outside the batch (the scheduler's restoring set), joined
  restores whose later layer groups still land (compute_node.restore: join, LayerWait), late pins;
- compute_node.preemption: swap-outs and swap-ins (the host swap tier), and their cost.

Service threads only call submit() and snapshot().
"""
from __future__ import annotations

import collections
import contextlib
import logging
import secrets
import threading
import time

import torch

from compute_node import restore as rs
from compute_node.block_manager import BlockManager
from compute_node.chat_template import TokenPieces
from compute_node.model_loader import generation_defaults
from compute_node.model_runner import ModelRunner, SeqRun
from compute_node.offload_thread import OffloadThread
from compute_node.offload_tracker import OffloadTracker
from compute_node.preemption import Preemption
from compute_node.preemption_cost import PreemptionCost
from compute_node.restore_tracker import RestoreTracker
from compute_node.sampling import SequenceSampler, TokenLogprobs, sample
from compute_node.scheduler import NeverFits, QueueFull, Scheduler, SchedulerOutput
from compute_node.sequence import Sequence, SequenceStatus
from compute_node.settings import ComputeSettings
from compute_node.step_budget import StepBudget
from compute_node.turn import StepSpan, Turn
from compute_node.turn_state import TurnState
from hostmem.block_hash import Salts
from scale import paced

logger = logging.getLogger(__name__)

MAX_KNOWN_CONTEXTS = 100_000
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
        self.states: dict[int, TurnState] = {}
        self._touched: set[int] | None = None  # seq ids the work under way touches (None: every live turn)
        self.steps_failed = 0
        self.known: collections.OrderedDict[tuple[str, str], int] = collections.OrderedDict()
        self.stats = Stats()
        self.offloads = OffloadTracker(settings, self.layout, pool, self.bm, self.scheduler, offloaders,
                                       self.stats.totals, lambda state: self._maybe_record(state),
                                       OffloadThread(settings.offload_thread_cpus, nap_us=settings.offload_thread_nap_us)
                                       if settings.offload_thread else None)
        cost = PreemptionCost()  # the engine's own time in preemption work
        self.restores = RestoreTracker(settings, self.layout, pool, self.scheduler, self.offloads, self.states,
                                       cost, self.stats.totals, self._only, cpu_store)
        self.preemption = Preemption(settings, self.layout, pool, self.scheduler, self.offloads,
                                     self.restores.joined, cost)
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
        self.offloads.close()

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
                    "num_requests_restoring": len(sched.restoring), "restores_landing": len(self.restores.joined),
                    "kv_cache_usage_perc": bm.usage,
                    "preemptions": dict(sched.stats.preemptions), "preempted_tokens": dict(sched.stats.preempted_tokens),
                    "prefix_cache_queries": bm.prefix_cache_queries, "prefix_cache_hits": bm.prefix_cache_hits,
                    "kv_source": dict(self.stats.kv_source), "fallbacks": dict(self.stats.fallbacks),
                    "steps": self.steps, "steps_failed": self.steps_failed,
                    "puts_timed_out": self.stats.totals["puts_timed_out"], "blocks_quarantined": len(self.offloads.stuck_puts),
                    **self.stats.totals, **self.preemption.snapshot()}

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
                busy = bool(self.restores) or bool(self.offloads)
                self.lock.wait(idle_sleep if busy else 0.5)
            idle_sleep = min(idle_sleep * 2, 1e-3)
        self._fail_all("UNAVAILABLE", "the compute node is shutting down")

    def _iterate(self, new: list[Turn]) -> bool:
        """One turn of the loop; whether it did anything. What a failure fails: the turn being taken in or
        polled, the step's sequences once scheduled, every live turn otherwise (`_touched`)."""
        self._touched = None
        self._take_in(new)
        self._drop_cancelled()
        self.offloads.forget_poll_cost()
        progressed = self.offloads.poll() | self.restores.poll() | self.restores.poll_joined()
        progressed |= self.restores.poll_late_pins() | self.offloads.poll_stuck()
        out = self.scheduler.schedule()
        self._touched = {s.seq.seq_id for s in out.scheduled} | {seq.seq_id for seq, _ in out.preempted} \
            | {r.seq.seq_id for r in out.restores} | {seq.seq_id for seq in out.admitted}
        self.preemption.swap_out(out, self.states)
        self.restores.drop_joined([seq for seq, _ in out.preempted])
        for request in out.restores:
            if self.preemption.swaps_in(request):
                self.preemption.swap_in(request)
            else:
                self.restores.start(self.states[request.seq.seq_id], request)
        touched, self._touched = self._touched, None  # not the step's
        self.preemption.drop_unused_copies(self.states)
        self._touched = touched
        if out.is_empty:
            return progressed or bool(new)
        self.offloads.charge_poll_cost()
        started = time.perf_counter()
        self._step(out)
        if self.step_budget is not None:  # the time the scheduler's step cap learns from (restore waits excluded),
            # in the users' seconds: virtual under a profile (a paced step's wall time is D times the modeled GPU's)
            self.step_budget.observe([(s.start, s.num_tokens) for s in out.scheduled],
                                     paced.virtual_s(max(0.0, time.perf_counter() - started - self._layer_waited)))
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
                    self.restores.start(state, request)
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
        finally:  # each room keeps the pins its I/O in flight will release; the rest go now
            idle = self.restores.release(state, self.offloads.release(state))
            self.scheduler.release_pins(seq, idle)
            self._forget(state)

    def _forget(self, state: TurnState) -> None:
        state.finished = True
        self.states.pop(state.seq.seq_id, None)
        self.restores.forget(state.seq.seq_id)
        self.preemption.forget(state.seq.seq_id)

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
        runs, tables, sizes = [], [], len(out.scheduled)
        for s in out.scheduled:
            seq = s.seq
            ids = seq.token_ids[s.start:s.start + s.num_tokens]
            self.pool.write_token_ids(seq.block_table, s.start, ids)
            runs.append(SeqRun(ids, s.start, seq.block_table))
            tables.append((seq.block_table.copy(), s.start + s.num_tokens))
            state = self.states[seq.seq_id]
            if not state.first_step_perf:
                self.offloads.store_found(state)
            state.scheduled(sizes)
        wait = self.restores.layer_wait(out)
        start = time.perf_counter()
        slot = paced.step_ticket([(s.start, s.num_tokens) for s in out.scheduled])  # under a profile: the modeled GPU
        self._layer_waited = 0.0
        logits = self.runner.step(runs, self._between_layers(wait))  # [S, vocab]
        paced.wait(slot, stalled=self._layer_waited)  # a wait for restored layers stalls the modeled GPU too
        self.preemption.cost.add_step(time.perf_counter() - start, [(s.start, s.num_tokens, s.seq.kv_mark) for s in out.scheduled])
        dropped = self.restores.settle_joined(wait)
        rows = [i for i, s in enumerate(out.scheduled) if s.samples and s.seq.seq_id not in dropped]
        sampled, logprobs = self._sample(logits, rows, [out.scheduled[i].seq for i in rows])
        by_seq = {out.scheduled[i].seq.seq_id: lp for i, lp in zip(rows, logprobs)}
        drawn = dict(zip(rows, sampled))  # a dropped row draws nothing: its seed's draws stay for its reply
        tokens = [drawn.get(i, 0) for i, s in enumerate(out.scheduled) if s.samples]
        finished = self.scheduler.postprocess(out, tokens)  # skips the dropped: no longer running
        self.steps += 1
        now = time.perf_counter()
        live = [(s, table, self.states.get(s.seq.seq_id)) for s, (table, _) in zip(out.scheduled, tables)]
        live = [(s, table, state) for s, table, state in live if state is not None and s.seq.seq_id not in dropped]
        filled = [(state, index, table[index]) for s, table, state in live for index in s.filled_blocks]
        if filled:  # the step's full blocks leave as one batch (one doorbell)
            self.offloads.offload_filled(filled)
        for s, _, state in live:
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
        self.offloads.poll(self.offloads.waited_for())
        self.restores.poll()
        self.offloads.charge_poll_cost()  # polled during a step: engine time the step waits for
        self._touched = touched

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

    # -- the end of a turn
    def _finish(self, state: TurnState, table: list[int], computed: int) -> None:
        """Store the partial last block, release the KV (step 4), send the record once stored."""
        bt = self.layout.block_tokens
        state.finish(time.time_ns())
        tail = computed % bt
        if tail and self.offloads.offloads(state):
            self.offloads.offload(state, computed // bt, table[computed // bt], tail)
        if self.offloads.offloads(state):
            self.bm.forget(table)  # the KV left compute memory: a follow-up restores it (step 4)
        self._remember(state.turn.context, computed)
        self._maybe_record(state)

    def _maybe_record(self, state: TurnState) -> None:
        if not state.finished_ns or state.storing or state.awaiting or state.recorded or state.aborted:
            return
        rec = state.record(state.turn.policy, time.time_ns())
        if self.setup_span is not None:
            rec.steps.insert(0, self.setup_span)
            self.setup_span = None
        with self.lock:
            self.stats.add(rec)
        state.recorded = True
        state.turn.emit("record", rec)
        self._forget(state)

    def _remember(self, context: tuple[str, str], tokens: int) -> None:
        self.known[context] = tokens
        self.known.move_to_end(context)
        while len(self.known) > MAX_KNOWN_CONTEXTS:
            self.known.popitem(last=False)

