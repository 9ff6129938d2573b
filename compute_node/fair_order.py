"""Which user's sequence enters the batch next, and how a step's prefill budget is shared (pure).

Admission takes, of the user with the fewest sequences running (then the fewest in service: running,
restoring, or restored and ready; then the user admitted least recently, round-robin), that user's
next sequence: a restored (ready) one before a waiting one, each user's in their order. So a restored
sequence waits for its user's turn like any other (the ready queue is no first-come shortcut), and a
user with nothing running is always next: a newcomer's first turn starts at the next free place.

A greedy user: one that holds more than half of the running sequences (and at least two). While one
does, a newcomer (a user with nothing running) may take one of `newcomer_slots` places past the
batch's max_num_seqs rather than wait for the greedy user's turn to end, and its first token gets a
step of its own (the scheduler's first-token step), never twice in a row, so the greedy user's decodes
lose at most every other step while newcomers keep coming. With no greedy user (many users with a
sequence or two each) none of this applies: prefills and decodes share every step as before.
"""
from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Mapping

from compute_node.sequence import Sequence


def heads(ready: Iterable[Sequence], waiting: Iterable[Sequence]) -> dict:
    """Each user's next sequence: its first ready one, else its first waiting one."""
    out: dict = {}
    for seq in ready:
        out.setdefault(seq.user_id, seq)
    for seq in waiting:
        out.setdefault(seq.user_id, seq)
    return out


def next_admission(ready: Iterable[Sequence], waiting: Iterable[Sequence], running: Mapping,
                   served: Mapping, last_admitted: Mapping,
                   eligible: Callable[[Sequence], bool] = lambda seq: True) -> Sequence | None:
    """The next sequence to admit among the eligible heads (see the module's docstring), or None."""
    candidates = [seq for seq in heads(ready, waiting).values() if eligible(seq)]
    if not candidates:
        return None
    return min(candidates, key=lambda seq: (running.get(seq.user_id, 0), served.get(seq.user_id, 0),
                                            last_admitted.get(seq.user_id, -1)))


def has_greedy_user(running: Iterable[Sequence]) -> bool:
    """Whether one user holds more than half of the running sequences, and at least two."""
    counts = collections.Counter(seq.user_id for seq in running)
    if not counts:
        return False
    most = max(counts.values())
    return most >= 2 and 2 * most > sum(counts.values())


def prefill_shares(prefills: list[Sequence], budget: int, reserve: bool) -> dict:
    """Tokens each user's prefills may take this step: the budget split evenly (max-min) across
    users by what their prefills still need; with reserve, one more share is left for admissions."""
    need: dict = collections.defaultdict(int)
    for seq in prefills:
        need[seq.user_id] += seq.num_tokens_to_compute
    shares = dict.fromkeys(need, 0)
    left = budget
    if reserve:  # waiting users count as one more user with a need as large as the budget
        left -= budget // (len(need) + 1)
    active = [u for u in need if need[u]]
    while left > 0 and active:
        each = max(1, left // len(active))
        for user in list(active):
            give = min(each, need[user] - shares[user], left)
            shares[user] += give
            left -= give
            if shares[user] == need[user]:
                active.remove(user)
    return shares


def in_service(*groups: Iterable[Sequence]) -> collections.Counter:
    """Sequences per user over the groups (running, ready, restoring: those holding blocks)."""
    counts = collections.Counter()
    for group in groups:
        counts.update(seq.user_id for seq in group)
    return counts
