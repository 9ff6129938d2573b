"""The headline table of `kvtb bench all`: one row per question the testbed answers (pure).

Every value is looked up in the results of the run being reported; a benchmark that did not
run (or failed) leaves its rows out. `splice` writes the table between two marker lines of a
Markdown file (the README), so that figures there come from a run, never from a keyboard.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

START = "<!-- kvtb bench all: summary start -->"
END = "<!-- kvtb bench all: summary end -->"


class Headline(NamedTuple):
    question: str
    bench: str
    value: Callable[[dict], str | None]  # the benchmark's result -> the shown value (None: absent)
    target: str                            # the floor or goal, or the reference figure


def _ratio(key: str, fmt: str = "{:.2f}") -> Callable[[dict], str | None]:
    def get(result: dict) -> str | None:
        value = (result.get("ratios") or {}).get(key)
        return None if value is None else fmt.format(value)
    return get


def _put_get(put_key: str, get_key: str) -> Callable[[dict], str | None]:
    """"PUT x, GET y" from two ratios (None unless both are there)."""
    def get(result: dict) -> str | None:
        ratios = result.get("ratios") or {}
        if put_key not in ratios or get_key not in ratios:
            return None
        return f"PUT {ratios[put_key]:.2f}, GET {ratios[get_key]:.2f}"
    return get


def _crossover(result: dict) -> str | None:
    cross = (result.get("results") or {}).get("crossover")
    if not cross:
        return None
    if cross.get("tokens"):
        return f"{cross['tokens']:.0f} tokens"
    if cross.get("where") == "below_smallest":
        return f"below {cross.get('smallest')} tokens"
    return f"above {cross.get('largest')} tokens"


def _trigger_to_fire(result: dict) -> str | None:
    tf = (result.get("results") or {}).get("trigger_to_fire")
    return None if not tf else f"p50 {tf['p50_us']:.0f} µs, p99 {tf['p99_us']:.0f} µs"


def _speedups(result: dict) -> str | None:
    r = result.get("ratios") or {}
    if "speedup_min" not in r:
        return None
    return f"{r['speedup_min']:.2f}x-{r['speedup_max']:.2f}x"


def _concurrency(result: dict) -> str | None:
    for key, value in (result.get("ratios") or {}).items():
        m = re.fullmatch(r"tokens_per_s_(\d+)_vs_1", key)
        if m:
            return f"{value:.2f} ({m.group(1)} sessions / 1)"
    return None


def _eviction(result: dict) -> str | None:
    settings = result.get("settings") or {}
    runs = (result.get("results") or {}).get("runs") or {}
    if not settings.get("fractions"):
        return None
    low = min(settings["fractions"])
    shown = [f"{p} {runs[f'{p}_{low}']['hit_rate']:.2f}" for p in settings.get("policies", [])
             if f"{p}_{low}" in runs]
    return f"{', '.join(shown)} (capacity {low:g} of the working set)" if shown else None


HEADLINES = (
    Headline("Follow-up TTFT, recomputed / restored, 2,048-token context", "ttft",
             _ratio("recompute_vs_restore_2048", "{:.1f}x"), "floor 10x, goal 25x"),
    Headline("Follow-up TTFT, restored / resident, 2,048-token context", "ttft",
             _ratio("restore_vs_resident_2048"), "goal at most 1.3"),
    Headline("Context under which recomputing is as fast as restoring", "ttft", _crossover,
             "the poster's question"),
    Headline("KV PUT through the whole path / raw limit, 16 MiB chunks", "datapath",
             _ratio("put_vs_limit"), "floor 0.5"),
    Headline("KV GET through the whole path / raw limit, 16 MiB chunks", "datapath",
             _ratio("get_vs_limit"), "floor 0.5"),
    Headline("Agent PUT / raw limit, worst of 1 and 16 MiB chunks", "smartnic", _ratio("put_vs_limit"),
             "floor 0.5"),
    Headline("Agent GET / raw limit, worst of 1 and 16 MiB chunks", "smartnic", _ratio("get_vs_limit"),
             "floor 0.5"),
    Headline("Bare path (the path's work, no services) / raw limit, worst of 1 and 16 MiB", "smartnic",
             _put_get("bare_put_vs_limit", "bare_get_vs_limit"), "what this machine gives"),
    Headline("Agent / bare path, worst of 1 and 16 MiB chunks", "smartnic",
             _put_get("put_vs_bare_path", "get_vs_bare_path"), "the services' own cost"),
    Headline("Agent's CPU ceiling (its CPU per MiB, every core on it) / raw limit, worst of 1 and 16 MiB",
             "smartnic", _put_get("put_cpu_ceiling_vs_limit", "get_cpu_ceiling_vs_limit"),
             "how far the cores let it go"),
    Headline("Counter store to triggered-op fire", "smartnic", _trigger_to_fire, "-"),
    Headline("Compute stall per offloaded chunk, CPU-centric / triggered (32-token chunks)", "offload",
             _ratio("cpu_stall_vs_triggered_32", "{:.1f}x"), "the paper: 19x"),
    Headline("Decode TBT, triggered / resident (32-token chunks)", "offload",
             _ratio("triggered_tbt_vs_resident_32"), "-"),
    Headline("Output tokens/s, most sessions / one session", "concurrency", _concurrency, "-"),
    Headline("Follow-up hit rate under limited storage, by eviction policy", "eviction", _eviction, "-"),
    Headline("Analytical model: triggered speedup over CPU-centric, 32 KB-5 TB", "simulate", _speedups,
             "the paper: 19x-23x"),
)


def rows(results: dict[str, dict]) -> list[tuple[str, str, str, str]]:
    """(question, measured, target, benchmark) for each headline whose benchmark ran."""
    out = []
    for h in HEADLINES:
        result = results.get(h.bench)
        value = h.value(result) if result else None
        if value is not None:
            out.append((h.question, value, h.target, f"`kvtb bench {h.bench}`" if h.bench != "simulate"
                        else "`kvtb simulate`"))
    return out


def table(results: dict[str, dict]) -> str:
    """The headline rows as a Markdown table."""
    lines = ["| question | measured | floor, goal or reference | by |", "| --- | --- | --- | --- |"]
    lines += [f"| {q} | {v} | {t} | {b} |" for q, v, t, b in rows(results)]
    return "\n".join(lines)


def splice(text: str, block: str) -> str:
    """text with everything between the START and END marker lines replaced by block.

    ValueError when the markers are missing or out of order.
    """
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"no {START!r} ... {END!r} block to replace")
    return pattern.sub(lambda _: f"{START}\n{block}\n{END}", text, count=1)


def results_of(report: dict[str, Any]) -> dict[str, dict]:
    """name -> result of the steps of a `kvtb bench all` report that produced one."""
    return {e["name"]: e["result"] for e in report.get("steps", []) if e.get("result")}
