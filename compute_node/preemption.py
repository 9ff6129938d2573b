"""The engine's preemption work: what a victim of preemption keeps, and the engine's own time spent so.

Under `swap` a victim stores what it has not stored yet (the offload room's PUTs) and is restored from
storage when re-admitted (the restore room); under `swap-host` its blocks are copied into the host swap
tier (compute_node.host_swap: vLLM's CPU swap space) right after scheduling, before the forward writes
any of them, and back when it is re-admitted; under `recompute` it keeps nothing. The engine's own time
in this work is kept in `cost` (compute_node.preemption_cost). Engine thread only.
"""
from __future__ import annotations

import logging
import time

from compute_node.host_swap import HostSwapStore, capacity_bytes
from compute_node.preemption_cost import PreemptionCost
from compute_node.scheduler import RestoreRequest, SchedulerOutput, SwapOut
from compute_node.sequence import SequenceStatus
from compute_node.turn_state import TurnState

logger = logging.getLogger(__name__)

NO_HOST_SWAP = {"swap_host_bytes_out": 0, "swap_host_bytes_in": 0, "swap_host_blocks_out": 0,
                "swap_host_blocks_in": 0, "swap_host_fallbacks": 0, "swap_host_full": 0, "swap_host_used_bytes": 0,
                "swap_host_capacity_bytes": 0, "swap_host_sequences": 0}


class Preemption:
    """Swap-outs (to storage or the host tier), swap-ins from the host tier, and their cost."""

    def __init__(self, settings, layout, pool, scheduler, offloads, joined: dict[int, TurnState],
                 cost: PreemptionCost):
        self.scheduler, self.offloads, self._joined, self.cost = scheduler, offloads, joined, cost
        self.host_swap = (HostSwapStore(layout, pool.region.array,
                                        capacity_bytes(layout, settings.swap_space_blocks * layout.block_tokens))
                          if settings.preemption == "swap-host" else None)

    def snapshot(self) -> dict:
        return {**self.cost.as_dict(), **(self.host_swap.snapshot() if self.host_swap is not None else NO_HOST_SWAP)}

    def swap_out(self, out: SchedulerOutput, states: dict[int, TurnState]) -> None:
        """Store what each swap victim has not stored yet (its pins go once all of it is stored), or copy
        a swap-host victim's blocks into the host swap tier."""
        for swap in out.swapped_out:
            start = time.perf_counter()
            state = states[swap.seq.seq_id]
            if swap.kind == "swap-host":
                self._swap_out_host(swap)
            else:
                self.offloads.swap_out(state, swap)
            state.preemptions += 1
            self.cost.swap_out_s += time.perf_counter() - start

    def _swap_out_host(self, swap: SwapOut) -> None:
        """Copy the victim's blocks into the host tier now, before the step's forward writes any of them;
        recompute it instead when they do not fit, or when its KV is still landing (a joined restore)."""
        seq, store = swap.seq, self.host_swap
        if store is None:
            raise RuntimeError("a swap-host preemption without the host swap tier")
        if seq.seq_id in self._joined:  # later layer groups may not be there: never keep doubtful KV
            store.fallback()
            self.scheduler.swap_failed(seq)
        elif store.swap_out(seq.seq_id, swap.block_ids) is None:  # the tier is full (counted there)
            self.scheduler.swap_failed(seq)

    def swaps_in(self, request: RestoreRequest) -> bool:
        """Whether the re-admitted sequence comes back from the host tier (else from storage)."""
        return self.host_swap is not None and request.seq.seq_id in self.host_swap

    def swap_in(self, request: RestoreRequest) -> None:
        """Copy a swap-host sequence's blocks back from the host tier into the blocks its restore got; what
        did not come back (a missing or doubtful copy) is prefilled again."""
        start = time.perf_counter()
        seq = request.seq
        got = self.host_swap.swap_in(seq.seq_id, seq.token_ids, request.first_token, request.num_tokens,
                                     request.block_indexes, request.block_ids)
        if got.reason:
            logger.warning("sequence %s: swap-in stopped at token %d of %d (%s); the rest is prefilled again",
                           seq.seq_id, got.covered, request.num_tokens, got.reason)
        self.scheduler.restore_done(seq, got.covered)
        self.cost.swap_in_s += time.perf_counter() - start

    def drop_unused_copies(self, states: dict[int, TurnState]) -> None:
        """Host copies of sequences that are no longer swapped out (found their KV in the prefix cache, fell
        back to recompute, ended): they will never be copied back."""
        if self.host_swap is None or not len(self.host_swap):
            return
        for seq_id in list(self.host_swap.swapped):
            state = states.get(seq_id)
            if state is None or state.seq.status is not SequenceStatus.SWAPPED:
                self.host_swap.discard(seq_id)

    def forget(self, seq_id: int) -> None:
        """A turn left the engine: its host copy, if any, goes."""
        if self.host_swap is not None:
            self.host_swap.discard(seq_id)
