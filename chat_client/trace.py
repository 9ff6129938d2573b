"""A context's turns as Chrome trace JSON (the trace event format), which Perfetto opens. Pure.

One process per service (frontend, smartnic, compute), one thread per turn; every step of
the paper's eight is an "X" (complete) event with ts and dur in µs from the earliest event
(the first turn's start, or step 1 when the compute node registered before it: Perfetto drops
events with negative timestamps), and args with its bytes, the turn's request id and step
number. The frontend adds one event per turn spanning the whole turn, with the replica that served
it, where its KV came from and the replica a first attempt failed on.
"""
from __future__ import annotations

import json
from typing import Any, Iterable

from kvtb import steps
from kvtb_proto import frontend_pb2

SERVICES = ("frontend", "smartnic", "compute", "storage")


def _pid(service: str) -> int:
    return SERVICES.index(service) + 1 if service in SERVICES else len(SERVICES) + 1


def _us(ns: int, base_ns: int) -> float:
    return round((ns - base_ns) / 1e3, 3)


def _metadata(turns: list[frontend_pb2.TurnSummary]) -> list[dict[str, Any]]:
    services = sorted({s.service or "compute" for t in turns for s in t.steps} | {"frontend"}, key=_pid)
    events: list[dict[str, Any]] = []
    for service in services:
        pid = _pid(service)
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": service}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                       "args": {"sort_index": pid}})
        for t in turns:
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": t.turn,
                           "args": {"name": f"turn {t.turn}"}})
    return events


def turn_events(summary: frontend_pb2.TurnSummary, base_ns: int) -> list[dict[str, Any]]:
    """The turn's span and its steps as complete events, in order of start."""
    start = summary.turn_start_unix_ns
    end = start + int(summary.e2e_ms * 1e6)
    events = [{"name": f"turn {summary.turn}", "cat": "turn", "ph": "X", "pid": _pid("frontend"),
               "tid": summary.turn, "ts": _us(start, base_ns), "dur": _us(end, start),
               "args": {"request_id": summary.request_id, "context_id": summary.context_id,
                        "kv_source": summary.kv_source, "replica": summary.replica,
                        "kv_origin": summary.kv_origin, "retried_from": summary.retried_from,
                        "ttft_ms": summary.ttft_ms,
                        "tokens_reused": summary.tokens_reused, "tokens_out": summary.tokens_out,
                        "bytes_restored": summary.bytes_restored,
                        "bytes_offloaded": summary.bytes_offloaded}}]
    # by start, steps of the same millisecond of the trace's clock in step order
    for s in sorted(summary.steps, key=lambda s: (_us(s.start_unix_ns, base_ns) // 1000, s.step)):
        service = s.service or "compute"
        events.append({"name": f"{s.step}. {s.name or steps.name(s.step)}", "cat": f"step{s.step}",
                       "ph": "X", "pid": _pid(service), "tid": summary.turn,
                       "ts": _us(s.start_unix_ns, base_ns),
                       "dur": max(0.0, _us(s.end_unix_ns, s.start_unix_ns)),
                       "args": {"step": s.step, "bytes": s.bytes, "request_id": summary.request_id,
                                "service": service}})
    return events


def chrome_trace(turns: Iterable[frontend_pb2.TurnSummary]) -> dict[str, Any]:
    """The trace of the turns (Chrome trace event format, JSON object form)."""
    turns = sorted(turns, key=lambda t: t.turn)
    base = min((t.turn_start_unix_ns for t in turns), default=0)
    base = min([base, *(s.start_unix_ns for t in turns for s in t.steps if s.start_unix_ns)])
    events = _metadata(turns)
    for t in turns:
        events.extend(turn_events(t, base))
    context = turns[0].context_id if turns else ""
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"context_id": context, "turns": len(turns), "start_unix_ns": base}}


def write_trace(turns: Iterable[frontend_pb2.TurnSummary], path: str) -> int:
    """Write the trace to path; return how many events it holds."""
    trace = chrome_trace(turns)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f, indent=None, separators=(",", ":"))
    return len(trace["traceEvents"])
