"""The ComputeNode gRPC servicer: proto in, engine call, proto out."""
from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

import grpc
import numpy as np

from compute_node.chat_template import ChatEncoder, ChatError
from compute_node.model_loader import MODEL_NAME
from compute_node.sampling import SamplingParams, check_params
from compute_node.scheduler import NeverFits, QueueFull
from compute_node.turn import Turn, TurnRecordData
from kvtb_proto import compute_pb2, compute_pb2_grpc
from scale.dilation import pacing_json

# snapshot() keys that ComputeStatsResponse carries under the same name
STATS_FIELDS = ("preempt_recompute_s", "preempt_recompute_tokens", "preempt_swap_s", "preempt_swap_out_s",
                "preempt_swap_in_s", "preempt_swap_wait_s", "swap_host_bytes_out", "swap_host_bytes_in",
                "swap_host_fallbacks", "swap_host_used_bytes", "swap_host_capacity_bytes")

logger = logging.getLogger(__name__)


class BadRequest(Exception):
    """A request the node refuses: a grpc status code and a message saying what was wrong."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


def check_token_ids(ids: np.ndarray, vocab_size: int, what: str = "token_ids") -> None:
    if ids.size and int(ids.max()) >= vocab_size:
        bad = int(np.flatnonzero(ids >= vocab_size)[0])
        raise BadRequest(grpc.StatusCode.INVALID_ARGUMENT,
                         f"{what}[{bad}] = {int(ids[bad])} is outside the vocabulary [0, {vocab_size})")


def make_turn(request: compute_pb2.TurnRequest, engine, compile_grammar=None) -> Turn:
    """Validate a TurnRequest into a Turn (raises BadRequest).

    Every number is checked before it reaches torch: token ids against the vocabulary, the
    length against the context and the pool, every sampling parameter as vLLM checks it (NaN and
    infinities refused; a temperature too small to divide by samples as sampling.MIN_TEMPERATURE).
    compile_grammar(structured) -> a matcher for a structured reply (BadRequest when it cannot be).
    """
    s, invalid = engine.settings, grpc.StatusCode.INVALID_ARGUMENT
    ids = np.asarray(request.token_ids, dtype=np.uint32)
    if ids.size == 0:
        raise BadRequest(invalid, "token_ids is empty: send the conversation's token ids")
    check_token_ids(ids, engine.vocab_size)
    limit = s.max_context_tokens
    if ids.size > limit:  # vLLM's words (vllm/entrypoints/openai/serving_engine.py), as the frontend's
        raise BadRequest(invalid, f"This model's maximum context length is {limit} tokens. However, you "
                                  f"requested {ids.size} tokens in the messages. Please reduce the length "
                                  "of the messages.")
    if not request.user_id or not request.context_id:
        raise BadRequest(invalid, "user_id and context_id must be set")
    policy = request.policy or s.policy
    if policy not in ("triggered", "cpu", "resident", "recompute"):
        raise BadRequest(invalid, f"unknown policy {policy!r}: use triggered, cpu, resident or recompute")
    if policy not in engine.policies():
        raise BadRequest(grpc.StatusCode.FAILED_PRECONDITION,
                         f"policy {policy!r} is not available on this node (it runs {engine.policies()}): "
                         "triggered needs the SmartNIC agent, cpu needs storage nodes")
    params = sampling_params(request.sampling, engine.vocab_size)
    if (why := check_params(params, engine.vocab_size, request.max_new_tokens or s.default_max_new_tokens,
                            request.ignore_eos)) is not None:
        raise BadRequest(invalid, why)
    if request.stored_tokens > ids.size or request.shared_prefix_tokens > ids.size:
        raise BadRequest(invalid, f"stored_tokens ({request.stored_tokens}) and shared_prefix_tokens "
                                  f"({request.shared_prefix_tokens}) cannot exceed the {ids.size} token ids")
    max_new = min(request.max_new_tokens or s.default_max_new_tokens, limit - ids.size + 1)
    try:
        engine.check_fits(int(ids.size), max_new)
    except NeverFits as exc:
        raise BadRequest(invalid, str(exc)) from exc
    matcher = None
    if params.structured is not None:
        if compile_grammar is None:
            raise BadRequest(grpc.StatusCode.UNIMPLEMENTED, "sampling.structured: this node has no grammar compiler")
        matcher = compile_grammar(params.structured)  # BadRequest when it cannot be compiled
    return Turn(request.request_id, request.user_id, request.context_id, request.tenant or "default",
                ids.tolist(), max_new, params, policy,
                ignore_eos=request.ignore_eos, stored_tokens=request.stored_tokens,
                shared_prefix_tokens=request.shared_prefix_tokens, matcher=matcher)


def sampling_params(sampling: compute_pb2.Sampling, vocab_size: int) -> SamplingParams:
    """The proto's Sampling as SamplingParams (top_k past the vocabulary is off); check_params validates it."""
    return SamplingParams(
        temperature=sampling.temperature, top_p=sampling.top_p, seed=sampling.seed,
        top_k=sampling.top_k if sampling.top_k < vocab_size else 0, min_p=sampling.min_p,
        presence_penalty=sampling.presence_penalty, frequency_penalty=sampling.frequency_penalty,
        repetition_penalty=sampling.repetition_penalty, logit_bias=dict(sampling.logit_bias),
        stop_token_ids=tuple(sampling.stop_token_ids), stop=tuple(sampling.stop),
        include_stop_str_in_output=sampling.include_stop_str_in_output, min_tokens=sampling.min_tokens,
        logprobs=sampling.logprobs, top_logprobs=sampling.top_logprobs,
        structured=sampling.structured if sampling.HasField("structured") else None)


