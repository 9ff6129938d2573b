"""How long a step takes, learned from the steps the engine ran, and how many prefill tokens fit a target
step time while other users wait (pure: no clock, no torch; the engine feeds each step's seconds).

A step's time is modelled as  a + b * tokens + c * kpairs,  where tokens are the step's new tokens and
kpairs its attention work in thousands of (query, key) pairs: a new token at position p attends to p + 1
keys, so a chunk deep in a long prompt costs more per token than one at its start. The coefficients are
fitted by least squares over the steps seen, each step's weight decaying by `decay` per later step (the
estimate follows the machine and the mix of work), every coefficient >= 0 (a fit with a negative one
gives way to the best fit over fewer terms). Until `MIN_STEPS` steps were seen nothing is capped.

The scheduler (compute_node.scheduler) asks `fit` for the most tokens of a prefill that keep the step's
predicted time within the step's target (`step_target`): `target_s` while another user's sequence runs
beside the prefill (its every token waits for the step); HOLD_FRACTION of it while another user's turn
is about to start (waiting, restoring) and for `hold_s` of stepped time after another user was last
seen: a user's next turn usually follows its last by milliseconds, and all it waits for then is the
step in progress. Alone, a long prompt prefills in full chunks (max_num_batched_tokens), at full speed.
vLLM caps a long prefill's chunk by a fixed long_prefill_token_threshold; this budget is in seconds,
measured.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable

import numpy as np

MIN_STEPS = 3          # steps seen before the estimate is used
DECAY = 0.9            # weight of a step's observation, per step after it
HOLD_S = 2.0           # stepped seconds the cap stays on after another user was last seen
HOLD_FRACTION = 0.5    # of target_s: a step's target while another user's turn is about to start
TERMS = ("overhead", "tokens", "kpairs")


def kpairs(start: int, num_tokens: int) -> float:
    """Thousands of (query, key) pairs the tokens [start, start + num_tokens) attend over (causal)."""
    if start < 0 or num_tokens < 0:
        raise ValueError(f"negative start {start} or num_tokens {num_tokens}")
    return (num_tokens * start + num_tokens * (num_tokens + 1) / 2) / 1000.0


def features(runs: Iterable[tuple[int, int]]) -> np.ndarray:
    """[1, tokens, kpairs] of a step whose runs are (start, num_tokens) per sequence."""
    tokens = pairs = 0.0
    for start, n in runs:
        tokens += n
        pairs += kpairs(start, n)
    return np.array([1.0, tokens, pairs])


class StepBudget:
    """The step-time estimate and each step's target. Not thread-safe: the engine thread only."""

    def __init__(self, target_s: float, *, hold_s: float = HOLD_S, decay: float = DECAY,
                 min_steps: int = MIN_STEPS):
        if not target_s > 0:
            raise ValueError(f"target_s must be positive, got {target_s}")
        if not 0 < decay < 1 or hold_s < 0 or min_steps < 1:
            raise ValueError(f"need 0 < decay < 1 ({decay}), hold_s >= 0 ({hold_s}) and min_steps >= 1 ({min_steps})")
        self.target_s, self.hold_s, self.decay, self.min_steps = target_s, hold_s, decay, min_steps
        self._xx = np.zeros((3, 3))   # decayed sums of x x^T, x y, y^2 over the steps seen
        self._xy = np.zeros(3)
        self._yy = 0.0
        self.steps = 0
        self.clock_s = 0.0            # stepped time: the sum of every step's seconds
        self._contended_at: float | None = None
        self.coef: np.ndarray | None = None  # [a, b, c] once fitted

    # -- the engine: after each step
    def observe(self, runs: Iterable[tuple[int, int]], seconds: float) -> None:
        """A step ran these (start, num_tokens) runs in `seconds` (its forward, sampling and streaming)."""
        if seconds < 0:
            raise ValueError(f"negative step time {seconds}")
        x = features(runs)
        if not x[1]:
            return
        self.clock_s += seconds
        self._xx = self.decay * self._xx + np.outer(x, x)
        self._xy = self.decay * self._xy + x * seconds
        self._yy = self.decay * self._yy + seconds * seconds
        self.steps += 1
        if self.steps >= self.min_steps:
            self.coef = self._solve()

    def _solve(self) -> np.ndarray | None:
        """The non-negative least-squares fit over the subsets of terms (the full one when it is valid)."""
        best, best_sse = None, float("inf")
        for size in (3, 2, 1):
            for terms in itertools.combinations(range(3), size):
                idx = list(terms)
                a = self._xx[np.ix_(idx, idx)]
                a = a + np.eye(len(idx)) * 1e-12 * max(1.0, float(np.trace(a)))
                try:
                    sub = np.linalg.solve(a, self._xy[idx])
                except np.linalg.LinAlgError:
                    continue
                if not np.all(np.isfinite(sub)) or np.any(sub < 0):
                    continue
                beta = np.zeros(3)
                beta[idx] = sub
                sse = self._yy - 2 * beta @ self._xy + beta @ self._xx @ beta
                if sse < best_sse - 1e-15:
                    best, best_sse = beta, sse
        return best

    # -- the scheduler: before each step
    def step_target(self, others: bool, others_running: bool) -> float | None:
        """This step's target in seconds, or None (not capped): target_s when another user's sequence runs
        (`others_running`); HOLD_FRACTION of it when another user's turn waits or restores (`others`) or
        did within hold_s of stepped time."""
        if others or others_running:
            self._contended_at = self.clock_s
        if others_running:
            return self.target_s
        if others or (self._contended_at is not None and self.clock_s - self._contended_at <= self.hold_s):
            return self.target_s * HOLD_FRACTION
        return None

    def predict(self, runs: Iterable[tuple[int, int]]) -> float | None:
        """A step's predicted seconds (None before the estimate is made)."""
        if self.coef is None:
            return None
        return float(self.coef @ features(runs))

    def fit(self, runs: Iterable[tuple[int, int]], start: int, limit: int, target_s: float | None = None) -> int:
        """The most tokens (<= limit) of a run at `start` that keep the predicted time of a step of these
        runs and it within target_s (default: the budget's): limit before the estimate is made, 0 when not
        one token fits."""
        target_s = self.target_s if target_s is None else target_s
        if self.coef is None or limit <= 0:
            return max(0, limit)
        base = self.predict(runs)
        _, b, c = self.coef

        def within(n: int) -> bool:
            return base + b * n + c * kpairs(start, n) <= target_s
        if within(limit):
            return limit
        lo, hi = 0, limit  # within(lo), not within(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if within(mid):
                lo = mid
            else:
                hi = mid
        return lo


class StepCap:
    """One step's cap on prefill chunks: its StepBudget's target for the step (by the users with work
    here and running), or none (no budget, or the step is not contended: chunks stay full)."""

    def __init__(self, budget: StepBudget | None, users_here: int = 0, users_running: int = 0):
        self.budget = budget
        self.target = None if budget is None else budget.step_target(users_here > 1, users_running > 1)

    @property
    def on(self) -> bool:
        return self.target is not None

    def tokens(self, scheduled: Iterable[tuple[int, int, bool]], start: int, tokens: int,
               reserved: Iterable[tuple[int, int]] = ()) -> int:
        """Of `tokens` of a prefill at `start`, those that keep the step's predicted time (the (start,
        num_tokens, is_decode) runs scheduled so far and the `reserved` runs) within the target; at least
        one when only decodes are scheduled and nothing is reserved, so that prefills always move on."""
        if self.target is None or not tokens:
            return tokens
        scheduled, reserved = list(scheduled), list(reserved)
        fit = self.budget.fit([(s, n) for s, n, _ in scheduled] + reserved, start, tokens, self.target)
        if not fit and not reserved and all(decode for _, _, decode in scheduled):
            return 1
        return fit
