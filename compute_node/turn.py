"""A turn as the engine sees it: the validated request, its events, and its record as plain values (no grpc)."""
from __future__ import annotations

import dataclasses
import queue
import threading
import time

from compute_node.sampling import SamplingParams
from kvtb import steps
from kvtb.steps import Step


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
    tokens_cached: int = 0
    tokens_out: int = 0
    bytes_restored: int = 0
    bytes_offloaded: int = 0
    offload_stall_ms: float = 0.0
    offload_stall_cpu_ms: float = 0.0  # of offload_stall_ms, the engine thread's CPU time
    chunks_offloaded: int = 0
    finish_reason: str = ""
    stop_reason: str = ""
    batch_size: float = 0.0
    blocks_restored: int = 0
    blocks_failed: int = 0
    preemptions: int = 0
    output_token_ids: list[int] = dataclasses.field(default_factory=list)
    steps: list[StepSpan] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class RestoreBlockEvent:
    """One block of a restore event: what the agent GETs into which pool block."""

    block: int
    hash: bytes
    token_count: int
    chunk_index: int
    shared: bool = False


@dataclasses.dataclass(frozen=True)
class TokenEventLogprobs:
    """With Sampling.logprobs: a token's raw log probability, its text alone, and the likeliest
    tokens at its position as (id, logprob, piece)."""

    logprob: float
    piece: str
    top: list[tuple[int, float, str]]


@dataclasses.dataclass(eq=False)
class Turn:
    """One Generate call: input for the engine, and a queue of events back to the servicer.

    Events: ("token", id, text, TokenEventLogprobs | None), ("restore", [RestoreBlockEvent], layer_groups),
    ("record", TurnRecordData) or ("error", code_name, message). matcher: the grammar matcher of a
    structured reply (compute_node.grammar), compiled by the servicer; None otherwise.
    """

    request_id: str
    user_id: str
    context_id: str
    tenant: str
    token_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams
    policy: str
    ignore_eos: bool = False
    stored_tokens: int = 0
    shared_prefix_tokens: int = 0
    matcher: object = None
    arrived_ns: int = dataclasses.field(default_factory=time.time_ns)
    arrived_perf: float = dataclasses.field(default_factory=time.perf_counter)
    events: queue.Queue = dataclasses.field(default_factory=queue.Queue)
    cancelled: threading.Event = dataclasses.field(default_factory=threading.Event)

    @property
    def context(self) -> tuple[str, str]:
        return (self.user_id, self.context_id)

    def cancel(self) -> None:
        self.cancelled.set()

    def emit(self, *event) -> None:
        self.events.put(event)
