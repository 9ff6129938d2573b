"""The ComputeNode service served by the agent in front of its compute node (steps 5 and 6).

Thin and asynchronous (a grpc.aio servicer): Generate asks `smartnic.ingress` what to do with the turn
(step 5: match-action, the stored prefix by content), forwards it with `stored_tokens` filled in, GETs
the blocks each `restore` event of the compute node's stream asks for (step 6; the event goes no
further), and adds the agent's steps to the record on the way back, with its replica's name and how
many restored blocks another replica's agent stored (`blocks_restored_other`). The other methods are
forwarded unchanged. It dials its compute node as the peer its settings name (`compute_identity`).

A relayed turn holds no thread: its stream is a task on the agent's event loop, and only the short
blocking steps (the lookup, which may ask the storage nodes; the start of a restore) run in the
`blocking` thread pool. At most `max_turns` turns are relayed at once; past it RESOURCE_EXHAUSTED
(a bound of its own, far above the compute node's batch: turns past the batch wait in its scheduler).

The compute node's errors are relayed with their status; when it cannot be reached (or there
is none), UNAVAILABLE names it and its address and the trailing metadata `kvtb-failed-service:
compute-node` says so, so the frontend blames the compute node, not the agent.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import time

import grpc

from kvtb import steps
from kvtb.logs import request_context
from kvtb.rpc import Security, aio_channel
from kvtb.steps import Step
from kvtb_proto import compute_pb2, compute_pb2_grpc
from scale import dilation, software
from smartnic import ingress
from smartnic.agent import Agent
from smartnic.restore_path import Restore, RestoreBlock

logger = logging.getLogger(__name__)

FAILED_SERVICE = ("kvtb-failed-service", "compute-node")  # trailing metadata of UNAVAILABLE
FORWARD_TIMEOUT_S = 60.0  # a forwarded unary call whose caller set no deadline


async def relay(context, exc: grpc.RpcError, address: str) -> None:
    """Abort with the compute node's status; UNAVAILABLE names the node and its address."""
    code, details = exc.code(), exc.details() or str(exc)
    if code == grpc.StatusCode.UNAVAILABLE:
        context.set_trailing_metadata((FAILED_SERVICE,))
        details = f"the compute node at {address} is unavailable: {details}"
    await context.abort(code, details)


def _charged(fn, *args):
    """fn(*args), its CPU time stretched by D under a hardware profile (the control plane is software)."""
    with software.charged(dilation.current(), software.AGENT):
        return fn(*args)


