"""`kvtb study all`'s time budget: which steps run in full mode, which are cut, which fall back to quick.

Full mode of every step does not fit in 3 hours here (the estimates below add up to about 5.4 hours),
so `kvtb study all` (full mode) plans its run against `--hours` (default 3) before it starts: every
step may run `full`, `cut` (its full plan with the arguments below, where it has one) or `quick`; of
every combination that fits the budget, the one with the fewest steps in quick mode runs, then the one
with the largest estimate (the run closest to full mode), then the fewest steps cut. The plan, its estimates and every cut are written to all.json and named on the
report and the README block, so that no reader takes a cut step for a full one.

The estimates are minutes on this 2-core machine without a hardware profile (a profile's dilation D
multiplies the real parts). The quick ones were measured by `kvtb study all --quick` at 8d55abb (poster
6.4, scalellm 4.0, paper 2.2, eviction 3.8 min; ttft below); the full ones are read from each step's plan
against them:

- poster: full 180 batches (6 shares, 5 block sizes, 4 lengths, every strategy, 3 repeats) of 32
  requests of 192 + 128 tokens, about 55 s each with the compute node's restarts: ~165; cut (`--cut`:
  shares 12-70%, block sizes 8/32/128, three lengths, the poster's two strategies beside Fig. 5) 96
  batches: ~90; quick 39 batches of 16 x 72 tokens: ~7.
- scalellm: full levels 1-256, 3 requests per client, replies of 512 tokens cancelled at 60 s, 3 sweeps:
  the levels from 16 up time out most rounds (~60 min), the rest and the gateway comparison ~30: ~90;
  cut `--requests-per-client 1` (each sweep one request per client; the 3 sweeps are the repeats its
  verdicts need): ~35; quick ~4.
- paper: full 7 repeats and sizes to 2 GiB with the pipelined CPU-centric path, the GET direction to
  256 MiB, Fig. 4 to 128 MiB and the decode beside each offload: ~30; quick ~2.5.
- eviction: full the replay (~0.3) and the real check, 60 requests x 2 policies x 3 repeats: ~25; quick
  25 requests x 1 policy x 3 repeats: ~4.
- ttft: full 8 sizes (32-3584 tokens) x 3 repeats in 2 placements, and the prefill sizes: ~15; quick
  5 sizes (64-2048) x 3 repeats: ~6.

With a 3-hour budget the plan is: poster and scalellm cut, eviction quick, paper and ttft full: about
2.9 hours.

Under a hardware profile every estimate is multiplied by its step's slowdown (`slowdowns`): what
`kvtb profile check` says pacing costs that study (D x modeled / real of its dominant operation, or the
paper's own estimate over its unprofiled one); a step the check does not estimate takes the largest
slowdown of those it does, and the plan says so. Pure: no I/O (bench.study.all measures the check).
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
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
    "poster": _tiers(165, 7, (("--cut",), 90)),
    "scalellm": _tiers(90, 4, (("--requests-per-client", "1"), 35)),
    "paper": _tiers(30, 2.5),
    "eviction": _tiers(25, 4),
    "ttft": _tiers(15, 6),
}
UNKNOWN = _tiers(30, 10)  # a step added without an estimate: assumed so, and said so


@dataclass(frozen=True)
class Plan:
    """Each step's tier, the total, the budget and whether it is met."""
    tiers: dict[str, Tier]
    budget_minutes: float | None
    unestimated: tuple[str, ...] = ()
    slowdown: dict[str, float] | None = None   # under a profile: each step's estimate x this
    slowdown_basis: str = ""

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
                   f"full)" if self.unestimated else "")
                + (f"; under the profile each estimate x its slowdown ("
                   + ", ".join(f"{n} {f:.3g}" for n, f in self.slowdown.items()) + ")"
                   + (f": {self.slowdown_basis}" if self.slowdown_basis else "") if self.slowdown else ""))

    @classmethod
    def from_json(cls, raw: dict) -> "Plan":
        """The plan `to_json` wrote (a run in parts keeps its first part's plan)."""
        tiers = {n: Tier(t["tier"], t["mode"], tuple(t.get("extra") or ()), float(t["minutes"]))
                 for n, t in (raw.get("tiers") or {}).items()}
        return cls(tiers, raw.get("budget_minutes"), tuple(raw.get("unestimated") or ()),
                   {n: float(f) for n, f in (raw.get("slowdown") or {}).items()} or None,
                   str(raw.get("slowdown_basis") or ""))

    def to_json(self) -> dict:
        return {"budget_minutes": self.budget_minutes, "estimated_minutes": self.minutes, "fits": self.fits,
                "tiers": {n: {"tier": t.label, "mode": t.mode, "extra": list(t.extra), "minutes": t.minutes}
                          for n, t in self.tiers.items()},
                "cut": self.cut(), "unestimated": list(self.unestimated), "text": self.text(),
                "slowdown": self.slowdown, "slowdown_basis": self.slowdown_basis}


