"""Step 2/8 offload from the compute side: the triggered design and the no-offload policies.

Triggered (docs/contracts.md "A turn", point 4): after prefill one QueueTriggered call arms
a PUT per chunk the turn can fill (trigger: the slot's token counter at (i+1)*chunk_tokens,
completion: the slot's offload counter). While decoding, the compute process only stores
the token count into the counter at each chunk boundary. At the end it cancels what did
not fire and queues the partial last chunk at once; the slot is free once the offload
counter shows every fired PUT completed.

Every offloader measures its own stall: the time the engine thread spent inside it.
"""
from __future__ import annotations

import dataclasses
import logging
import time

from kvtb_proto import smartnic_pb2

from compute_node.kv_pool import KvPool

logger = logging.getLogger(__name__)

@dataclasses.dataclass
class OffloadTurn:
    """One turn's offload: which slot and context, and what the offloader did."""

    slot: int
    user_id: str
    context_id: str
    first_chunk: int         # chunks before it are already stored (restored unchanged)
    capacity_tokens: int     # tokens the slot can hold at the end of this turn
    stall_s: float = 0.0
    arm_s: float = 0.0
    armed: int = 0           # PUTs queued by arm()
    chunks: int = 0          # chunks offloaded (fired or stored)
    bytes: int = 0
    drain_counter: int = -1  # the slot is free once this counter reaches drain_target
    drain_target: int = 0
    last_stored: int = 0
    last_store_perf: float = 0.0
    arm_future: object = None    # the arming call in flight
    tail_future: object = None   # the partial last chunk's PUT, queued at the end


def settle_tail(turn: OffloadTurn) -> None:
    """Wait for the tail PUT's queueing; if it failed, the drain does not wait for it."""
    if turn.tail_future is None:
        return
    try:
        turn.tail_future.result()
    except Exception as exc:  # noqa: BLE001
        logger.warning("queueing the last chunk of slot %d failed: %s", turn.slot, exc)
        turn.drain_target -= 1
        turn.chunks -= 1
    turn.tail_future = None


class NoOffload:
    """resident and recompute: nothing leaves the slot."""

    def begin(self, turn: OffloadTurn, count: int) -> None:
        pass

    def arm(self, turn: OffloadTurn) -> None:
        pass

    def on_tokens(self, turn: OffloadTurn, count: int) -> None:
        pass

    def end(self, turn: OffloadTurn, count: int) -> None:
        pass


def chunk_bytes(pool: KvPool, start: int, end: int) -> int:
    """KV plus token id bytes of tokens [start, end)."""
    return (end - start) * (pool.layout.kv_bytes_per_token + 4)


class TriggeredOffload:
    """Arms triggered PUTs with the agent and bumps the slot's token counter (steps 2 and 8)."""

    def __init__(self, pool: KvPool, agent):
        self.pool = pool
        self.agent = agent
        self.layout = pool.layout

    def _put(self, turn: OffloadTurn, index: int, start: int, end: int,
             threshold: int) -> smartnic_pb2.TriggeredOp:
        L = self.layout
        return smartnic_pb2.TriggeredOp(
            region_id=self.agent.region_id, access_key=self.agent.access_key,
            trigger_counter=L.token_counter(turn.slot), threshold=threshold,
            completion_counter=L.offload_counter(turn.slot),
            put=smartnic_pb2.PutOp(slot=turn.slot, chunk=smartnic_pb2.ChunkRef(
                user_id=turn.user_id, context_id=turn.context_id, chunk_index=index, token_start=start,
                token_end=end)))

    def begin(self, turn: OffloadTurn, count: int) -> None:
        """Before prefill: the token counter goes back to the tokens already in the slot."""
        start = time.perf_counter()
        turn.drain_counter = self.layout.offload_counter(turn.slot)
        turn.drain_target = self.pool.counter_total(turn.drain_counter)
        self.pool.store_tokens(turn.slot, count)
        turn.last_stored = count
        turn.stall_s += time.perf_counter() - start

    def arm(self, turn: OffloadTurn) -> None:
        """Queue one PUT per full chunk the turn can fill, in one call that decoding does not wait for."""
        start = time.perf_counter()
        c = self.layout.chunk_tokens
        ops = [self._put(turn, i, i * c, (i + 1) * c, (i + 1) * c)
               for i in range(turn.first_chunk, turn.capacity_tokens // c)]
        turn.armed = len(ops)
        if ops:
            turn.arm_future = self.agent.queue_async(ops)
        turn.arm_s = time.perf_counter() - start
        turn.stall_s += turn.arm_s

    def on_tokens(self, turn: OffloadTurn, count: int) -> None:
        """The GPU thread's flag write, at each chunk boundary crossed."""
        c = self.layout.chunk_tokens
        if count // c > turn.last_stored // c:
            start = time.perf_counter()
            self.pool.store_tokens(turn.slot, count)
            turn.last_stored = count
            turn.last_store_perf = time.perf_counter()
            turn.stall_s += turn.last_store_perf - start

    def end(self, turn: OffloadTurn, count: int) -> None:
        """Cancel what did not fire; queue the partial last chunk; set the drain target."""
        start = time.perf_counter()
        c = self.layout.chunk_tokens
        if turn.arm_future is not None:
            try:
                turn.arm_future.result()
            except Exception as exc:  # noqa: BLE001 - nothing was armed: only the tail is offloaded
                logger.warning("arming the PUTs of slot %d failed: %s", turn.slot, exc)
                turn.armed = 0
        # Entries fire in threshold order: when the count reached the last threshold, none is left.
        last_threshold = (turn.first_chunk + turn.armed) * c
        unfired = turn.armed and turn.last_stored < last_threshold
        cancelled = 0
        if unfired:
            # The agent fires what the last store made due before it cancels the rest.
            cancelled = self.agent.cancel(self.layout.token_counter(turn.slot))
        fired_full = turn.armed - cancelled
        first = turn.first_chunk * c
        turn.chunks += fired_full
        turn.bytes += sum(chunk_bytes(self.pool, i * c, (i + 1) * c)
                          for i in range(turn.first_chunk, turn.first_chunk + fired_full))
        tail = count // c * c
        if count % c and tail >= first:
            self.pool.store_tokens(turn.slot, count)
            turn.last_stored = count
            turn.tail_future = self.agent.queue_async([self._put(turn, count // c, tail, count, count)])
            turn.chunks += 1
            turn.bytes += chunk_bytes(self.pool, tail, count)
        turn.drain_target += turn.chunks
        turn.stall_s += time.perf_counter() - start
