"""A stand-in for the agent's ComputeNode service: deterministic tokens, no model."""
from __future__ import annotations

from kvtb_proto import compute_pb2

STOP = 2


class FakeEngine:
    """Encodes a message as one id per word (+ markers); replies with `reply_words` words."""

    def __init__(self, max_context_tokens: int = 200, reply_words: int = 3, stop: bool = True,
                 seeded: bool = False, generation_defaults: dict | None = None):
        self.max_context_tokens = max_context_tokens
        self.reply_words = reply_words
        self.stop = stop
        self.seeded = seeded  # replies " s<seed>w0 ..." so that choices of different seeds differ
        self.generation_defaults = generation_defaults or {}
        self.encoded: list[compute_pb2.EncodeChatRequest] = []
        self.turns: list[compute_pb2.TurnRequest] = []

    async def info(self) -> compute_pb2.InfoResponse:
        return compute_pb2.InfoResponse(model="fake", max_context_tokens=self.max_context_tokens,
                                        stop_token_ids=[STOP], generation_defaults=self.generation_defaults,
                                        block_tokens=32)

    async def encode_chat(self, request: compute_pb2.EncodeChatRequest) -> list[int]:
        self.encoded.append(request)
        ids = [1] if not request.continuation else [3]
        for m in request.messages:  # each message ends with 4: a system message's ids are a prefix
            ids += [10 + len(w) for w in m.content.split()] + [4]
        return ids

    def token(self, request: compute_pb2.TurnRequest, token_id: int, text: str) -> compute_pb2.TurnEvent.Token:
        """The token, with logprobs (-0.5 per position's rank) when the request asks."""
        token = compute_pb2.TurnEvent.Token(id=token_id, text=text)
        if request.sampling.logprobs:
            token.logprob, token.piece = -0.25, text or "<|im_end|>"
            token.top_logprobs.extend(compute_pb2.TopLogprob(id=token_id + k, logprob=-0.25 - k, piece=f"t{k}")
                                      for k in range(request.sampling.top_logprobs))
        return token

    async def generate(self, request: compute_pb2.TurnRequest, route=None):
        self.turns.append(request)
        out = []
        prefix = f" s{request.sampling.seed}" if self.seeded else " "
        for i in range(self.reply_words):
            out.append(50 + i)
            yield compute_pb2.TurnEvent(token=self.token(request, 50 + i, f"{prefix}w{i}"))
        if self.stop:
            out.append(STOP)
            yield compute_pb2.TurnEvent(token=self.token(request, STOP, ""))
        restored = len(self.turns) > 1
        yield compute_pb2.TurnEvent(record=compute_pb2.TurnRecord(
            request_id=request.request_id, context_id=request.context_id,
            kv_source="restored" if restored else "none", engine_ms=1.0, tokens_out=len(out),
            output_token_ids=out, finish_reason="stop" if self.stop else "length",
            stop_reason=str(STOP) if self.stop else "",
            steps=[compute_pb2.Step(step=8 if restored else 2, name="inference")]))
