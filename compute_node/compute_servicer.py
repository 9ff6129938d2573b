"""The ComputeNode gRPC servicer: proto in, engine call, proto out."""
from __future__ import annotations

import logging
import math
import queue

import grpc
import numpy as np

from kvtb_proto import compute_pb2, compute_pb2_grpc

from compute_node.chat_template import ChatEncoder, ChatError
from compute_node.model_loader import MODEL_NAME
from compute_node.sampling import SamplingParams, check_sampling
from compute_node.slots import QueueFull
from compute_node.turn import RestoreTicket, Turn, TurnRecordData

logger = logging.getLogger(__name__)


class BadRequest(Exception):
    """A request the node refuses: a grpc status code and a message saying what was wrong."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


MAX_LEASE_S = 3600.0


def check_lease(lease_s: float) -> None:
    """A ReserveSlot lease must be finite and at most an hour (NaN or inf would never expire)."""
    if not (math.isfinite(lease_s) and 0.0 <= lease_s <= MAX_LEASE_S):
        raise BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                         f"lease_s must be in [0, {MAX_LEASE_S:g}] seconds (0: the node's default), "
                         f"got {lease_s}")


def check_token_ids(ids: np.ndarray, vocab_size: int, what: str = "token_ids") -> None:
    if ids.size and int(ids.max()) >= vocab_size:
        bad = int(np.flatnonzero(ids >= vocab_size)[0])
        raise BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                         f"{what}[{bad}] = {int(ids[bad])} is outside the vocabulary [0, {vocab_size})")


def make_turn(request: compute_pb2.TurnRequest, engine) -> Turn:
    """Validate a TurnRequest into a Turn (raises BadRequest).

    Every number is checked before it reaches torch: token ids against the vocabulary, the
    length against the context, temperature and top_p against their ranges (NaN and infinities
    refused; a temperature too small to divide by samples as sampling.MIN_TEMPERATURE).
    max_new_tokens needs no check: the runner stops at the context's end.
    """
    s, invalid = engine.settings, grpc.StatusCode.INVALID_ARGUMENT
    ids = np.asarray(request.token_ids, dtype=np.uint32)
    if ids.size == 0:
        raise BadRequest(invalid, "token_ids is empty: send the conversation's token ids")
    check_token_ids(ids, engine.vocab_size)
    limit = engine.pool.layout.max_tokens
    if ids.size > limit:
        raise BadRequest(invalid, f"the conversation has {ids.size} tokens, more than max_context_tokens "
                                  f"({limit}) by {ids.size - limit}")
    if not request.user_id or not request.context_id:
        raise BadRequest(invalid, "user_id and context_id must be set")
    policy = request.policy or s.policy
    if policy not in ("triggered", "cpu", "resident", "recompute"):
        raise BadRequest(invalid, f"unknown policy {policy!r}: use triggered, cpu, resident or recompute")
    if policy not in engine.policies():
        raise BadRequest(grpc.StatusCode.FAILED_PRECONDITION,
                         f"policy {policy!r} is not available on this node (it runs {engine.policies()}): "
                         "triggered needs the SmartNIC agent, cpu needs storage nodes")
    sampling = request.sampling
    if (why := check_sampling(sampling.temperature, sampling.top_p)) is not None:
        raise BadRequest(invalid, why)
    restore = None
    if request.has_restore:
        r = request.restore
        if r.slot >= engine.pool.layout.num_slots:
            raise BadRequest(invalid, f"restore.slot {r.slot} does not exist (the node has "
                                      f"{engine.pool.layout.num_slots} slots)")
        if r.completion_counter != engine.pool.layout.restore_counter(r.slot):
            raise BadRequest(invalid, f"restore.completion_counter {r.completion_counter} is not "
                                      f"slot {r.slot}'s restore counter")
        restore = RestoreTicket(r.slot, r.tokens_announced, r.chunks, r.completion_counter,
                                r.threshold, r.error_base, r.bytes, r.started_unix_s)
    max_new = request.max_new_tokens or s.default_max_new_tokens
    return Turn(request.request_id, request.user_id, request.context_id, ids, max_new,
                SamplingParams(sampling.temperature, sampling.top_p, sampling.seed), policy, restore,
                ignore_eos=request.ignore_eos)


def record_to_proto(rec: TurnRecordData) -> compute_pb2.TurnRecord:
    steps = [compute_pb2.Step(step=s.step, name=s.name, start_unix_ns=s.start_ns, end_unix_ns=s.end_ns,
                              bytes=s.bytes, service="compute") for s in rec.steps]
    return compute_pb2.TurnRecord(
        request_id=rec.request_id, context_id=rec.context_id, kv_source=rec.kv_source,
        fallback_reason=rec.fallback_reason, ttft_ms=rec.ttft_ms, tbt_ms=rec.tbt_ms,
        engine_ms=rec.engine_ms, tokens_prefilled=rec.tokens_prefilled, tokens_reused=rec.tokens_reused,
        tokens_out=rec.tokens_out, bytes_restored=rec.bytes_restored, bytes_offloaded=rec.bytes_offloaded,
        steps=steps, output_token_ids=rec.output_token_ids, slot=rec.slot,
        offload_stall_ms=rec.offload_stall_ms, chunks_offloaded=rec.chunks_offloaded,
        finish_reason=rec.finish_reason, queue_ms=rec.queue_ms, policy=rec.policy)


class ComputeNodeServicer(compute_pb2_grpc.ComputeNodeServicer):
    """Thin: every method translates and calls the engine or the chat encoder."""

    def __init__(self, engine, encoder: ChatEncoder):
        self.engine = engine
        self.encoder = encoder

    def Generate(self, request, context):
        try:
            turn = make_turn(request, self.engine)
            self.engine.submit(turn)
        except BadRequest as exc:
            context.abort(exc.code, str(exc))
        except QueueFull as exc:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"no free slot and the wait queue is full: {exc}")
        context.add_callback(turn.cancel)
        while True:
            try:
                event = turn.events.get(timeout=1.0)
            except queue.Empty:
                if not context.is_active():
                    turn.cancel()
                    self.engine.withdraw(turn)
                    return
                continue
            if event[0] == "token":
                yield compute_pb2.TurnEvent(token=compute_pb2.TurnEvent.Token(id=event[1], text=event[2]))
            elif event[0] == "record":
                rec = event[1]
                logger.info("turn done: kv_source %s, %d prefilled, %d reused, %d out", rec.kv_source,
                            rec.tokens_prefilled, rec.tokens_reused, rec.tokens_out,
                            extra={"request_id": request.request_id, "event": "turn",
                                   "kv_source": rec.kv_source, "user_id": request.user_id,
                                   "context_id": request.context_id})
                yield compute_pb2.TurnEvent(record=record_to_proto(event[1]))
                return
            else:
                context.abort(getattr(grpc.StatusCode, event[1]), event[2])

    def ReserveSlot(self, request, context):
        if not request.user_id or not request.context_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "user_id and context_id must be set")
        try:
            check_lease(request.lease_s)
        except BadRequest as exc:
            context.abort(exc.code, str(exc))
        got, resident = self.engine.reserve(request.user_id, request.context_id, request.lease_s)
        if got is None:
            return compute_pb2.ReserveSlotResponse(reserved=False)
        counter = self.engine.pool.layout.restore_counter(got.slot)
        region_id = self.engine.agent.region_id if self.engine.agent else 0
        return compute_pb2.ReserveSlotResponse(
            reserved=not resident, resident=resident, slot=got.slot, restore_counter=counter,
            restore_counter_value=self.engine.pool.counter_total(counter), region_id=region_id or 0)

    def EncodeChat(self, request, context):
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        try:
            ids = self.encoder.encode(messages, request.continuation, request.add_generation_prompt,
                                      request.close_previous_turn)
        except ChatError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return compute_pb2.EncodeChatResponse(token_ids=ids)

    def Decode(self, request, context):
        ids = np.asarray(request.token_ids, dtype=np.uint32)
        try:
            check_token_ids(ids, self.engine.vocab_size)
        except BadRequest as exc:
            context.abort(exc.code, str(exc))
        return compute_pb2.DecodeResponse(text=self.encoder.tokenizer.decode(ids.tolist(), skip_special_tokens=True))

    def Info(self, request, context):
        L, s = self.engine.pool.layout, self.engine.settings
        return compute_pb2.InfoResponse(
            model=MODEL_NAME, max_context_tokens=L.max_tokens, vocab_size=self.engine.vocab_size,
            num_slots=L.num_slots, chunk_tokens=L.chunk_tokens, policy=s.policy, num_layers=L.num_layers,
            num_kv_heads=L.num_kv_heads, head_dim=L.head_dim, kv_bytes_per_token=L.kv_bytes_per_token,
            stop_token_ids=sorted(self.engine.stop_token_ids), policies=self.engine.policies(),
            region_id=(self.engine.agent.region_id or 0) if self.engine.agent else 0)

    def Stats(self, request, context):
        snap = self.engine.snapshot()
        return compute_pb2.ComputeStatsResponse(
            turns=snap["turns"], slots_in_use=snap["slots_in_use"], queue_length=snap["queue_length"],
            kv_source_counts=snap["kv_source"], fallbacks_by_reason=snap["fallbacks"],
            bytes_restored=snap.get("bytes_restored", 0), bytes_offloaded=snap.get("bytes_offloaded", 0),
            tokens_prefilled=snap.get("tokens_prefilled", 0), tokens_reused=snap.get("tokens_reused", 0),
            tokens_out=snap.get("tokens_out", 0))

