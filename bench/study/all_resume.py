"""`kvtb study all --resume`: a run in parts, each step run once, the report whole.

Full mode of every step takes longer than one sitting here (bench.study.all_budget), so a full run may be
taken in parts: `kvtb study all --out DIR --resume [--only ...]` keeps every step that already finished
without a failure in DIR/all.json (the same mode and profile, or the run is refused), runs the others, and
writes one report of all of them. Each step keeps the command, commit and date it ran under, and the report
says which part each came from: nothing is taken for one run that was not.

Pure: the reading of DIR/all.json is the caller's.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.study import all_budget


def check(previous: Mapping[str, Any] | None, mode: str, profile: str | None) -> str | None:
    """Why `previous` cannot be resumed in this mode and profile (None: it can, or there is nothing)."""
    if previous is None:
        return None
    if previous.get("mode") != mode:
        return (f"the report there is of {previous.get('mode')} mode, this run is {mode}: give the same mode, "
                "or another --out")
    if (previous.get("profile") or None) != (profile or None):
        return (f"the report there ran under profile {previous.get('profile') or 'none'}, this run under "
                f"{profile or 'none'}: give the same profile, or another --out")
    return None


def kept(previous: Mapping[str, Any] | None, names: Sequence[str]) -> bool:
    """Whether `previous` holds a plan for every one of `names` (which `plan` then keeps)."""
    raw = (previous or {}).get("budget") or {}
    return bool(raw.get("tiers")) and all(n in raw["tiers"] for n in names)


def plan(previous: Mapping[str, Any] | None, names: Sequence[str], mode: str,
         hours: float | None, slowdown: Mapping[str, float] | None = None,
         slowdown_basis: str = "") -> all_budget.Plan:
    """The plan of the whole run, not of this part: the first part plans every step of the run (`names`,
    also those a later part will run), and every later part keeps that plan, so each step runs at the tier
    the budget gave it and the report's cuts are the run's. A plan that lacks one of `names` is made again
    for all of them."""
    if kept(previous, names):
        return all_budget.Plan.from_json(previous["budget"])
    return all_budget.plan(names, mode, hours, slowdown, slowdown_basis)


def done(previous: Mapping[str, Any] | None) -> dict[str, dict]:
    """The steps of `previous` that finished without a failure, by name."""
    if not previous:
        return {}
    return {e["name"]: e for e in previous.get("steps", []) if e.get("result") and not e.get("error")}


def part_of(report: Mapping[str, Any]) -> dict:
    """This run as one part: its command, commit, date, mode and the steps it ran."""
    m = report.get("machine") or {}
    return {"command": report.get("command"), "commit": m.get("git_commit"), "time_utc": m.get("time_utc"),
            "seconds": report.get("seconds"), "steps": [e["name"] for e in report.get("steps", [])]}


def merge(previous: Mapping[str, Any] | None, report: dict, order: Sequence[str]) -> dict:
    """`report` (this part) with the steps carried from `previous` that it did not run, in `order`; its
    `parts` list every part that still has a step in the report (the earlier ones first, each with only
    those steps), `seconds` the steps' sum."""
    this = part_of(report)
    ran = set(this["steps"])
    kept = {name: e for name, e in done(previous).items() if name not in ran}
    if not kept:
        report["parts"] = [this]
        return report
    steps = {**{n: dict(e, carried=True) for n, e in kept.items()}, **{e["name"]: e for e in report["steps"]}}
    report["steps"] = [steps[n] for n in order if n in steps]
    earlier = []
    for part in previous.get("parts") or [part_of(previous)]:
        mine = [n for n in part.get("steps") or [] if n in kept]
        if mine:
            earlier.append(dict(part, steps=mine))
    report["parts"] = earlier + [this]
    report["seconds"] = sum(e.get("seconds") or 0 for e in report["steps"])
    return report


def parts_text(report: Mapping[str, Any]) -> str | None:
    """'2 parts, each step run once: `cmd` (commit c, date: poster, ttft); ...' (None for one part)."""
    parts = report.get("parts") or []
    if len(parts) < 2:
        return None
    return f"{len(parts)} parts, each step run once: " + "; ".join(
        f"`{p.get('command')}` (commit {(p.get('commit') or 'unknown')[:12]}, {(p.get('time_utc') or '')[:10]}: "
        f"{', '.join(p.get('steps') or [])})" for p in parts)
