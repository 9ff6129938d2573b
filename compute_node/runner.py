"""One turn on the model: restore or reuse, prefill only what is not covered, decode, offload.

Runs on the engine thread only. The slot was acquired by the engine; this module decides
where the turn's KV comes from, streams tokens, and says how the slot is to be given back.
"""
from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np
import torch

from compute_node import restore as rs
from hostmem.counters import wait_counter
from compute_node.chat_template import StreamDecoder
from compute_node.offload import OffloadTurn
from compute_node.sampling import Sampler
from compute_node.slot_cache import SlotCache
from compute_node.turn import StepSpan, Turn, TurnRecordData
from kvtb.steps import Step

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Reuse:
    """Where the turn's prefix KV comes from."""

    covered: int = 0
    kv_source: str = "none"
    reason: str = ""
    bytes_restored: int = 0
    step7: StepSpan | None = None
    quarantine: tuple[int, int] | None = None  # (counter, threshold) a late restore still writes


class TurnRunner:
    """Runs turns on one model and pool; holds no per-turn state between turns."""

    def __init__(self, engine):
        self.e = engine
        self.pool = engine.pool
        self.model = engine.model

    @torch.inference_mode()
    def forward(self, cache: SlotCache, ids) -> torch.Tensor:
        """Logits [vocab] of the last of ids, after writing their KV into the slot."""
        x = torch.as_tensor(np.asarray(ids, dtype=np.int64)).unsqueeze(0)  # [1, n]
        return self.model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1]

    # -- where the prefix comes from
    def reuse(self, turn: Turn, slot: int, how: str, follow_up: bool) -> Reuse:
        policy, ids = turn.policy, turn.token_ids
        if turn.fallback is not None:
            return Reuse(0, "recomputed", turn.fallback.reason)
        if turn.restore is not None:
            if how == "reserved":
                return self._wait_restore(turn, slot)
            return Reuse(0, "recomputed", "reservation expired: the reserved slot's lease expired before the turn arrived")
        if how == "resident":
            covered = rs.matching_prefix(self.pool.token_ids[slot, :self.e.resident_tokens(turn.context)], ids)
            covered = min(covered, len(ids) - 1)
            if policy == "recompute":
                return Reuse(0, "recomputed")
            if covered:
                return Reuse(covered, "resident")
            return Reuse(0, "recomputed", "resident KV differs: the resident KV does not match the conversation")
        if policy == "triggered" and self.e.agent is not None:
            ticket = self.e.ask_restore(turn, slot)
            if ticket is not None:
                turn.restore = ticket
                return self._wait_restore(turn, slot)
        if policy == "cpu" and self.e.cpu_store is not None:
            start_ns = time.time_ns()
            outcome = self.e.cpu_store.restore(self.pool, slot, turn.user_id, turn.context_id, ids)
            if outcome is not None:
                span = StepSpan(Step.RESTORE, start_ns, time.time_ns(), outcome.bytes_restored)
                return self._from_outcome(outcome, span)
        if not follow_up:
            return Reuse(0, "none")
        if policy == "recompute":
            return Reuse(0, "recomputed")
        if policy == "resident":
            return Reuse(0, "recomputed", "evicted: the context's KV was evicted from the resident pool")
        return Reuse(0, "recomputed", "no stored KV: neither the agent nor this node has chunks of this context")

    def _wait_restore(self, turn: Turn, slot: int) -> Reuse:
        t = turn.restore
        start_ns = int(t.started_unix_s * 1e9) if t.started_unix_s else time.time_ns()
        timeout = self.e.settings.restore_timeout_s
        counter = t.completion_counter
        done = wait_counter(lambda: self.pool.counter_total(counter), t.threshold, timeout)
        if not done:
            outcome = rs.timed_out(t.tokens_announced, timeout)
            span = StepSpan(Step.RESTORE, start_ns, time.time_ns(), 0)
            reuse = self._from_outcome(outcome, span)
            reuse.quarantine = (counter, t.threshold)
            return reuse
        errors = self.pool.read_counter(counter)[1] - t.error_base
        outcome = rs.decide(t.tokens_announced, errors, self.pool.token_ids[slot, :t.tokens_announced],
                            turn.token_ids, t.bytes)
        return self._from_outcome(outcome, StepSpan(Step.RESTORE, start_ns, time.time_ns(),
                                                    outcome.bytes_restored))

    @staticmethod
    def _from_outcome(outcome: rs.RestoreOutcome, span: StepSpan) -> Reuse:
        if outcome.covered and not outcome.reason:
            return Reuse(outcome.covered, "restored", "", outcome.bytes_restored, span)
        reason = outcome.reason or "restore covered nothing: the restore covered no token of the conversation"
        return Reuse(outcome.covered, "recomputed", reason, outcome.bytes_restored, span)

    # -- the turn
    def run(self, turn: Turn, slot: int, how: str, follow_up: bool, queue_ms: float) -> tuple[TurnRecordData, OffloadTurn, Reuse]:
        """Run the turn in slot; stream its tokens; return its record, its offload and its reuse."""
        e, ids = self.e, turn.token_ids
        rec = TurnRecordData(turn.request_id, turn.context_id, turn.policy, queue_ms=queue_ms, slot=slot)
        reuse = self.reuse(turn, slot, how, follow_up)
        if reuse.quarantine is not None:
            return rec, None, reuse  # the engine moves the turn to another slot
        if reuse.step7 is not None:
            rec.steps.append(reuse.step7)
        covered = reuse.covered
        rec.kv_source, rec.fallback_reason = reuse.kv_source, reuse.reason
        rec.bytes_restored, rec.tokens_reused = reuse.bytes_restored, covered
        rec.tokens_prefilled = len(ids) - covered

        cache = SlotCache(self.pool.slot_kv(slot), length=covered)
        self.pool.write_token_ids(slot, covered, ids[covered:])
        room = self.pool.layout.max_tokens - len(ids)
        max_new = min(turn.max_new_tokens, room + 1)
        off = OffloadTurn(slot, turn.user_id, turn.context_id,
                          first_chunk=(covered if reuse.kv_source == "restored" else 0) // self.pool.layout.chunk_tokens,
                          capacity_tokens=len(ids) + max_new - 1)
        offloader = e.offloader(turn.policy)
        offloader.begin(off, covered)
        sampler, decoder = Sampler(turn.sampling), StreamDecoder(e.tokenizer)
        infer_start = time.time_ns()
        logits = self.forward(cache, ids[covered:])
        out: list[int] = []
        token_times: list[float] = []
        finish = "length"
        while True:
            tok = sampler(logits)
            out.append(tok)
            token_times.append(time.perf_counter())
            turn.emit("token", tok, decoder.push(tok))
            if len(out) == 1:
                offloader.arm(off)
                offloader.on_tokens(off, cache.length)
            if tok in e.stop_token_ids and not turn.ignore_eos:
                finish = "stop"
                break
            if len(out) >= max_new or turn.cancelled.is_set():
                break
            self.pool.write_token_ids(slot, cache.length, [tok])
            logits = self.forward(cache, [tok])
            offloader.on_tokens(off, cache.length)
        infer_end = time.time_ns()
        offloader.end(off, cache.length)
        if turn.cancelled.is_set():
            finish = "cancelled"
        rec.finish_reason = finish
        rec.output_token_ids = out
        rec.tokens_out = len(out)
        rec.ttft_ms = (token_times[0] - turn.arrived_perf) * 1e3
        gaps = np.diff(token_times)
        rec.tbt_ms = float(gaps.mean() * 1e3) if gaps.size else 0.0
        rec.bytes_offloaded = off.bytes
        rec.chunks_offloaded = off.chunks
        rec.offload_stall_ms = off.stall_s * 1e3
        step = Step.INFERENCE if rec.kv_source == "none" else Step.FOLLOW_UP
        rec.steps.append(StepSpan(step, infer_start, infer_end, off.bytes))
        e.remember(turn.context, cache.length)
        return rec, off, reuse
