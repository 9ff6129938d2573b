"""The turn's summary: built from the engine's TurnRecord and the frontend's own clock. Pure.

Times follow the ScaleLLM paper's split: e2e is from the frontend receiving the request to it
sending the last event; engine time is what the compute node reports for the turn; gateway
time is the rest (routing, authentication, the agent, streaming back): e2e - engine.
The turn also names the replica that served it, the one a first attempt failed on, and where its
prompt's KV came from (`kv_origin`). The user's client turns the summary into the record it prints
(chat_client/record.py).
"""
from __future__ import annotations

import dataclasses

from kvtb import steps
from kvtb.steps import Step
from kvtb_proto import compute_pb2, frontend_pb2


@dataclasses.dataclass
class TurnClock:
    """The frontend's timestamps of one turn (time.time_ns())."""

    start_ns: int
    first_text_ns: int = 0   # first reply text sent to the user
    end_ns: int = 0          # last event sent
    wait_ns: int = 0         # how long it waited for admission (a duration)


def stream_step(clock: TurnClock, reply_bytes: int) -> compute_pb2.Step:
    """Step 3, the response streamed to the user, as the frontend saw it."""
    start = clock.first_text_ns or clock.end_ns
    return compute_pb2.Step(step=Step.STREAM, name=steps.name(Step.STREAM), start_unix_ns=start,
                            end_unix_ns=clock.end_ns, bytes=reply_bytes, service="frontend")


KV_ORIGINS = ("resident", "pool", "storage_same", "storage_other", "partial", "recompute")


def kv_origin(record: compute_pb2.TurnRecord) -> str:
    """Where the turn's prompt KV came from, one of KV_ORIGINS.

    "resident": the context's KV was still in the replica's pool (kv_source resident); "partial":
    part restored, the rest prefilled; "storage_other": restored, some of it written by another
    replica; "storage_same": restored from what this replica wrote; "pool": prefix-cache hits only
    (a shared prefix still in the pool, nothing restored); "recompute": nothing reused.
    """
    if record.kv_source == "resident":
        return "resident"
    if record.kv_source == "partial":
        return "partial"
    if record.blocks_restored_other > 0:
        return "storage_other"
    if record.blocks_restored > 0 or record.kv_source == "restored":
        return "storage_same"
    if record.tokens_cached > 0 and record.tokens_reused <= record.tokens_cached:
        return "pool"
    return "recompute"


def build_summary(turn: int, context_id: str, request_id: str, reply: str,
                  record: compute_pb2.TurnRecord, clock: TurnClock,
                  finish_reason: str = "", choice: int = 0, retried_from: str = "") -> frontend_pb2.TurnSummary:
    """The TurnSummary of a completed turn, or of one of its choices (steps absolute, sorted by start)."""
    e2e_ms = (clock.end_ns - clock.start_ns) / 1e6
    ttft_ms = ((clock.first_text_ns or clock.end_ns) - clock.start_ns) / 1e6
    steps = [*record.steps, stream_step(clock, len(reply.encode()))]
    steps.sort(key=lambda s: (s.start_unix_ns // 1_000_000, s.step))  # same ms: in step order
    return frontend_pb2.TurnSummary(
        turn=turn, context_id=context_id, reply=reply, kv_source=record.kv_source or "none",
        fallback_reason=record.fallback_reason, ttft_ms=round(ttft_ms, 3),
        tbt_ms=round(record.tbt_ms, 3), e2e_ms=round(e2e_ms, 3),
        gateway_ms=round(max(0.0, e2e_ms - record.engine_ms), 3),
        tokens_prefilled=record.tokens_prefilled, tokens_reused=record.tokens_reused,
        tokens_out=record.tokens_out, bytes_restored=record.bytes_restored,
        bytes_offloaded=record.bytes_offloaded, steps=steps, turn_start_unix_ns=clock.start_ns,
        request_id=request_id, engine_ms=round(record.engine_ms, 3), finish_reason=finish_reason,
        choice=choice, stop_reason=record.stop_reason if finish_reason == "stop" else "",
        replica=record.replica, kv_origin=kv_origin(record), retried_from=retried_from)

