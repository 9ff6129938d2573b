"""What a timed window costs the whole machine in CPU: busy core-seconds, from /proc/stat.

A transfer's work is spread over several processes (the agent, a storage node, the compute
stand-in) and over the kernel (a loopback TCP copy runs partly in softirq context), so it is
counted where all of it shows: the busy time of every core. Busy is user + nice + system +
irq + softirq; idle, iowait and steal (time the hypervisor gave another guest) are not.

Two caveats, both said wherever the figures are shown:
- /proc/stat counts in clock ticks (100 per second per core): a window of 0.1 s on two cores
  is known to within a few ticks, some 5 % of what it measures.
- Anything else running on the machine is counted too (the benchmarks record the load
  average at their start).

Where there is no /proc/stat, busy time is unknown and every figure derived from it is None.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from kvtb.bench.stats import median

PROC_STAT = "/proc/stat"
TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_BUSY_FIELDS = (0, 1, 2, 5, 6)  # user nice system [idle iowait] irq softirq [steal guest ...]
MIB = 1 << 20


def busy_ticks(stat_text: str) -> int:
    """Busy ticks of all cores together, from the text of /proc/stat (its "cpu " line)."""
    for line in stat_text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            values = [int(v) for v in fields[1:]]
            if len(values) < 7:
                raise ValueError(f"/proc/stat's cpu line has {len(values)} fields, expected 7 or more")
            return sum(values[i] for i in _BUSY_FIELDS)
    raise ValueError("no aggregate cpu line in /proc/stat")


def busy_core_s(path: str = PROC_STAT) -> float | None:
    """Core-seconds all cores have been busy since boot; None where it cannot be read."""
    try:
        with open(path) as f:
            return busy_ticks(f.read()) / TICKS_PER_S
    except (OSError, ValueError):
        return None


class Window:
    """A window being timed: wall clock and the machine's busy time from its start."""

    def __init__(self) -> None:
        self._busy0 = busy_core_s()
        self._t0 = time.perf_counter()

    def end(self) -> tuple[float, float | None]:
        """(wall seconds, busy core-seconds or None) since the start."""
        wall_s = time.perf_counter() - self._t0
        busy1 = busy_core_s()
        return wall_s, (None if busy1 is None or self._busy0 is None else busy1 - self._busy0)


@dataclass
class CpuTally:
    """The windows added so far, each (wall seconds, busy core-seconds or None, bytes moved).

    A benchmark reports the figures of the window whose rate it reports (its best round), so
    that the CPU and the rate describe the same moments, and the medians over all windows.
    """

    samples: list[tuple[float, float | None, int]] = field(default_factory=list)

    def add(self, wall_s: float, busy_s: float | None, nbytes: int) -> None:
        self.samples.append((wall_s, None if busy_s is None else max(0.0, busy_s), nbytes))

    def close(self, window: Window, nbytes: int) -> None:
        """Add a window that has just ended, in which nbytes moved."""
        self.add(*window.end(), nbytes)

    @property
    def known(self) -> bool:
        """True when there are windows and every one's busy time was read."""
        return bool(self.samples) and all(busy is not None for _, busy, _ in self.samples)

    def _picked(self, at: int | None) -> list[tuple[float, float, int]]:
        if not self.known:
            return []
        return self.samples if at is None else [self.samples[at]]

    def us_per_mib(self, at: int | None = None) -> float | None:
        """Busy core-microseconds per MiB moved, in window `at` or the median over the windows."""
        picked = self._picked(at)
        if not picked or not all(nbytes for _, _, nbytes in picked):
            return None
        return median(busy * 1e6 * MIB / nbytes for _, busy, nbytes in picked)

    def cores(self, at: int | None = None) -> float | None:
        """Mean number of busy cores, in window `at` or the median over the windows."""
        picked = self._picked(at)
        if not picked or not all(wall > 0 for wall, _, _ in picked):
            return None
        return median(busy / wall for wall, busy, _ in picked)

    def figures(self, best: int | None = None) -> dict:
        """The medians over the windows and, with best, the figures of that window (None where busy
        time is unknown)."""
        out = {"us_per_mib": self.us_per_mib(), "busy_cores": self.cores(), "windows": len(self.samples)}
        if best is not None:
            out["best_window"] = {"us_per_mib": self.us_per_mib(best), "busy_cores": self.cores(best)}
        return out


def ceiling_bytes_per_s(us_per_mib: float | None, cores: int | None = None) -> float | None:
    """The rate at us_per_mib core-µs per MiB if every core worked on it all the time."""
    cores = cores or os.cpu_count() or 1
    if not us_per_mib:
        return None
    return cores * MIB / (us_per_mib * 1e-6)
