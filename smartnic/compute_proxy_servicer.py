"""The ComputeNode service served by the agent in front of its compute node (steps 5 and 6).

Thin: Generate asks `smartnic.ingress` what to do with the turn (step 5: match-action, the
stored prefix by content), forwards it with `stored_tokens` filled in, GETs the blocks each
`restore` event of the compute node's stream asks for (step 6; the event goes no further), and
adds the agent's steps to the record on the way back, with its replica's name and how many restored
blocks another replica's agent stored (`blocks_restored_other`). The other methods are forwarded
unchanged. It dials its compute node as the peer its settings name (`compute_identity`).

The compute node's errors are relayed with their status; when it cannot be reached (or there
is none), UNAVAILABLE names it and its address and the trailing metadata `kvtb-failed-service:
compute-node` says so, so the frontend blames the compute node, not the agent.
"""
from __future__ import annotations

import logging
import threading
import time

import grpc

from kvtb import steps
from kvtb.logs import request_context
from kvtb.rpc import READ_STREAMS_ON_CALLER, Security
from kvtb.rpc import channel as channel_to
from kvtb.steps import Step
from kvtb_proto import compute_pb2, compute_pb2_grpc
from smartnic import ingress
from smartnic.agent import Agent, Restore, RestoreBlock

logger = logging.getLogger(__name__)

FAILED_SERVICE = ("kvtb-failed-service", "compute-node")  # trailing metadata of UNAVAILABLE


def relay(context, exc: grpc.RpcError, address: str) -> None:
    """Abort with the compute node's status; UNAVAILABLE names the node and its address."""
    code, details = exc.code(), exc.details() or str(exc)
    if code == grpc.StatusCode.UNAVAILABLE:
        context.set_trailing_metadata((FAILED_SERVICE,))
        details = f"the compute node at {address} is unavailable: {details}"
    context.abort(code, details)


def parse_peer(peer: str) -> tuple[str, int]:
    """("127.0.0.1", 54321) from a gRPC peer string such as "ipv4:127.0.0.1:54321"."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        host, _, port = rest.rpartition(":")
        return host.strip("[]"), int(port or 0)
    return "0.0.0.0", 0


class ComputeProxyServicer(compute_pb2_grpc.ComputeNodeServicer):
    """Thread-safe: stubs are cached per compute address under a lock."""

    def __init__(self, agent: Agent, security: Security, listen_host: str = "127.0.0.1", listen_port: int = 0,
                 compute_identity: str = "compute", replica: str = "replica-0"):
        self.agent = agent
        self.security = security
        self.compute_identity, self.replica = compute_identity, replica  # the peer it dials; TurnRecord.replica
        self.listen_host, self.listen_port = listen_host, listen_port
        self._lock = threading.Lock()
        self._stubs: dict[str, compute_pb2_grpc.ComputeNodeStub] = {}
        self._channels: list[grpc.Channel] = []

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def _stub(self, address: str) -> compute_pb2_grpc.ComputeNodeStub:
        with self._lock:
            if address not in self._stubs:
                channel = channel_to(address, self.security, peer=self.compute_identity,
                                     options=[READ_STREAMS_ON_CALLER])
                self._channels.append(channel)
                self._stubs[address] = compute_pb2_grpc.ComputeNodeStub(channel)
            return self._stubs[address]

    def _packet(self, request, context) -> ingress.Packet:
        src, sport = parse_peer(context.peer())
        return ingress.Packet(request.user_id, request.context_id, src, sport, self.listen_host,
                              self.listen_port)

    def Generate(self, request, context):
        with request_context(request.request_id):
            yield from self._generate(request, context)

    def _generate(self, request, context):
        arrival_ns = time.time_ns()
        try:
            plan = ingress.plan(self.agent, self._packet(request, context), request.tenant or "default",
                                request.token_ids, min(request.shared_prefix_tokens, len(request.token_ids)))
        except ingress.Refused as exc:
            code = grpc.StatusCode.RESOURCE_EXHAUSTED if exc.kind == "rate_limited" else grpc.StatusCode.PERMISSION_DENIED
            context.abort(code, str(exc))
        except ingress.NoComputeNode as exc:
            context.set_trailing_metadata((FAILED_SERVICE,))
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        forwarded = compute_pb2.TurnRequest()
        forwarded.CopyFrom(request)
        forwarded.stored_tokens = plan.stored_tokens
        logger.info("turn of %s/%s to %s: %s, %d tokens of its prefix stored", request.user_id,
                    request.context_id, plan.compute_address, plan.action.type, plan.stored_tokens,
                    extra={"event": "turn", "user_id": request.user_id, "context_id": request.context_id})
        call = self._stub(plan.compute_address).Generate(forwarded)
        context.add_callback(call.cancel)
        restores: list[Restore] = []
        try:
            for event in call:
                if event.HasField("restore"):  # step 6: the compute node allocated the blocks
                    restores.append(self._restore(plan, request, event.restore))
                    continue
                if event.HasField("record"):
                    self._add_steps(event.record, arrival_ns, plan.decided_ns, restores)
                    self._add_origin(event.record, restores)
                yield event
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED or context.is_active():
                relay(context, exc, plan.compute_address)

    def _restore(self, plan: ingress.Plan, request, event) -> Restore:
        """GET the stored blocks the compute node asked for into the blocks it named."""
        blocks = [RestoreBlock(b.block, b.hash, b.token_count, b.chunk_index, b.shared) for b in event.blocks]
        return self.agent.restore_blocks(plan.registration, request.user_id, request.tenant or "default", blocks,
                                         event.layer_groups)

    @staticmethod
    def _add_steps(record, arrival_ns: int, matched_ns: int, restores: list[Restore]) -> None:
        record.steps.append(compute_pb2.Step(step=Step.LOOKUP, name=steps.name(Step.LOOKUP),
                                             start_unix_ns=arrival_ns, end_unix_ns=matched_ns,
                                             service="smartnic"))
        for restore in restores:
            record.steps.append(compute_pb2.Step(step=Step.GET, name=steps.name(Step.GET),
                                                 start_unix_ns=restore.started_ns,
                                                 end_unix_ns=restore.done_ns or time.time_ns(),
                                                 bytes=restore.bytes, service="smartnic"))
        record.steps.sort(key=lambda s: (s.step, s.start_unix_ns))

    def _add_origin(self, record, restores: list[Restore]) -> None:
        """The record names this replica and how many restored blocks another replica's agent wrote."""
        record.replica = self.replica
        record.blocks_restored_other = min(record.blocks_restored, sum(r.other for r in restores))

    def _forward(self, name: str, request, context):
        address, _ = self.agent.compute_target()
        if not address:
            context.set_trailing_metadata((FAILED_SERVICE,))
            context.abort(grpc.StatusCode.UNAVAILABLE, "no compute node known: none registered a region "
                                                       "with compute_address and none is configured")
        remaining = context.time_remaining()  # 0 when the caller set no deadline
        timeout = remaining if 0 < remaining < 3600 else 60.0
        try:
            return getattr(self._stub(address), name)(request, timeout=timeout)
        except grpc.RpcError as exc:
            relay(context, exc, address)

    def EncodeChat(self, request, context):
        return self._forward("EncodeChat", request, context)

    def Decode(self, request, context):
        return self._forward("Decode", request, context)

    def Info(self, request, context):
        return self._forward("Info", request, context)

    def Stats(self, request, context):
        return self._forward("Stats", request, context)
