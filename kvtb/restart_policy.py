"""When `kvtb up` restarts a replica that died, and when it gives up on it (compose's `restart: on-failure`).

Pure: no clock of its own, no processes; the caller passes the time (time.monotonic()) in.

- Each restart waits a delay: first_delay_s, then doubled at each restart, up to max_delay_s.
- A replica that stayed up for reset_after_s before it died starts again from first_delay_s (as Docker
  resets its delay once a container has run for 10 s).
- At most max_restarts restarts within any window_s: the death after those is the end of it (give up).
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Limits:
    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    max_restarts: int = 5      # within window_s; 0: never restart
    window_s: float = 300.0
    reset_after_s: float = 10.0

    def __post_init__(self):
        if not 0 <= self.first_delay_s <= self.max_delay_s:
            raise ValueError(f"delays must be 0 <= first_delay_s <= max_delay_s, got {self.first_delay_s}, "
                             f"{self.max_delay_s}")
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ValueError(f"max_restarts must be a whole number >= 0, got {self.max_restarts!r}")
        if self.window_s <= 0 or self.reset_after_s < 0:
            raise ValueError(f"window_s must be > 0 and reset_after_s >= 0, got {self.window_s}, "
                             f"{self.reset_after_s}")


class RestartPolicy:
    """One replica's restarts. Not thread-safe: its supervisor's loop owns it."""

    def __init__(self, limits: Limits = Limits()):
        self.limits = limits
        self.restarts: list[float] = []  # when each restart was granted, within the window
        self._delay = limits.first_delay_s
        self.gave_up = False

    def died(self, now: float, up_since: float | None) -> float | None:
        """The replica died (or its restart failed) at `now`, after being up since `up_since` (None: it never
        came up): the delay before restarting it, or None to give up (for good)."""
        if self.gave_up:
            return None
        lim = self.limits
        if up_since is not None and now - up_since >= lim.reset_after_s:
            self._delay = lim.first_delay_s
        self.restarts = [t for t in self.restarts if now - t < lim.window_s]
        if len(self.restarts) >= lim.max_restarts:
            self.gave_up = True
            return None
        delay = self._delay
        self._delay = min(lim.max_delay_s, max(delay * 2, lim.first_delay_s))
        self.restarts.append(now)
        return delay

    def describe(self) -> str:
        lim = self.limits
        return f"{len(self.restarts)} restarts within {lim.window_s:.0f} s (at most {lim.max_restarts})"