def token_to_proto(token_id: int, text: str, logprobs) -> compute_pb2.TurnEvent:
    """A token event; with logprobs (turn.TokenEventLogprobs) its logprob, piece and likeliest tokens."""
    token = compute_pb2.TurnEvent.Token(id=token_id, text=text)
    if logprobs is not None:
        token.logprob, token.piece = logprobs.logprob, logprobs.piece
        token.top_logprobs.extend(compute_pb2.TopLogprob(id=i, logprob=lp, piece=piece)
                                  for i, lp, piece in logprobs.top)
    return compute_pb2.TurnEvent(token=token)


def record_to_proto(rec: TurnRecordData) -> compute_pb2.TurnRecord:
    steps = [compute_pb2.Step(step=s.step, name=s.name, start_unix_ns=s.start_ns, end_unix_ns=s.end_ns,
                              bytes=s.bytes, service="compute") for s in rec.steps]
    return compute_pb2.TurnRecord(
        request_id=rec.request_id, context_id=rec.context_id, kv_source=rec.kv_source,
        fallback_reason=rec.fallback_reason, ttft_ms=rec.ttft_ms, tbt_ms=rec.tbt_ms,
        engine_ms=rec.engine_ms, tokens_prefilled=rec.tokens_prefilled, tokens_reused=rec.tokens_reused,
        tokens_out=rec.tokens_out, bytes_restored=rec.bytes_restored, bytes_offloaded=rec.bytes_offloaded,
        steps=steps, output_token_ids=rec.output_token_ids, batch_size=round(rec.batch_size),
        offload_stall_ms=rec.offload_stall_ms, offload_stall_cpu_ms=rec.offload_stall_cpu_ms,
        chunks_offloaded=rec.chunks_offloaded,
        finish_reason=rec.finish_reason, queue_ms=rec.queue_ms, policy=rec.policy,
        blocks_restored=rec.blocks_restored, blocks_failed=rec.blocks_failed, preemptions=rec.preemptions,
        tokens_cached=rec.tokens_cached, stop_reason=rec.stop_reason)


def restore_to_proto(blocks, layer_groups: int) -> compute_pb2.RestoreRequest:
    return compute_pb2.RestoreRequest(layer_groups=layer_groups, blocks=[
        compute_pb2.RestoreBlock(block=b.block, hash=b.hash, token_count=b.token_count, chunk_index=b.chunk_index,
                                 shared=b.shared) for b in blocks])