def slowdowns(names: Sequence[str], studies: Mapping[str, Mapping]) -> tuple[dict[str, float], str]:
    """({step: slowdown >= 1}, how) under a profile, from `kvtb profile check`'s study estimates
    (bench.profile_check.study_estimates): paced_over_real where the check gives one; the paper (whose
    transfers the check models) its full estimate over TIERS' unprofiled full minutes; a step the check
    does not estimate the largest of the others (at least 1), named in `how`."""
    known: dict[str, float] = {}
    for name in names:
        e = studies.get(name) or {}
        if e.get("paced_over_real") is not None:
            known[name] = max(1.0, float(e["paced_over_real"]))
        elif (e.get("full") or {}).get("estimate_s") and name in TIERS:
            known[name] = max(1.0, float(e["full"]["estimate_s"]) / 60 / TIERS[name][0].minutes)
    guessed = [n for n in names if n not in known]
    fallback = max(known.values(), default=1.0)
    how = "kvtb profile check's estimates" + (
        f"; {', '.join(guessed)} not estimated by it, given the largest ({fallback:.3g})" if guessed else "")
    return {n: known.get(n, fallback) for n in names}, how


def plan(names: Sequence[str], mode: str, hours: float | None, slowdown: Mapping[str, float] | None = None,
         slowdown_basis: str = "") -> Plan:
    """Each step's tier. Quick and smoke: every step in that mode, no budget. Full: every step full, then
    the largest saving first, one tier at a time, until the estimate fits `hours` (None or 0: no budget).
    `slowdown` (under a profile, from `slowdowns`) multiplies each step's estimates."""
    unestimated = tuple(n for n in names if n not in TIERS)
    slow = {n: float((slowdown or {}).get(n, 1.0)) for n in names} if slowdown else None
    tiers_of = {n: tuple(Tier(t.label, t.mode, t.extra, t.minutes * (slow[n] if slow else 1.0))
                         for t in TIERS.get(n, UNKNOWN)) for n in names}
    if mode != "full":
        chosen = {n: next((t for t in tiers_of[n] if t.label == "quick"), tiers_of[n][-1]) for n in names}
        if mode == "smoke":
            chosen = {n: Tier("smoke", "smoke", (), 0.0) for n in names}
        return Plan(chosen, None, unestimated, slow, slowdown_basis)
    budget = hours * 60 if hours else None
    if budget is None:
        return Plan({n: tiers_of[n][0] for n in names}, None, unestimated, slow, slowdown_basis)
    # every combination of tiers (a handful of steps, at most three tiers each) that fits: the fewest steps
    # in quick mode, then the most minutes (the run closest to full), then the fewest cut; none fits: every
    # step at its cheapest
    best: tuple | None = None
    for levels in itertools.product(*(range(len(tiers_of[n])) for n in names)):
        minutes = sum(tiers_of[n][i].minutes for n, i in zip(names, levels))
        if minutes > budget:
            continue
        quick = sum(1 for n, i in zip(names, levels) if tiers_of[n][i].label == "quick")
        key = (-quick, minutes, -sum(1 for i in levels if i))
        if best is None or key > best[0]:
            best = (key, levels)
    levels = best[1] if best else tuple(len(tiers_of[n]) - 1 for n in names)
    level = dict(zip(names, levels))
    return Plan({n: tiers_of[n][level[n]] for n in names}, budget, unestimated, slow, slowdown_basis)
