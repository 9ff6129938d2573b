"""A fake agent serving the ComputeNode service over real gRPC: no model, a gate on replies."""
from __future__ import annotations

import threading
from concurrent import futures

import grpc

from kvtb.rpc import Security, add_port
from kvtb_proto import compute_pb2, compute_pb2_grpc

STOP = 2


class FakeComputeNode(compute_pb2_grpc.ComputeNodeServicer):
    """Replies ' ok' then the stop token; each reply waits for `gate` to be set."""

    def __init__(self):
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Semaphore(0)
        self.requests: list[compute_pb2.TurnRequest] = []

    def Info(self, request, context):
        return compute_pb2.InfoResponse(model="fake", max_context_tokens=256, stop_token_ids=[STOP])

    def EncodeChat(self, request, context):
        return compute_pb2.EncodeChatResponse(token_ids=[7] * (3 + len(request.messages)))

    def Generate(self, request, context):
        self.requests.append(request)
        self.started.release()
        if not self.gate.wait(30):
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "gate never opened")
        yield compute_pb2.TurnEvent(token=compute_pb2.TurnEvent.Token(id=11, text=" ok"))
        yield compute_pb2.TurnEvent(token=compute_pb2.TurnEvent.Token(id=STOP, text=""))
        yield compute_pb2.TurnEvent(record=compute_pb2.TurnRecord(
            request_id=request.request_id, kv_source="none", engine_ms=0.5, tokens_out=2,
            output_token_ids=[11, STOP]))

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
