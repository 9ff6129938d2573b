"""A turn as the engine sees it: the validated request, its events, and its record (no grpc)."""
from __future__ import annotations

import dataclasses
import queue
import threading
import time

import numpy as np

from compute_node.sampling import SamplingParams
from kvtb import steps
from kvtb.steps import Step


@dataclasses.dataclass(frozen=True)
class RestoreTicket:
    """The agent's RestoreInfo, as plain values."""

    slot: int
    tokens_announced: int
    chunks: int
    completion_counter: int
    threshold: int
    error_base: int
    bytes: int
    started_unix_s: float = 0.0


@dataclasses.dataclass
class StepSpan:
    """One of the paper's steps as it happened here (absolute times, time.time_ns())."""

    step: Step
    start_ns: int
    end_ns: int
    bytes: int = 0

    @property
    def name(self) -> str:
        return steps.name(self.step)


@dataclasses.dataclass
class TurnRecordData:
    """Everything TurnRecord carries, as plain values."""

    request_id: str
    context_id: str
    policy: str
    kv_source: str = "none"
    fallback_reason: str = ""
    ttft_ms: float = 0.0
    tbt_ms: float = 0.0
    engine_ms: float = 0.0
    queue_ms: float = 0.0
    tokens_prefilled: int = 0
    tokens_reused: int = 0
    tokens_out: int = 0
    bytes_restored: int = 0
    bytes_offloaded: int = 0
    offload_stall_ms: float = 0.0
    chunks_offloaded: int = 0
    finish_reason: str = ""
    slot: int = 0
    output_token_ids: list[int] = dataclasses.field(default_factory=list)
    steps: list[StepSpan] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(eq=False)
class Turn:
    """One Generate call: input for the engine, and a queue of events back to the servicer.

    Events: ("token", id, text), ("record", TurnRecordData) or ("error", code_name, message).
    """

    request_id: str
    user_id: str
    context_id: str
    token_ids: np.ndarray  # [n] uint32
    max_new_tokens: int
    sampling: SamplingParams
    policy: str
    restore: RestoreTicket | None = None
    ignore_eos: bool = False
    fallback: object = None  # set when a timed-out restore moved the turn to another slot
    arrived_ns: int = dataclasses.field(default_factory=time.time_ns)
    arrived_perf: float = dataclasses.field(default_factory=time.perf_counter)
    events: queue.Queue = dataclasses.field(default_factory=queue.Queue)
    cancelled: threading.Event = dataclasses.field(default_factory=threading.Event)

    @property
    def context(self) -> tuple[str, str]:
        return (self.user_id, self.context_id)

    @property
    def reserved_slot(self) -> int | None:
        return self.restore.slot if self.restore else None

    def cancel(self) -> None:
        self.cancelled.set()

    def emit(self, *event) -> None:
        self.events.put(event)
