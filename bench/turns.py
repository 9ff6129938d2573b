"""Turns sent straight to the agent's ComputeNode service, timed on the client side.

The agent serves the compute node's service: a turn sent there passes its match-action table,
so a follow-up under `triggered` is prefetched from storage exactly as the frontend's would be.
"""
from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Sequence

from kvtb_proto import compute_pb2, compute_pb2_grpc

FILLER = ("The storage node keeps every chunk of the conversation in a file on its drive. "
          "A follow-up question restores the chunks into the compute node's memory before prefill. ")


@dataclasses.dataclass
class TurnResult:
    """One turn as the client saw it, with the compute node's record."""

    ttft_s: float
    e2e_s: float
    token_ids: list[int]
    record: compute_pb2.TurnRecord


def generate(stub: compute_pb2_grpc.ComputeNodeStub, user: str, context: str, token_ids: Sequence[int],
             max_new_tokens: int, policy: str = "", timeout_s: float = 600.0,
             ignore_eos: bool = False) -> TurnResult:
    """Run one greedy turn; time to first token and end to end from the call."""
    request = compute_pb2.TurnRequest(request_id=uuid.uuid4().hex, user_id=user, context_id=context,
                                      token_ids=list(token_ids), max_new_tokens=max_new_tokens,
                                      policy=policy, ignore_eos=ignore_eos)
    start = time.perf_counter()
    first = None
    out: list[int] = []
    record = None
    for event in stub.Generate(request, timeout=timeout_s):
        if event.WhichOneof("event") == "token":
            first = first or time.perf_counter()
            out.append(event.token.id)
        else:
            record = event.record
    end = time.perf_counter()
    if record is None or first is None:
        raise RuntimeError(f"turn {request.request_id} of {user}/{context} ended without tokens or record")
    return TurnResult(first - start, end - start, out, record)


def encode(stub: compute_pb2_grpc.ComputeNodeStub, text: str, follow_up: bool,
           close_previous: bool = False) -> list[int]:
    """Token ids of a user message (a new conversation's, or a continuation's)."""
    request = compute_pb2.EncodeChatRequest(
        messages=[compute_pb2.ChatMessage(role="user", content=text)], continuation=follow_up,
        add_generation_prompt=True, close_previous_turn=close_previous)
    return list(stub.EncodeChat(request, timeout=60).token_ids)


def context_prompt(stub: compute_pb2_grpc.ComputeNodeStub, tokens: int) -> list[int]:
    """A whole first message (chat template included) of about `tokens` tokens (never more, unless
    the template alone is longer), from repeated filler text, cut at a word for small sizes."""
    probe = len(encode(stub, FILLER * 8, False)) - len(encode(stub, FILLER * 4, False))
    per_copy = max(probe / 4, 1.0)
    copies = max(int(tokens / per_copy), 1)
    ids = encode(stub, FILLER * copies, False)
    while len(ids) > tokens and copies > 1:
        copies -= 1
        ids = encode(stub, FILLER * copies, False)
    if len(ids) <= tokens:
        return ids
    words = FILLER.split()  # one copy is too long: the most words that fit, by bisection
    lo, hi, best = 1, len(words) - 1, encode(stub, words[0], False)
    while lo <= hi:
        mid = (lo + hi) // 2
        ids = encode(stub, " ".join(words[:mid + 1]), False)
        if len(ids) <= tokens:
            lo, best = mid + 1, ids
        else:
            hi = mid - 1
    return best


def follow_up_ids(stub: compute_pb2_grpc.ComputeNodeStub, history: Sequence[int], reply: TurnResult,
                  message: str) -> list[int]:
    """The conversation so far, the reply, and a new user message ready for generation."""
    cut = reply.record.finish_reason != "stop"
    return [*history, *reply.token_ids, *encode(stub, message, True, close_previous=cut)]
