"""The recompute-vs-swap study's definitions (pure: no services, no clock).

"Overhead" of a preemption strategy, measured two ways on the same batch of requests issued at once:

- extra end to end: the batch's makespan (first request issued to last reply ended) at a tight pool
  minus the same batch's makespan on a pool that never runs out, under the same turn policy
  (`extra_e2e`); also as a fraction of the latter;
- extra CPU time: the same difference in CPU seconds of the serving processes (compute node, agent,
  storage node), which stretches far less than wall time when other work shares the cores
  (`extra_cpu`);
- the engine's own time in preemption work: the compute node's counters
  (compute_node.preemption_cost) over the batch: forward time on tokens computed again after a
  recompute preemption, plus the swaps' copies out and in and the swapped sequences' waits for
  their blocks from storage (`engine_overhead`).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

ENGINE_FIELDS = ("preempt_recompute_s", "preempt_recompute_tokens", "preempt_swap_s", "preempt_swap_out_s",
                 "preempt_swap_in_s", "preempt_swap_wait_s", "swap_host_bytes_out", "swap_host_bytes_in",
                 "swap_host_fallbacks", "prefix_cache_hits")  # hits: tokens found in the prefix cache (0 with it off)


def blocks_for(tokens: int, block_tokens: int) -> int:
    return -(-tokens // block_tokens)


def need_tokens(requests: int, input_tokens: int, output_tokens: int, block_tokens: int) -> int:
    """Pool tokens that hold every request's KV at its longest at once (whole blocks): the 100% of the
    poster's "available memory" axis. A sequence's KV never covers its last generated token."""
    if min(requests, input_tokens, output_tokens, block_tokens) <= 0:
        raise ValueError("requests, input, output and block tokens must be positive")
    return requests * blocks_for(input_tokens + output_tokens - 1, block_tokens) * block_tokens


def pool_for_share(share: float, requests: int, input_tokens: int, output_tokens: int, block_tokens: int) -> int:
    """Pool tokens (whole blocks) for `share` of need_tokens, never less than one request needs alone
    plus one block (the engine refuses a request that could never fit)."""
    if share <= 0:
        raise ValueError(f"share must be positive, got {share}")
    need = need_tokens(requests, input_tokens, output_tokens, block_tokens)
    one = (blocks_for(input_tokens + output_tokens - 1, block_tokens) + 1) * block_tokens
    return max(int(share * need) // block_tokens * block_tokens, one)


def extra_e2e(tight_s: float, ample_s: float) -> dict:
    """The extra end-to-end time of a tight pool over an ample one: seconds and fraction."""
    if ample_s <= 0:
        raise ValueError(f"the ample run's time must be positive, got {ample_s}")
    return {"extra_e2e_s": tight_s - ample_s, "extra_e2e_frac": (tight_s - ample_s) / ample_s}


SERVICES = ("compute", "smartnic", "storage-0")  # the processes a batch's work runs in (not the client)


def cpu_delta(before: Mapping[str, float], after: Mapping[str, float], services=SERVICES) -> float:
    """CPU seconds (user + system) the serving processes used between two readings."""
    return sum(after.get(name, 0.0) - before.get(name, 0.0) for name in services)


def extra_cpu(tight_s: float, ample_s: float) -> dict:
    """The extra CPU time of the serving processes at a tight pool over an ample one: seconds and fraction.
    On a CPU shared with other work, wall time stretches with the others' load; CPU time much less so:
    it stands for the poster's GPU busy time."""
    if ample_s <= 0:
        raise ValueError(f"the ample run's CPU time must be positive, got {ample_s}")
    return {"extra_cpu_s": tight_s - ample_s, "extra_cpu_frac": (tight_s - ample_s) / ample_s}


def counter_delta(before: Mapping, after: Mapping) -> dict:
    """after - before of the engine's preemption counters (missing ones count 0)."""
    return {k: after.get(k, 0) - before.get(k, 0) for k in ENGINE_FIELDS}


def engine_overhead(delta: Mapping) -> dict:
    """The engine's own time in preemption work over a batch: recompute, swap (copies and waits) and
    their sum; and the part of it that stopped the engine (the copies, not the waits)."""
    recompute = float(delta.get("preempt_recompute_s", 0.0))
    swap = float(delta.get("preempt_swap_s", 0.0))
    copies = float(delta.get("preempt_swap_out_s", 0.0)) + float(delta.get("preempt_swap_in_s", 0.0))
    return {"engine_recompute_s": recompute, "engine_swap_s": swap, "engine_total_s": recompute + swap,
            "engine_blocking_s": recompute + copies}


def throughput_series(token_times: Sequence[float], start: float, end: float, bin_s: float) -> list[tuple[float, float]]:
    """(bin start - start, tokens/s) per bin of bin_s from start to end, from every token's arrival time."""
    if bin_s <= 0:
        raise ValueError("bin_s must be positive")
    bins = max(1, math.ceil((end - start) / bin_s))
    counts = [0] * bins
    for t in token_times:
        k = int((t - start) // bin_s)
        if 0 <= k < bins:
            counts[k] += 1
    return [(k * bin_s, c / bin_s) for k, c in enumerate(counts)]


def rebin(series: Sequence[tuple[float, float]], factor: int) -> list[tuple[float, float]]:
    """A rate series averaged over `factor` consecutive bins (the poster's average throughput)."""
    if factor < 1:
        raise ValueError("factor must be >= 1")
    out = []
    for k in range(0, len(series), factor):
        chunk = series[k:k + factor]
        out.append((chunk[0][0], sum(v for _, v in chunk) / len(chunk)))
    return out
