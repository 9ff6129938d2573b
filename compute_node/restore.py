"""Step 7 on the compute node: wait for a restore's completion counter and decide what it covers.

Waiting reads the shared counter (no RPC): a short spin, then sleeps that grow to 1 ms.
The decision is pure: anything doubtful yields fewer covered tokens and a reason, never a
wrong answer.
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class RestoreOutcome:
    """What a restore left in the slot: a verified prefix of the request's token ids."""

    covered: int            # tokens whose KV is reused
    announced: int          # tokens the restore said it would cover
    reason: str = ""        # why covered < announced (empty when it is not)
    bytes_restored: int = 0
    timed_out: bool = False


def matching_prefix(restored_ids: np.ndarray, request_ids: np.ndarray) -> int:
    """Length of the common prefix of two id arrays."""
    n = min(len(restored_ids), len(request_ids))
    differ = np.flatnonzero(restored_ids[:n] != request_ids[:n])
    return int(differ[0]) if differ.size else n


def decide(announced: int, errors: int, restored_ids: np.ndarray, request_ids: np.ndarray,
           bytes_announced: int) -> RestoreOutcome:
    """The prefix a finished restore covers (errors: none of it), capped so one token is left to prefill."""
    if errors:
        return RestoreOutcome(0, announced, f"restore failed: {errors} chunk(s) ended with an error")
    if announced > len(request_ids):
        return RestoreOutcome(0, announced, f"restore too long: {announced} tokens announced, more than the "
                                            f"request's {len(request_ids)}")
    covered = matching_prefix(restored_ids[:announced], request_ids[:announced])
    reason = ""
    if covered < announced:
        reason = f"token ids differ: the restored ids differ from the request's at position {covered} of {announced}"
        covered = 0  # chunks after a mismatch may be stale; do not trust a partial restore
    covered = min(covered, len(request_ids) - 1)
    return RestoreOutcome(covered, announced, reason, bytes_announced if covered else 0)


def timed_out(announced: int, timeout_s: float) -> RestoreOutcome:
    return RestoreOutcome(0, announced, f"restore timed out: not complete after {timeout_s:g} s", timed_out=True)
