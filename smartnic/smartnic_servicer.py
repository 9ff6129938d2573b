"""The SmartNic gRPC service: registration, counters, triggered operations, requester, stats."""
from __future__ import annotations

import threading
import time

from kvtb_proto import smartnic_pb2, smartnic_pb2_grpc
from scale.dilation import pacing_json
from smartnic.agent import Agent
from smartnic.datapath import ChunkRef
from smartnic.grpc_errors import rpc
from smartnic.requester import StoredBlock
from smartnic.watcher import CounterWork, DataWork, OpError


def _ref(chunk: smartnic_pb2.ChunkRef) -> ChunkRef:
    if not chunk.user_id or not chunk.context_id or chunk.token_end <= chunk.token_start:
        raise ValueError(f"chunk ref needs a user, a context and tokens [start, end) with end > start; "
                         f"got {chunk.user_id!r}, {chunk.context_id!r}, "
                         f"[{chunk.token_start}, {chunk.token_end})")
    return ChunkRef(chunk.user_id, chunk.context_id, chunk.chunk_index, chunk.token_start, chunk.token_end)


def _work(op: smartnic_pb2.TriggeredOp, layout):
    """(work, completion counter or None) of one TriggeredOp (one-off PUTs and GETs: plain regions)."""
    kind = op.WhichOneof("op")
    if kind in ("put", "get"):
        if layout is not None:
            raise ValueError("a region with a kv_layout has standing PUTs and stream restores, not one-off "
                             f"{kind}s")
        data = getattr(op, kind)
        return DataWork(kind, _ref(data.chunk), tuple((r.offset, r.length) for r in data.ranges),
                        (data.token_ids.offset, data.token_ids.length)), op.completion_counter
    if kind in ("counter_add", "counter_set"):
        c = getattr(op, kind)
        return CounterWork(kind.removeprefix("counter_"), c.counter, c.value), None
    raise ValueError("a triggered op needs put, get, counter_add or counter_set")


def descriptor(b: StoredBlock, block_tokens: int = 0) -> smartnic_pb2.ChunkDescriptor:
    start = b.chunk_index * block_tokens
    return smartnic_pb2.ChunkDescriptor(chunk_index=b.chunk_index, token_start=start, token_end=start + b.token_count,
                                        storage_node=b.storage_node, key=b.key, length=b.length, crc32c=b.crc32c,
                                        hash=b.hash, last_use_unix_s=b.last_use, shared=b.shared)


def _op_error(e: OpError) -> smartnic_pb2.OpError:
    msg = smartnic_pb2.OpError(op_id=e.op_id, completion_counter=e.completion_counter, kind=e.kind,
                               message=e.message)
    if e.ref:
        msg.chunk.CopyFrom(smartnic_pb2.ChunkRef(user_id=e.ref.user_id, context_id=e.ref.context_id,
                                                 chunk_index=e.ref.chunk_index, token_start=e.ref.token_start,
                                                 token_end=e.ref.token_end))
    return msg


