"""A fake agent serving the ComputeNode service over real gRPC: no model, a gate on replies.

Its EncodeChat follows a ChatML-like template over a word-level tokenizer, so that, as with the
real encoder, a continuation equals the rendering of the whole conversation (the reply " ok" is
one token, id 11, as Generate sends it) and a system message's ids alone are a prefix of the whole.
"""
from __future__ import annotations

import re
import threading
import zlib
from concurrent import futures

import grpc

from kvtb.rpc import Security, add_port
from kvtb_proto import compute_pb2, compute_pb2_grpc

STOP = 2
IM_START, NEWLINE = 3, 4
ROLES = {"system": 5, "user": 6, "assistant": 7}
DEFAULT_SYSTEM = "You are a fake assistant."  # the template's, when a conversation has none
REPLY_ID, REPLY = 11, " ok"


def tokenize(text: str) -> list[int]:
    """One id per word with its leading whitespace (" ok" is REPLY_ID)."""
    return [REPLY_ID if w == REPLY else 1000 + zlib.crc32(w.encode()) % 40000
            for w in re.findall(r"\s*\S+|\s+", text)]


def render(messages: list[tuple[str, str]], generation_prompt: bool) -> list[int]:
    """The template's ids of whole messages: IM_START role words STOP NEWLINE each."""
    if messages and messages[0][0] != "system":
        messages = [("system", DEFAULT_SYSTEM), *messages]
    ids = [i for role, content in messages for i in (IM_START, ROLES[role], *tokenize(content), STOP, NEWLINE)]
    return ids + ([IM_START, ROLES["assistant"]] if generation_prompt else [])


def encode(request: compute_pb2.EncodeChatRequest) -> list[int]:
    """EncodeChat: a conversation's ids, or (continuation) those to append after a reply's STOP."""
    messages = [(m.role, m.content) for m in request.messages]
    if not request.continuation:
        return render(messages, request.add_generation_prompt)
    ids = render([("system", ""), *messages], request.add_generation_prompt)[4:]  # no system part
    return [STOP] * request.close_previous_turn + [NEWLINE] + ids


def token(sampling: compute_pb2.Sampling, token_id: int, text: str) -> compute_pb2.TurnEvent.Token:
    """A generated token; with logprobs, log p = -0.5 and top_logprobs of ids after it."""
    out = compute_pb2.TurnEvent.Token(id=token_id, text=text)
    if sampling.logprobs:
        out.logprob, out.piece = -0.5, text or "<|im_end|>"
        out.top_logprobs.extend(compute_pb2.TopLogprob(id=token_id + k, logprob=-0.5 - k, piece=f"t{k}")
                                for k in range(sampling.top_logprobs))
    return out


class FakeComputeNode(compute_pb2_grpc.ComputeNodeServicer):
    """Replies ' ok' then the stop token; each reply (of `held_users`, if set) waits for `gate` to be set."""

    def __init__(self):
        # (id, text) per generated token; [(12, " o"), (13, "k")] is " ok" as a model may generate
        # it: split otherwise than the text re-tokenises
        self.reply = [(REPLY_ID, REPLY)]
        self.gate = threading.Event()
        self.gate.set()
        self.held_users: set[str] | None = None  # whose turns wait for the gate (None: everyone's)
        self.tickets: threading.Semaphore | None = None  # if set, a held turn waits for a ticket, not the gate
        self.started = threading.Semaphore(0)
        self.requests: list[compute_pb2.TurnRequest] = []

    def Info(self, request, context):
        return compute_pb2.InfoResponse(model="fake", max_context_tokens=256, stop_token_ids=[STOP], block_tokens=32)

    def EncodeChat(self, request, context):
        return compute_pb2.EncodeChatResponse(token_ids=encode(request))

    def Generate(self, request, context):
        self.requests.append(request)
        self.started.release()
        held = self.held_users is None or request.user_id in self.held_users
        tickets = self.tickets
        if held and not (tickets.acquire(timeout=30) if tickets is not None else self.gate.wait(30)):
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "gate never opened")
        reply = list(self.reply)
        for token_id, text in [*reply, (STOP, "")]:
            yield compute_pb2.TurnEvent(token=token(request.sampling, token_id, text))
        yield compute_pb2.TurnEvent(record=compute_pb2.TurnRecord(
            request_id=request.request_id, kv_source="none", engine_ms=0.5, tokens_out=len(reply) + 1,
            output_token_ids=[*(i for i, _ in reply), STOP]))

    def Stats(self, request, context):
        return compute_pb2.ComputeStatsResponse(turns=len(self.requests))


def serve(address: str = "127.0.0.1:0", identity: str = "smartnic") -> tuple[grpc.Server, FakeComputeNode, str]:
    """Start the fake (as the agent, or as `identity`) with the run's credentials; (server, servicer, address)."""
    server = grpc.server(futures.ThreadPoolExecutor(16))
    node = FakeComputeNode()
    compute_pb2_grpc.add_ComputeNodeServicer_to_server(node, server)
    port = add_port(server, address, Security.of(identity))
    server.start()
    return server, node, f"{address.rsplit(':', 1)[0]}:{port}"


def main(argv: list[str]) -> None:
    """`python -m tests.chat_frontend.fake_agent ADDRESS [--hold] [--as IDENTITY]`: serve until killed.

    With --hold every Generate waits (up to 30 s) before it answers: a turn to kill mid-way.
    """
    server, node, _ = serve(argv[0], argv[argv.index("--as") + 1] if "--as" in argv else "smartnic")
    if "--hold" in argv:
        node.gate.clear()
    server.wait_for_termination()


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
