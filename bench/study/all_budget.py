"""`kvtb study all`'s time budget: which steps run in full mode, which are cut, which fall back to quick.

Full mode of every step does not fit in 3 hours here (the estimates below add up to about 5.7 hours),
so `kvtb study all` (full mode) plans its run against `--hours` (default 3) before it starts: every
step starts at `full`; while the estimated total exceeds the budget, the step whose next tier saves
the most minutes moves down one tier (`full` -> `cut`, its full plan with the arguments below, where
it has one -> `quick`). The plan, its estimates and every cut are written to all.json and named on the
report and the README block, so that no reader takes a cut step for a full one.

The estimates are minutes on this 2-core machine without a hardware profile (a profile's dilation D
multiplies the real parts), read from each step's plan at the time of writing (issue 43), against
the quick runs of docs/results (poster 6.3, scalellm 2.0, paper 1.3, eviction 4.5, ttft 1.5 min):

- poster: full 15 configurations (6 shares, 5 block sizes, 4 lengths) x 4 strategies, each a compute
  node restart (~15 s) and a batch ~9x the quick one's tokens (~35 s), x 3 repeats: ~150; quick ~20.
- scalellm: full levels 1-256, 20 requests per client, replies of 512 tokens cancelled at 60 s: the
  levels from 64 up time out most rounds (3 x 20 x 60 s = 60 min), the rest ~40 min, and the gateway
  comparison ~20: ~120; cut `--requests-per-client 5` (5 rounds: the repeats its verdicts need): ~35;
  quick ~12.
- paper: full 7 repeats and sizes to 2 GiB, with the pipelined CPU-centric path, the GET direction and
  the decode beside each offload: ~20; quick ~5.
- eviction: full the replay (~0.3) and the real check, 60 requests x 2 policies x 3 repeats at ~6 s a
  request plus ~30 s a stack: ~40; quick 25 requests x 1 policy x 3 repeats: ~9.
- ttft: full 8 sizes (32-3584 tokens) x 3 repeats in 2 placements, and the prefill sizes: ~12;
  quick 5 sizes (64-2048) x 3 repeats: ~4.

With a 3-hour budget the plan is: scalellm cut, poster quick (the largest savings), paper, eviction
and ttft full: about 2.1 hours. Pure: no I/O.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_HOURS = 3.0


@dataclass(frozen=True)
class Tier:
    """One way to run a step: its mode, the arguments added to that mode's, and its estimated minutes."""
    label: str          # "full", "cut" or "quick"
    mode: str           # the mode flag it runs with ("full" or "quick")
    extra: tuple[str, ...]
    minutes: float


def _tiers(full: float, quick: float, cut: tuple[tuple[str, ...], float] | None = None) -> tuple[Tier, ...]:
    middle = (Tier("cut", "full", cut[0], cut[1]),) if cut else ()
    return (Tier("full", "full", (), full), *middle, Tier("quick", "quick", (), quick))


TIERS: dict[str, tuple[Tier, ...]] = {
    "poster": _tiers(150, 20),
    "scalellm": _tiers(120, 12, (("--requests-per-client", "5"), 35)),
    "paper": _tiers(20, 5),
    "eviction": _tiers(40, 9),
    "ttft": _tiers(12, 4),
}
UNKNOWN = _tiers(30, 10)  # a step added without an estimate: assumed so, and said so


@dataclass(frozen=True)
class Plan:
    """Each step's tier, the total, the budget and whether it is met."""
    tiers: dict[str, Tier]
    budget_minutes: float | None
    unestimated: tuple[str, ...] = ()

    @property
    def minutes(self) -> float:
        return sum(t.minutes for t in self.tiers.values())

    @property
    def fits(self) -> bool:
        return self.budget_minutes is None or self.minutes <= self.budget_minutes

    def cut(self) -> dict[str, str]:
        """The steps not run in full: name -> their tier and arguments, in words."""
        return {name: f"{t.label}" + (f" ({' '.join(t.extra)})" if t.extra else "")
                for name, t in self.tiers.items() if t.label != "full"}

    def text(self) -> str:
        """One sentence for the report: the budget, the estimate, what was cut."""
        if self.budget_minutes is None:
            return f"no time budget (estimated {self.minutes / 60:.1f} h)" if self.minutes else "no time budget"
        cut = self.cut()
        what = ("; cut to fit: " + ", ".join(f"{n} {c}" for n, c in cut.items())) if cut else "; nothing cut"
        over = "" if self.fits else " (over budget even so)"
        return (f"budget {self.budget_minutes / 60:g} h, estimated {self.minutes / 60:.1f} h{over}{what}"
                + (f"; no estimate for {', '.join(self.unestimated)} (assumed {UNKNOWN[0].minutes:g} min "
                   f"full)" if self.unestimated else ""))

    def to_json(self) -> dict:
        return {"budget_minutes": self.budget_minutes, "estimated_minutes": self.minutes, "fits": self.fits,
                "tiers": {n: {"tier": t.label, "mode": t.mode, "extra": list(t.extra), "minutes": t.minutes}
                          for n, t in self.tiers.items()},
                "cut": self.cut(), "unestimated": list(self.unestimated), "text": self.text()}


def plan(names: Sequence[str], mode: str, hours: float | None) -> Plan:
    """Each step's tier. Quick and smoke: every step in that mode, no budget. Full: every step full, then
    the largest saving first, one tier at a time, until the estimate fits `hours` (None or 0: no budget)."""
    unestimated = tuple(n for n in names if n not in TIERS)
    tiers_of = {n: TIERS.get(n, UNKNOWN) for n in names}
    if mode != "full":
        chosen = {n: next((t for t in tiers_of[n] if t.label == "quick"), tiers_of[n][-1]) for n in names}
        if mode == "smoke":
            chosen = {n: Tier("smoke", "smoke", (), 0.0) for n in names}
        return Plan(chosen, None, unestimated)
    level = {n: 0 for n in names}
    budget = hours * 60 if hours else None

    def total() -> float:
        return sum(tiers_of[n][level[n]].minutes for n in names)

    while budget is not None and total() > budget:
        movable = [n for n in names if level[n] + 1 < len(tiers_of[n])]
        if not movable:
            break
        best = max(movable, key=lambda n: (tiers_of[n][level[n]].minutes - tiers_of[n][level[n] + 1].minutes,
                                           -names.index(n)))
        level[best] += 1
    return Plan({n: tiers_of[n][level[n]] for n in names}, budget, unestimated)