class SmartNicServicer(smartnic_pb2_grpc.SmartNicServicer):
    """Thin: translate messages and call the agent."""

    def __init__(self, agent: Agent):
        self.agent = agent

    def _reg(self, ref):
        return self.agent.registration(ref.region_id, ref.access_key)

    @rpc
    def RegisterMemory(self, request, context):
        reg = self.agent.register(
            request.shm_name, request.size_bytes, request.access_key, request.counter_offset,
            request.counter_count, request.kv_layout if request.HasField("kv_layout") else None,
            request.owner, request.compute_address)
        return smartnic_pb2.RegisterMemoryResponse(region_id=reg.region_id)

    @rpc
    def DeregisterMemory(self, request, context):
        self.agent.deregister(request.region_id, request.access_key)
        return smartnic_pb2.DeregisterMemoryResponse()

    @rpc
    def CounterAdd(self, request, context):
        s, e = self._reg(request.counter).add(request.counter.counter, request.success, request.error)
        return smartnic_pb2.CounterValue(success=s, error=e)

    @rpc
    def CounterSet(self, request, context):
        s, e = self._reg(request.counter).set(request.counter.counter, request.success, request.error)
        return smartnic_pb2.CounterValue(success=s, error=e)

    @rpc
    def CounterRead(self, request, context):
        s, e = self._reg(request).region.read_counter(request.counter)
        return smartnic_pb2.CounterValue(success=s, error=e)

    @rpc
    def CounterWait(self, request, context):
        reg, counter = self._reg(request.counter), request.counter.counter
        deadline = time.monotonic() + (request.timeout_s or 10.0)
        ended = threading.Event()  # the call ended (its caller went away): stop polling for it
        context.add_callback(ended.set)
        sleep = 20e-6
        while True:
            s, e = reg.region.read_counter(counter)
            if s + e >= request.threshold:
                return smartnic_pb2.CounterValue(success=s, error=e)
            if time.monotonic() > deadline or ended.is_set():
                raise TimeoutError(f"counter {counter} is at {s}+{e}, below {request.threshold}, "
                                   f"after {request.timeout_s} s")
            time.sleep(sleep)
            sleep = min(sleep * 2, 1e-3)

    @rpc
    def QueueTriggered(self, request, context):
        if not request.ops:
            return smartnic_pb2.QueueTriggeredResponse()
        first = request.ops[0]
        if any((op.region_id, op.access_key) != (first.region_id, first.access_key) for op in request.ops):
            raise ValueError("every op of one QueueTriggered call must name the same region")
        reg = self.agent.registration(first.region_id, first.access_key)
        works = [(op.trigger_counter, op.threshold, *_work(op, reg.layout)) for op in request.ops]
        return smartnic_pb2.QueueTriggeredResponse(op_ids=self.agent.queue_triggered(reg, works))

    @rpc
    def CancelCounter(self, request, context):
        reg = self._reg(request.counter)
        return smartnic_pb2.CancelResponse(cancelled=self.agent.cancel(reg, request.counter.counter))

    @rpc
    def Flush(self, request, context):
        return smartnic_pb2.FlushResponse(cancelled=self.agent.flush(self._reg(request)))

    @rpc
    def ReadErrors(self, request, context):
        errors = self.agent.read_errors(self._reg(request), request.max_errors or 100)
        return smartnic_pb2.ReadErrorsResponse(errors=[_op_error(e) for e in errors])

    @rpc
    def Lookup(self, request, context):
        blocks = self.agent.lookup(request.user_id, request.context_id)
        bt = self.agent.block_tokens()
        return smartnic_pb2.LookupResponse(chunks=[descriptor(b, bt) for b in blocks],
                                           bytes=sum(b.length for b in blocks))

    @rpc
    def ListContexts(self, request, context):
        refs = [smartnic_pb2.ContextRef(user_id=user, context_id=ctx)
                for user, ctx in self.agent.list_contexts(request.user_id)]
        return smartnic_pb2.ListContextsResponse(contexts=refs)

    @rpc
    def DropContext(self, request, context):
        return smartnic_pb2.DropContextResponse(
            chunks_deleted=self.agent.drop_context(request.user_id, request.context_id))

    @rpc
    def Stats(self, request, context):
        s = self.agent.snapshot()
        return smartnic_pb2.StatsResponse(
            hits=s.get("hits", 0), misses=s.get("misses", 0), bytes_put=s.get("bytes_put", 0),
            bytes_got=s.get("bytes_got", 0), evictions_by_reason=s["evictions_by_reason"],
            triggered_fired=s.get("triggered_fired", 0), trigger_to_fire_p50_us=s["p50"],
            trigger_to_fire_p99_us=s["p99"], queue_depth=s["queue_depth"], errors_by_kind=s["errors_by_kind"],
            bytes_stored=s["bytes_stored"], contexts=s["contexts"], chunks=s["chunks"],
            bytes_by_storage_node=s["bytes_by_storage_node"], prefetches=s.get("prefetches", 0),
            denied=s.get("denied", 0), puts_skipped=s.get("puts_skipped", 0),
            discovery_requests=s.get("discovery_requests", 0), discovered_blocks=s.get("discovered_blocks", 0),
            discovery_timeouts=s.get("discovery_timeouts", 0),
            deletes_refused_leased=s.get("deletes_refused_leased", 0), pacing_json=pacing_json())
