"""The engine: one thread that takes turns from a bounded queue, gives each a slot, runs it.

Service threads call submit() and reserve(); everything that touches the model or a
slot's KV happens on the engine thread. The lock guards the slot manager, the queue and
the statistics.
"""
from __future__ import annotations

import collections
import logging
import threading
import time

from hostmem.counters import wait_counter
from compute_node.kv_pool import KvPool
from compute_node.offload import NoOffload, TriggeredOffload, settle_tail
from compute_node.runner import TurnRunner
from compute_node.settings import ComputeSettings
from compute_node.slots import Acquired, QueueFull, SlotManager, WaitQueue
from compute_node.turn import RestoreTicket, StepSpan, Turn
from kvtb.steps import Step

logger = logging.getLogger(__name__)

MAX_KNOWN_CONTEXTS = 100_000


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
    """Owns the model, the pool and the slots. Thread-safe entry points: submit, reserve, stats."""

    def __init__(self, settings: ComputeSettings, model, tokenizer, pool: KvPool, *,
                 agent=None, cpu_store=None, setup_span: StepSpan | None = None):
        self.settings = settings
        self.model, self.tokenizer, self.pool = model, tokenizer, pool
        self.agent, self.cpu_store = agent, cpu_store
        self.stop_token_ids = {tokenizer.eos_token_id} - {None}
        self.vocab_size = model.config.vocab_size
        self.slots = SlotManager(pool.layout.num_slots)
        self.queue: WaitQueue[Turn] = WaitQueue(settings.queue_bound)
        self.stats = Stats()
        self.lock = threading.Condition()
        self.known: collections.OrderedDict[tuple[str, str], int] = collections.OrderedDict()
        self.setup_span = setup_span
        self._offloaders = {"resident": NoOffload(), "recompute": NoOffload()}
        if agent is not None:
            self._offloaders["triggered"] = TriggeredOffload(pool, agent)
        if cpu_store is not None:
            from compute_node.cpu_offload import CpuOffload
            self._offloaders["cpu"] = CpuOffload(pool, cpu_store)
        self.runner = TurnRunner(self)
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)

    def start(self) -> "Engine":
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        with self.lock:
            self._stopping = True
            for turn in self.queue.items():
                turn.emit("error", "UNAVAILABLE", "the compute node is shutting down")
            self.lock.notify_all()
        self._thread.join(timeout_s)

    # -- called from service threads
    def policies(self) -> list[str]:
        return sorted(self._offloaders)

    def offloader(self, policy: str):
        return self._offloaders[policy]

    def submit(self, turn: Turn) -> None:
        """Queue a turn (raises QueueFull past the bound)."""
        with self.lock:
            if self._stopping:
                raise QueueFull("the compute node is shutting down")
            self.queue.push(turn)
            self.lock.notify_all()

    def withdraw(self, turn: Turn) -> None:
        with self.lock:
            self.queue.remove(turn)

    def reserve(self, user_id: str, context_id: str, lease_s: float) -> tuple[Acquired | None, bool]:
        """A slot for the agent's prefetch: (acquired or None, whether the context is resident)."""
        context = (user_id, context_id)
        with self.lock:
            self._poll()
            if self.slots.resident_slot(context) is not None:
                return Acquired(self.slots.resident_slot(context), "resident"), True
            got = self.slots.reserve(context, time.monotonic(), lease_s or self.settings.lease_s)
            self.lock.notify_all()
            return got, False

    def snapshot(self) -> dict:
        with self.lock:
            return {"turns": self.stats.turns, "slots_in_use": self.slots.in_use,
                    "queue_length": len(self.queue), "kv_source": dict(self.stats.kv_source),
                    "fallbacks": dict(self.stats.fallbacks), **self.stats.totals}

    # -- context memory (engine thread)
    def remember(self, context: tuple[str, str], tokens: int) -> None:
        self.known[context] = tokens
        self.known.move_to_end(context)
        while len(self.known) > MAX_KNOWN_CONTEXTS:
            self.known.popitem(last=False)

    def resident_tokens(self, context: tuple[str, str]) -> int:
        return self.known.get(context, 0)

    def ask_restore(self, turn: Turn, slot: int) -> RestoreTicket | None:
        """Ask the agent to restore the context into slot (no prefetch was started)."""
        try:
            info = self.agent.restore(turn.user_id, turn.context_id, slot, turn.token_ids.tolist())
        except Exception as exc:  # noqa: BLE001 - no restore: the turn recomputes
            logger.info("agent Restore for %s/%s failed: %s", turn.user_id, turn.context_id, exc)
            return None
        if not info.chunks:
            return None
        return RestoreTicket(info.slot, info.tokens_announced, info.chunks, info.completion_counter,
                             info.threshold, info.error_base, info.bytes, info.started_unix_s)

    # -- the engine thread
    def _poll(self) -> None:
        """Leases of reservations whose turn already waits here do not expire."""
        claimed = frozenset((t.reserved_slot, t.context) for t in self.queue.items() if t.restore is not None)
        self.slots.poll(time.monotonic(), self.pool.counter_total, claimed)

    def _next(self) -> tuple[Turn, Acquired] | None:
        with self.lock:
            while not self._stopping:
                self._poll()
                turn = self.queue.take_first(
                    lambda t: t.cancelled.is_set() or self.slots.can_acquire(t.context, t.reserved_slot))
                if turn is not None and turn.cancelled.is_set():
                    continue
                if turn is not None:
                    got = self.slots.acquire(turn.context, time.monotonic(), turn.reserved_slot)
                    return turn, got
                waiting = len(self.queue) or self.slots.count("draining") or self.slots.count("reserved")
                self.lock.wait(0.002 if waiting else 0.5)
            return None

    def _loop(self) -> None:
        while (item := self._next()) is not None:
            turn, got = item
            try:
                self._run(turn, got)
            except Exception as exc:  # noqa: BLE001 - one bad turn never stops the node
                logger.exception("turn %s failed", turn.request_id)
                self._disarm(got.slot)
                with self.lock:
                    self.slots.release(got.slot, time.monotonic())
                turn.emit("error", "INTERNAL", f"the turn failed on the compute node: {exc}")

    def _disarm(self, slot: int) -> None:
        """Drop PUTs a failed turn left queued, so they never fire for the slot's next context."""
        if self.agent is None:
            return
        try:
            self.agent.cancel(self.pool.layout.token_counter(slot))
        except Exception as exc:  # noqa: BLE001
            logger.warning("cancelling slot %d's PUTs failed: %s", slot, exc)

    def _run(self, turn: Turn, got: Acquired) -> None:
        queue_ms = (time.perf_counter() - turn.arrived_perf) * 1e3
        follow_up = turn.context in self.known or turn.restore is not None
        rec, off, reuse = self.runner.run(turn, got.slot, got.how, follow_up, queue_ms)
        if reuse.quarantine is not None:
            self._quarantine(turn, got.slot, reuse)
            return
        self._finish(turn, got.slot, rec, off)

    def _quarantine(self, turn: Turn, slot: int, reuse) -> None:
        """A restore that timed out may still write into the slot: drain it, rerun elsewhere."""
        counter, threshold = reuse.quarantine
        logger.warning("turn %s: %s; slot %d quarantined", turn.request_id, reuse.reason, slot)
        with self.lock:
            self.slots.drain(slot, time.monotonic(), counter, threshold, 300.0, "late restore")
            turn.fallback = reuse
            turn.restore = None
            self.queue.push_front(turn)  # runs again first, in another slot, recomputing
            self.lock.notify_all()

    def _finish(self, turn: Turn, slot: int, rec, off) -> None:
        """Step 4: give the slot back (after its offload drained), then send the record."""
        start_ns = time.time_ns()
        now = time.monotonic
        if turn.fallback is not None:
            rec.steps.insert(0, turn.fallback.step7)
        drained = True
        if turn.policy == "triggered" and off is not None and off.drain_counter >= 0:
            settle_tail(off)
            rec.chunks_offloaded = off.chunks
            drained = wait_counter(lambda: self.pool.counter_total(off.drain_counter),
                                      off.drain_target, self.settings.drain_timeout_s)
        with self.lock:
            if turn.policy == "resident":
                self.slots.finish(slot, now(), keep_resident=True)
            elif drained:
                self.slots.release(slot, now())
            else:
                logger.warning("slot %d: offload not drained after %.0f s", slot, self.settings.drain_timeout_s)
                self.slots.drain(slot, now(), off.drain_counter, off.drain_target, 300.0, "offload")
            if turn.policy != "resident":
                self.slots.drop_context(turn.context, now())
            self.lock.notify_all()
        if turn.policy != "resident":
            rec.steps.append(StepSpan(Step.RELEASE, start_ns, time.time_ns(), rec.bytes_offloaded))
        if self.setup_span is not None:
            rec.steps.insert(0, self.setup_span)
            self.setup_span = None
        rec.engine_ms = (time.perf_counter() - turn.arrived_perf) * 1e3
        with self.lock:
            self.stats.add(rec)
        turn.emit("record", rec)
