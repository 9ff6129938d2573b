"""`kvtb study poster --resume`: the poster study taken in sittings, each finished point kept.

Under a hardware profile the poster's one step runs for hours (quick mode under polaris-a100: 39 batches
at D about 77, about 4.5 hours here), longer than a sitting. So every point and ample baseline, once all its
repeats are done, is written to OUT/journal.json (atomically, 0600), and `--resume` keeps what a stopped run
finished and runs the rest. A batch cut off by the stop is run again whole; a failed point is not kept.

What keeps a run in sittings honest:
- A journal resumes only in the settings it was made in (`fingerprint`: mode, profile, repeats, placement,
  torch threads, prefix cache, the mode's sizes); anything else is refused with what differs.
- Under a profile, D is the first sitting's (a different D given is refused): a point's virtual times are
  wall / D, and one D across sittings keeps them one scale.
- Each sitting keeps its commit, date, the points it ran, its compute node restarts and its pacers'
  snapshots, so the study's violations are those of every sitting, not only the last one's.

Pure, except `load` and `save` (the file).
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.study.poster_runner import Workload

NAME = "journal.json"
VERSION = 1


class JournalError(ValueError):
    """A journal that cannot be resumed here: unreadable, or made in other settings."""


def encode_key(key: tuple) -> list:
    """A Points key as JSON: ("ample", w, bt) -> ["ample", [n, in, out], bt]; (w, bt, share, strategy) ->
    ["point", [n, in, out], bt, share, strategy]."""
    if key and key[0] == "ample":
        _, w, bt = key
        return ["ample", [w.requests, w.input_tokens, w.output_tokens], bt]
    w, bt, share, strategy = key
    return ["point", [w.requests, w.input_tokens, w.output_tokens], bt, share, strategy]


def decode_key(raw: Any) -> tuple:
    """encode_key's inverse; JournalError on anything else."""
    try:
        kind, w = raw[0], Workload(*(int(x) for x in raw[1]))
        if kind == "ample" and len(raw) == 3:
            return ("ample", w, int(raw[2]))
        if kind == "point" and len(raw) == 5:
            return (w, int(raw[2]), float(raw[3]), str(raw[4]))
    except (TypeError, ValueError, IndexError) as exc:
        raise JournalError(f"a journal key is not a point: {raw!r} ({exc})") from exc
    raise JournalError(f"a journal key is not a point: {raw!r}")


def fingerprint(mode: str, mode_sizes: Mapping, profile: str | None, repeats: int, placement: str,
                torch_threads: int, prefix_cache: bool) -> dict:
    """The settings a journal resumes only in."""
    return {"mode": mode, "sizes": json.loads(json.dumps(mode_sizes)), "profile": profile or None,
            "repeats": repeats, "placement": placement, "torch_threads": torch_threads,
            "prefix_cache": prefix_cache}


def new(fp: Mapping, dilation: float, how: str, warmup: Mapping | None) -> dict:
    return {"version": VERSION, "fingerprint": dict(fp), "dilation": dilation, "dilation_chosen": how,
            "warmup": warmup, "points": [], "sittings": []}


def check(journal: Mapping, fp: Mapping, dilation: float | None) -> None:
    """JournalError unless `journal` was made in the settings `fp` (and, under a profile, with D `dilation`
    when one is given; None: keep the journal's)."""
    if journal.get("version") != VERSION:
        raise JournalError(f"journal version {journal.get('version')!r}, this code reads {VERSION}")
    theirs = journal.get("fingerprint") or {}
    differ = sorted(k for k in set(fp) | set(theirs) if fp.get(k) != theirs.get(k))
    if differ:
        raise JournalError("the journal was made in other settings (" + "; ".join(
            f"{k}: {theirs.get(k)!r} there, {fp.get(k)!r} now" for k in differ)
            + "): give the same ones, or another --out")
    if fp.get("profile") and dilation is not None and float(dilation) != float(journal["dilation"]):
        raise JournalError(f"the journal's points ran at D = {journal['dilation']}, this run gives D = {dilation}: "
                           "give the same, or leave --dilation at auto to keep the journal's")


def done(journal: Mapping) -> dict[tuple, dict]:
    """The kept points and baselines, by Points key."""
    return {decode_key(p["key"]): p["value"] for p in journal.get("points", [])}


def batches(journal: Mapping) -> int:
    """How many batches the kept points and baselines ran (for a progress bar's total)."""
    n = 0
    for p in journal.get("points", []):
        v = p["value"]
        n += (sum(len(x) for k, x in v.items() if k != "pool_tokens") if p["key"][0] == "ample"
              else int(v.get("n_repeats", 0)))
    return n


def keep(journal: dict, key: tuple, value: Mapping, sitting: int) -> None:
    """Add one finished point (or baseline), run in sitting number `sitting` (an index into sittings)."""
    journal["points"].append({"key": encode_key(key), "sitting": sitting, "value": value})
    journal["sittings"][sitting]["points"] += 1


def start_sitting(journal: dict, commit: str | None, time_utc: str | None, command: str) -> int:
    journal["sittings"].append({"commit": commit, "time_utc": time_utc, "command": command, "points": 0,
                                "restarts_s": [], "pacing": []})
    return len(journal["sittings"]) - 1


def pacing(journal: Mapping) -> list[dict]:
    """Every sitting's pacer snapshots, for bench.scaled.record."""
    return [snap for s in journal.get("sittings", []) for snap in s.get("pacing") or [] if snap]


def restarts_s(journal: Mapping) -> list[float]:
    return [x for s in journal.get("sittings", []) for x in s.get("restarts_s") or []]


def summary(journal: Mapping) -> list[dict]:
    """The sittings as a study's settings keep them (no pacing)."""
    return [{k: s.get(k) for k in ("commit", "time_utc", "command", "points")} for s in journal.get("sittings", [])]


# -- the file ----------------------------------------------------------------------------------------------

def load(out_dir: str | Path) -> dict | None:
    """OUT/journal.json, or None when there is none; JournalError when it cannot be read."""
    path = Path(out_dir) / NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise JournalError(f"{path} cannot be read: {exc}") from exc
    try:
        journal = json.loads(raw)
    except ValueError as exc:
        raise JournalError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(journal, dict):
        raise JournalError(f"{path} is not a journal")
    return journal


def save(out_dir: str | Path, journal: Mapping) -> Path:
    """Write the journal atomically (a temporary file renamed over it), 0600 in a 0700 directory."""
    from kvtb import private

    out = private.private_dir(out_dir, narrow=False)
    path, tmp = out / NAME, out / (NAME + ".tmp")
    with private.open_private(tmp, "w") as f:
        f.write(json.dumps(journal, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path
