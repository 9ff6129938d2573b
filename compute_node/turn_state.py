"""What the engine keeps about one turn while it runs, and the record it makes of it (no torch)."""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from compute_node.chat_template import StreamDecoder
from compute_node.offload import OffloadStats
from compute_node.restore import PendingRestore, RestoreOutcome
from compute_node.sampling import SequenceSampler, TokenLogprobs
from compute_node.sequence import Sequence
from compute_node.stop_strings import StopStrings
from compute_node.turn import StepSpan, TokenEventLogprobs, Turn, TurnRecordData
from kvtb.steps import Step

NO_STORED_KV = {
    "triggered": "no stored KV: the agent has no stored block of this conversation's prefix",
    "cpu": "no stored KV: this node stored no block of this conversation's prefix",
    "resident": "evicted: the conversation's KV blocks were reused for other sequences",
    "recompute": "",
}


@dataclasses.dataclass(eq=False)
class TurnState:
    """One turn's progress. Engine thread only."""

    turn: Turn
    seq: Sequence
    tokenizer: object
    follow_up: bool
    sampler: SequenceSampler
    pieces: object = None  # token id -> its text alone (logprobs); default: the tokenizer's decode
    stored: set[bytes] = dataclasses.field(default_factory=set)        # names of its blocks on storage
    storing: dict[int, int] = dataclasses.field(default_factory=dict)  # block index -> pool block, PUT in flight
    awaiting: set[int] = dataclasses.field(default_factory=set)  # pool blocks another turn's PUT is storing
    offload: OffloadStats = dataclasses.field(default_factory=OffloadStats)
    offload_failures: int = 0
    restore: PendingRestore | None = None
    outcome: RestoreOutcome | None = None
    restore_end_ns: int = 0
    restored_bytes: int = 0
    preemptions: int = 0
    first_step_perf: float = 0.0
    first_step_ns: int = 0
    tokens_reused: int = 0
    tokens_cached: int = 0
    batch_sum: int = 0
    batch_steps: int = 0
    token_times: list[float] = dataclasses.field(default_factory=list)
    finished_ns: int = 0
    recorded: bool = False
    finished: bool = False  # the engine forgot it (recorded, cancelled or aborted)
    aborted: bool = False   # failed: its error was sent, no record follows

    def __post_init__(self):
        self.decoder = StreamDecoder(self.tokenizer)
        params = self.turn.sampling
        self.stops = StopStrings(params.stop, params.include_stop_str_in_output) if params.stop else None
        if self.pieces is None:
            self.pieces = lambda token_id: self.tokenizer.decode([token_id], skip_special_tokens=False)

    def scheduled(self, batch_size: int) -> None:
        """The sequence is in this step's batch of batch_size sequences."""
        if not self.first_step_perf:
            self.first_step_perf, self.first_step_ns = time.perf_counter(), time.time_ns()
            self.tokens_reused = self.seq.num_computed_tokens
            self.tokens_cached = self.seq.num_cached_tokens
        self.batch_sum += batch_size
        self.batch_steps += 1

    def step_dropped(self) -> None:
        """Its step's output was not used (its restore had not landed): its first step is still to come."""
        if not self.token_times:
            self.first_step_perf, self.first_step_ns = 0.0, 0

    def token(self, token_id: int, now_perf: float, logprobs: TokenLogprobs | None = None) -> str | None:
        """A sampled token the sequence appended: stream its text, up to a stop string (text that may start
        one is held back; the rest goes out once the sequence finished). What ends the reply here, for
        the caller to stop the sequence: the stop string it completed, "" when its grammar ended; None."""
        self.token_times.append(now_perf)
        self.sampler.accept(token_id)
        text, matched = self.decoder.push(token_id), None
        if self.stops is not None:
            text, matched = self.stops.push(text, self.seq.num_completion_tokens >= self.turn.sampling.min_tokens)
            if matched is None and self.seq.is_finished:
                text += self.stops.flush()
        self.turn.emit("token", token_id, text, self._logprobs_event(token_id, logprobs))
        matcher = self.sampler.matcher
        if matched is None and matcher is not None and matcher.is_terminated():
            return ""
        return matched

    def _logprobs_event(self, token_id: int, logprobs: TokenLogprobs | None) -> TokenEventLogprobs | None:
        if logprobs is None:
            return None
        return TokenEventLogprobs(logprobs.logprob, self.pieces(token_id),
                                  [(i, lp, self.pieces(i)) for i, lp in logprobs.top])

    def restored(self, outcome: RestoreOutcome, block_bytes) -> None:
        self.outcome, self.restore_end_ns = outcome, time.time_ns()
        ok = self.restore.blocks[:outcome.blocks_ok]
        self.restored_bytes += sum(block_bytes(b.token_count) for b in ok)

    def finish(self, now_ns: int) -> None:
        self.finished_ns = now_ns

    def kv_source(self) -> tuple[str, str]:
        """Where the prefix came from, and why it did not when it should have."""
        o = self.outcome
        if o is not None and o.blocks_ok and not o.blocks_failed:
            return "restored", ""
        if o is not None and o.blocks_ok:
            return "partial", o.reason
        if o is not None:
            return "recomputed", o.reason
        if self.tokens_cached:
            return "resident", ""
        if self.follow_up:
            return "recomputed", NO_STORED_KV.get(self.turn.policy, "")
        return "none", ""

    def record(self, policy: str, now_ns: int) -> TurnRecordData:
        seq, turn = self.seq, self.turn
        source, reason = self.kv_source()
        rec = TurnRecordData(turn.request_id, turn.context_id, policy, kv_source=source, fallback_reason=reason)
        arrived = turn.arrived_perf
        rec.queue_ms = (self.first_step_perf - arrived) * 1e3 if self.first_step_perf else 0.0
        rec.ttft_ms = (self.token_times[0] - arrived) * 1e3 if self.token_times else 0.0
        gaps = np.diff(self.token_times)
        rec.tbt_ms = float(gaps.mean() * 1e3) if gaps.size else 0.0
        rec.engine_ms = (time.perf_counter() - arrived) * 1e3
        rec.tokens_reused, rec.tokens_cached = self.tokens_reused, self.tokens_cached
        rec.tokens_prefilled = seq.num_prompt_tokens - self.tokens_reused
        rec.output_token_ids = seq.completion_token_ids
        rec.tokens_out = len(rec.output_token_ids)
        rec.finish_reason = "cancelled" if turn.cancelled.is_set() else seq.finish_reason
        rec.stop_reason = seq.stop_reason if rec.finish_reason == "stop" else ""
        rec.bytes_restored = self.restored_bytes
        rec.bytes_offloaded, rec.chunks_offloaded = self.offload.bytes, self.offload.chunks
        rec.offload_stall_ms = self.offload.stall_s * 1e3
        rec.offload_stall_cpu_ms = self.offload.stall_cpu_s * 1e3
        rec.batch_size = self.batch_sum / self.batch_steps if self.batch_steps else 0.0
        rec.preemptions = seq.num_preemptions
        if self.outcome is not None:
            rec.blocks_restored, rec.blocks_failed = self.outcome.blocks_ok, self.outcome.blocks_failed
            landed = self.restore.landed_ns or self.restore_end_ns  # from the first block seen landing
            rec.steps.append(StepSpan(Step.RESTORE, landed, self.restore_end_ns, self.restored_bytes))
        step = Step.INFERENCE if source == "none" else Step.FOLLOW_UP
        rec.steps.append(StepSpan(step, self.first_step_ns or self.finished_ns, self.finished_ns, self.offload.bytes))
        if self.offload.chunks:
            rec.steps.append(StepSpan(Step.RELEASE, self.finished_ns, now_ns, self.offload.bytes))
        return rec