class ComputeNodeServicer(compute_pb2_grpc.ComputeNodeServicer):
    """Thin: every method translates and calls the engine or the chat encoder."""

    def __init__(self, engine, encoder: ChatEncoder, unavailable: Callable[[], str] | None = None):
        """unavailable() -> why turns are refused now with UNAVAILABLE (the node's agent is gone), "" if not."""
        self.engine = engine
        self.encoder = encoder
        self.unavailable = unavailable or (lambda: "")
        self._grammars = None  # the node's one grammar compiler, built at the first structured turn
        self._grammars_lock = threading.Lock()

    def _compile(self, structured):
        """A fresh matcher for a structured reply, compiled here in the servicer's thread (never the engine's)."""
        from compute_node import grammar
        with self._grammars_lock:
            if self._grammars is None:
                self._grammars = grammar.GrammarCompiler(self.encoder.tokenizer, self.engine.vocab_size)
        try:
            return self._grammars.matcher(structured)
        except grammar.GrammarBusy as exc:  # other schemas compiling: retry, not a bad request
            raise BadRequest(grpc.StatusCode.RESOURCE_EXHAUSTED, f"sampling.structured: {exc}") from exc
        except grammar.GrammarError as exc:
            raise BadRequest(grpc.StatusCode.INVALID_ARGUMENT, f"sampling.structured: {exc}") from exc

    def close(self) -> None:
        """Stop the grammar compiler's child process, if one was started."""
        with self._grammars_lock:
            if self._grammars is not None:
                self._grammars.close()
                self._grammars = None

    def Generate(self, request, context):
        if why := self.unavailable():
            context.abort(grpc.StatusCode.UNAVAILABLE, why)
        try:
            turn = make_turn(request, self.engine, self._compile)
            self.engine.submit(turn)
        except BadRequest as exc:
            context.abort(exc.code, str(exc))
        except QueueFull as exc:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"the wait queue is full: {exc}")
        context.add_callback(turn.cancel)
        while True:
            try:
                event = turn.events.get(timeout=1.0)
            except queue.Empty:
                if not context.is_active():
                    turn.cancel()
                    return
                continue
            kind = event[0]
            if kind == "token":
                yield token_to_proto(*event[1:])
            elif kind == "restore":
                yield compute_pb2.TurnEvent(restore=restore_to_proto(event[1], event[2]))
            elif kind == "record":
                rec = event[1]
                logger.info("turn done: kv_source %s%s, %d prefilled, %d reused, %d out, batch %.1f", rec.kv_source,
                            f" ({rec.fallback_reason})" if rec.fallback_reason else "",
                            rec.tokens_prefilled, rec.tokens_reused, rec.tokens_out, rec.batch_size,
                            extra={"request_id": request.request_id, "event": "turn",
                                   "kv_source": rec.kv_source, "user_id": request.user_id,
                                   "context_id": request.context_id})
                yield compute_pb2.TurnEvent(record=record_to_proto(rec))
                return
            else:
                context.abort(getattr(grpc.StatusCode, event[1]), event[2])

    def EncodeChat(self, request, context):
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        try:
            if request.text and messages:
                raise ChatError("send either messages or text, not both")
            if request.text:
                ids = self.encoder.encode_text(request.text, request.add_special_tokens)
            else:
                ids = self.encoder.encode(messages, request.continuation, request.add_generation_prompt,
                                          request.close_previous_turn, request.continue_final_message)
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
        L, s = self.engine.layout, self.engine.settings
        return compute_pb2.InfoResponse(
            model=MODEL_NAME, max_context_tokens=s.max_context_tokens, vocab_size=self.engine.vocab_size,
            num_blocks=L.num_blocks, block_tokens=L.block_tokens, policy=s.policy, num_layers=L.num_layers,
            num_kv_heads=L.num_kv_heads, head_dim=L.head_dim, kv_bytes_per_token=L.kv_bytes_per_token,
            stop_token_ids=sorted(self.engine.stop_token_ids), policies=self.engine.policies(),
            region_id=self.engine.region_id(), generation_defaults=self.engine.generation_defaults)

    def Stats(self, request, context):
        snap = self.engine.snapshot()
        return compute_pb2.ComputeStatsResponse(
            turns=snap["turns"], num_requests_running=snap["num_requests_running"],
            num_requests_waiting=snap["num_requests_waiting"], kv_source_counts=snap["kv_source"],
            fallbacks_by_reason=snap["fallbacks"], bytes_restored=snap.get("bytes_restored", 0),
            bytes_offloaded=snap.get("bytes_offloaded", 0), tokens_prefilled=snap.get("tokens_prefilled", 0),
            tokens_reused=snap.get("tokens_reused", 0), tokens_out=snap.get("tokens_out", 0),
            kv_cache_usage_perc=snap["kv_cache_usage_perc"], preemptions=snap["preemptions"],
            preempted_tokens=snap["preempted_tokens"], prefix_cache_queries=snap["prefix_cache_queries"],
            prefix_cache_hits=snap["prefix_cache_hits"], num_requests_restoring=snap["num_requests_restoring"],
            pacing_json=pacing_json(), **{name: snap[name] for name in STATS_FIELDS})