def parse_peer(peer: str) -> tuple[str, int]:
    """("127.0.0.1", 54321) from a gRPC peer string such as "ipv4:127.0.0.1:54321"."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        host, _, port = rest.rpartition(":")
        return host.strip("[]"), int(port or 0)
    return "0.0.0.0", 0


class ComputeProxyServicer(compute_pb2_grpc.ComputeNodeServicer):
    """Use from the agent's event loop only: stubs are cached per compute address."""

    def __init__(self, agent: Agent, security: Security, listen_host: str = "127.0.0.1", listen_port: int = 0,
                 compute_identity: str = "compute", replica: str = "replica-0",
                 blocking: concurrent.futures.Executor | None = None, max_turns: int = 1024):
        if max_turns <= 0:
            raise ValueError(f"max_turns must be positive, got {max_turns}")
        self.agent = agent
        self.security = security
        self.compute_identity, self.replica = compute_identity, replica  # the peer it dials; TurnRecord.replica
        self.listen_host, self.listen_port = listen_host, listen_port
        self.blocking = blocking  # None: the loop's default executor
        self.max_turns = max_turns
        self.turns = 0             # turns being relayed now
        self.turns_peak = 0
        self.turns_refused = 0
        self._stubs: dict[str, compute_pb2_grpc.ComputeNodeStub] = {}
        self._channels: list[grpc.aio.Channel] = []

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()

    def figures(self) -> dict:
        """The relay's own counters, for the agent's metrics (read from any thread)."""
        return {"relayed_turns": self.turns, "relayed_turns_peak": self.turns_peak,
                "relayed_turns_refused": self.turns_refused}

    def _stub(self, address: str) -> compute_pb2_grpc.ComputeNodeStub:
        if address not in self._stubs:
            channel = aio_channel(address, self.security, peer=self.compute_identity)
            self._channels.append(channel)
            self._stubs[address] = compute_pb2_grpc.ComputeNodeStub(channel)
        return self._stubs[address]

    async def _off_loop(self, fn, *args):
        """fn(*args) in the blocking pool (it may wait on a lock or the storage nodes), in this task's
        context (its log lines keep the turn's request id)."""
        run = functools.partial(contextvars.copy_context().run, _charged, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self.blocking, run)

    def _packet(self, request, context) -> ingress.Packet:
        src, sport = parse_peer(context.peer())
        return ingress.Packet(request.user_id, request.context_id, src, sport, self.listen_host,
                              self.listen_port)

    async def Generate(self, request, context):
        if self.turns >= self.max_turns:
            self.turns_refused += 1
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"the agent relays {self.turns} turns already (max_relayed_turns {self.max_turns})")
        self.turns += 1
        self.turns_peak = max(self.turns_peak, self.turns)
        try:
            with request_context(request.request_id):
                async for event in self._generate(request, context):
                    yield event
        finally:
            self.turns -= 1

    async def _plan(self, request, context) -> ingress.Plan:
        """Step 5, off the loop; a refusal aborts the call with its status."""
        packet = self._packet(request, context)
        try:
            return await self._off_loop(ingress.plan, self.agent, packet, request.tenant or "default",
                                        request.token_ids,
                                        min(request.shared_prefix_tokens, len(request.token_ids)))
        except ingress.Refused as exc:
            code = grpc.StatusCode.RESOURCE_EXHAUSTED if exc.kind == "rate_limited" else grpc.StatusCode.PERMISSION_DENIED
            await context.abort(code, str(exc))
        except ingress.NoComputeNode as exc:
            context.set_trailing_metadata((FAILED_SERVICE,))
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))

    async def _generate(self, request, context):
        arrival_ns = time.time_ns()
        plan = await self._plan(request, context)
        forwarded = compute_pb2.TurnRequest()
        forwarded.CopyFrom(request)
        forwarded.stored_tokens = plan.stored_tokens
        logger.info("turn of %s/%s to %s: %s, %d tokens of its prefix stored", request.user_id,
                    request.context_id, plan.compute_address, plan.action.type, plan.stored_tokens,
                    extra={"event": "turn", "user_id": request.user_id, "context_id": request.context_id})
        remaining = context.time_remaining()
        call = self._stub(plan.compute_address).Generate(forwarded, timeout=remaining if remaining else None)
        restores: list[Restore] = []
        try:
            async for event in call:
                if event.HasField("restore"):  # step 6: the compute node allocated the blocks
                    restores.append(await self._restore(plan, request, event.restore))
                    continue
                if event.HasField("record"):
                    self._add_steps(event.record, arrival_ns, plan.decided_ns, restores)
                    self._add_origin(event.record, restores)
                yield event
        except grpc.aio.AioRpcError as exc:  # the compute node's status (a caller gone cancels this task)
            await relay(context, exc, plan.compute_address)
        finally:
            call.cancel()  # the caller went away (this task cancelled) or the turn ended: no-op then

    async def _restore(self, plan: ingress.Plan, request, event) -> Restore:
        """GET the stored blocks the compute node asked for into the blocks it named."""
        blocks = [RestoreBlock(b.block, b.hash, b.token_count, b.chunk_index, b.shared) for b in event.blocks]
        return await self._off_loop(self.agent.restore_blocks, plan.registration, request.user_id,
                                    request.tenant or "default", blocks, event.layer_groups)

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

    async def _forward(self, name: str, request, context):
        address, _ = self.agent.compute_target()
        if not address:
            context.set_trailing_metadata((FAILED_SERVICE,))
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no compute node known: none registered a region "
                                                             "with compute_address and none is configured")
        remaining = context.time_remaining()  # None when the caller set no deadline
        timeout = remaining if remaining and 0 < remaining < 3600 else FORWARD_TIMEOUT_S
        try:
            return await getattr(self._stub(address), name)(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            await relay(context, exc, address)

    async def EncodeChat(self, request, context):
        return await self._forward("EncodeChat", request, context)

    async def Decode(self, request, context):
        return await self._forward("Decode", request, context)

    async def Info(self, request, context):
        return await self._forward("Info", request, context)

    async def Stats(self, request, context):
        return await self._forward("Stats", request, context)
