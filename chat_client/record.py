"""A TurnSummary as the record `kvtb chat --json` prints, times relative to the turn's start. Pure."""
from __future__ import annotations

from typing import Any

from kvtb import steps
from kvtb_proto import frontend_pb2

# The keys of `kvtb chat --json`, in order (issue 5; the replica that served the turn, where its KV
# came from and the replica a first attempt failed on: issue 33).
RECORD_KEYS = ("turn", "context_id", "reply", "kv_source", "fallback_reason", "ttft_ms", "tbt_ms",
               "e2e_ms", "gateway_ms", "tokens_prefilled", "tokens_reused", "tokens_out",
               "bytes_restored", "bytes_offloaded", "replica", "kv_origin", "retried_from", "steps")
STEP_KEYS = ("step", "name", "start_ms", "end_ms", "bytes")


def _ms(ns: int) -> float:
    return round(ns / 1e6, 3)


def relative_steps(summary: frontend_pb2.TurnSummary) -> list[dict[str, Any]]:
    """The summary's steps as {step, name, start_ms, end_ms, bytes}, relative to the turn's start.

    Step 1 (the compute node's registration) rides on the first turn after the node started,
    so its times are negative: it happened before the turn.
    """
    base = summary.turn_start_unix_ns
    return [{"step": s.step, "name": s.name or steps.name(s.step),
             "start_ms": _ms(s.start_unix_ns - base), "end_ms": _ms(s.end_unix_ns - base),
             "bytes": s.bytes}
            for s in summary.steps]


def summary_to_dict(summary: frontend_pb2.TurnSummary) -> dict[str, Any]:
    """The record as `kvtb chat --json` prints it (one JSON object per turn)."""
    return {
        "turn": summary.turn, "context_id": summary.context_id, "reply": summary.reply,
        "kv_source": summary.kv_source or "none", "fallback_reason": summary.fallback_reason or None,
        "ttft_ms": summary.ttft_ms, "tbt_ms": summary.tbt_ms, "e2e_ms": summary.e2e_ms,
        "gateway_ms": summary.gateway_ms, "tokens_prefilled": summary.tokens_prefilled,
        "tokens_reused": summary.tokens_reused, "tokens_out": summary.tokens_out,
        "bytes_restored": summary.bytes_restored, "bytes_offloaded": summary.bytes_offloaded,
        "replica": summary.replica, "kv_origin": summary.kv_origin, "retried_from": summary.retried_from or None,
        "steps": relative_steps(summary),
    }
