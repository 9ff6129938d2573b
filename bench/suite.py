"""`kvtb bench all`: every benchmark, then `kvtb simulate --calibrate`, and a Markdown report.

Each benchmark runs as its own process (`kvtb bench NAME --json --out OUT/NAME`), one after the
other, so one's services never share the cores with another's. OUT/README.md says on what
machine and with what settings it ran, gives the headline table (one row per question the
testbed answers, with the floor, goal or paper's figure beside it) and each benchmark's table,
ratios and plots; OUT/all.json holds every raw result. `--readme FILE` writes the headline
table between the summary markers of FILE, so that figures there come from a run.

A benchmark that fails, or a part of one (a level, a size), is reported failed with its error:
in all.json's `failed` ({part, error} each), in the report, and as "failed: <error>" in the
headline rows it would have filled, never as a missing row. A SIGTERM stops the running
benchmark (it is sent SIGTERM and stops its services) and then this command.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from bench.results import (
    add_common_args,
    emit_json,
    format_bytes,
    machine_info,
    progress_for,
    run_child,
    setup_logging,
    splice_between,
    stop_on_sigterm,
    write_json,
)
from kvtb.launch import kvtb_argv

logger = logging.getLogger(__name__)

START = "<!-- kvtb bench all: summary start -->"
END = "<!-- kvtb bench all: summary end -->"


@dataclasses.dataclass(frozen=True)
class Step:
    """One benchmark: its title in the report and its arguments with --quick (--smoke is its own)."""

    name: str
    title: str
    quick: tuple[str, ...]

    def argv(self, mode: str, out: Path, keep_data: bool = False) -> list[str]:
        """Its command line: --json, its output directory, and the mode's arguments."""
        extra = {"full": (), "quick": self.quick, "smoke": ("--smoke",)}[mode]
        keep = ("--keep-data",) if keep_data else ()
        return kvtb_argv("bench", self.name, "--json", "--out", str(out / self.name), *extra, *keep)


STEPS = (
    Step("ttft", "Follow-up TTFT: restore against recompute (the poster's question)",
         ("--sizes", "256", "1024", "2048", "--reps", "2")),
    Step("datapath", "KV data path: PUT and GET through region, agent, fabric and storage (Figs. 5-7's path)",
         ("--sizes-kib", "64,1024,16384", "--total-mib", "64")),
    Step("concurrency", "Concurrent chat sessions (ScaleLLM's Table 1)",
         ("--levels", "1", "4", "8", "--turns", "2")),
    Step("eviction", "Eviction: hit rate and follow-up TTFT against storage capacity",
         ("--fractions", "0.5", "1.0", "--users", "6", "--visits", "15")),
    Step("offload", "Offload: decode TBT and the compute process's stall per block",
         ("--decode-tokens", "64", "--repeats", "1")),
    Step("storage", "Storage node alone", ("--total-mib", "64", "--rounds", "1")),
    Step("smartnic", "SmartNIC agent: trigger-to-fire and transfers",
         ("--total-mib", "64", "--rounds", "1", "--trigger-samples", "200")),
)
SIMULATE_TITLE = "Analytical model (Tables II/III) and its calibration on the measured transfers"


# -- the headline table ------------------------------------------------------------------------------

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


def _crossover(result: dict) -> str | None:
    cross = (result.get("results") or {}).get("crossover")
    if not cross:
        return None
    if cross.get("tokens"):  # bracketed by two measured sizes, interpolated in log2(tokens)
        return f"{cross['tokens']:.0f} tokens (between two sizes measured)"
    if cross.get("where") == "below_smallest":  # recomputing no faster even at the smallest: not bracketed
        return f"below the smallest size measured ({cross.get('smallest')} tokens)"
    if cross.get("where") == "above_largest":
        return f"above the largest size measured ({cross.get('largest')} tokens)"
    return None


def _trigger_to_fire(result: dict) -> str | None:
    tf = (result.get("results") or {}).get("trigger_to_fire")
    if not tf:
        return None
    if "load" not in tf:
        return f"p50 {tf['p50_us']:.0f} µs, p99 {tf['p99_us']:.0f} µs"
    return "; ".join(f"{s} p50 {tf[s]['p50_us']:.0f} µs, p99 {tf[s]['p99_us']:.0f} µs" for s in ("idle", "load"))


def _speedups(result: dict) -> str | None:
    r = result.get("ratios") or {}
    return f"{r['speedup_min']:.2f}x-{r['speedup_max']:.2f}x" if "speedup_min" in r else None


def _concurrency(result: dict) -> str | None:
    found = {int(m.group(1)): value for key, value in (result.get("ratios") or {}).items()
             if (m := re.fullmatch(r"tokens_per_s_(\d+)_vs_1", key))}
    return f"{found[max(found)]:.2f} ({max(found)} sessions / 1)" if found else None


def _eviction(result: dict) -> str | None:
    settings, runs = result.get("settings") or {}, (result.get("results") or {}).get("runs") or {}
    if not settings.get("fractions"):
        return None
    low = min(settings["fractions"])
    shown = [f"{p} {runs[f'{p}_{low}']['hit_rate']:.2f}" for p in settings.get("policies", [])
             if f"{p}_{low}" in runs]
    return f"{', '.join(shown)} (capacity {low:g} of the working set)" if shown else None


# The paper has no TTFT figure: its 19-23x is a KV transfer's speedup (Sec. V-B, Figs 6-7), and on a
# restore against a recompute it offers only that "only the new prompt needs to be processed" (Sec. I).
TTFT_FLOOR = ("floor 19x (ours: the paper gives no TTFT figure; it says a restore leaves \"only the new prompt\" "
              "to process, Sec. I; its 19-23x is a transfer's speedup)")

HEADLINES = (
    Headline("Follow-up TTFT, recomputed / restored, 2,048-token context", "ttft",
             _ratio("recompute_vs_restore_2048", "{:.1f}x"), TTFT_FLOOR),
    Headline("Follow-up TTFT, restored / resident, 2,048-token context", "ttft",
             _ratio("restore_vs_resident_2048"), "at most 1.1"),
    Headline("Context under which recomputing is as fast as restoring", "ttft", _crossover,
             "the poster's question"),
    Headline("KV PUT through the whole path / raw limit, 16 MiB chunks", "datapath", _ratio("put_vs_limit"),
             "floor 0.5"),
    Headline("KV GET through the whole path / raw limit, 16 MiB chunks", "datapath", _ratio("get_vs_limit"),
             "floor 0.5"),
    Headline("KV PUT with the default security / none (fabric auth + KV MAC), 16 MiB chunks", "datapath",
             _ratio("put_secure_vs_open"), "floor 0.75, goal 0.9"),
    Headline("KV GET with the default security / none (fabric auth + KV MAC), 16 MiB chunks", "datapath",
             _ratio("get_secure_vs_open"), "floor 0.75, goal 0.9"),
    Headline("Agent PUT / raw limit, worst of 1 and 16 MiB chunks", "smartnic", _ratio("put_vs_limit"),
             "floor 0.5"),
    Headline("Agent GET / raw limit, worst of 1 and 16 MiB chunks", "smartnic", _ratio("get_vs_limit"),
             "floor 0.5"),
    Headline("Agent restore of a 2,048-token context by bulk GET / ZeroMQ loopback", "smartnic",
             _ratio("context_restore_vs_zmq"), "floor 0.7"),
    Headline("Storage node alone, Store / raw limit, 16 MiB values", "storage", _ratio("store_vs_limit"),
             "floor 0.5"),
    Headline("Storage node alone, Retrieve / raw limit, 16 MiB values", "storage",
             _ratio("retrieve_vs_limit"), "floor 0.5"),
    Headline("Counter store to triggered-op fire", "smartnic", _trigger_to_fire, "ceilings p50 50 µs, p99 500 µs"),
    Headline("Compute stall per offloaded block, CPU-centric / triggered (32-token blocks)", "offload",
             _ratio("cpu_stall_vs_triggered_32", "{:.1f}x"),
             "floor 100x (ours; the paper's 19x is a transfer's time, not the compute's stall)"),
    Headline("Decode TBT, triggered / resident (32-token blocks)", "offload",
             _ratio("triggered_tbt_vs_resident_32"), "-"),
    Headline("Output tokens/s, most sessions / one session (continuous batching)", "concurrency", _concurrency,
             "floor 6, goal 8 at 32"),
    Headline("TTFT p50, 8 sessions / one session", "concurrency", _ratio("ttft_p50_8_vs_1"), "at most 4"),
    Headline("Follow-up hit rate under limited storage, by eviction policy", "eviction", _eviction, "-"),
    Headline("Analytical model: triggered speedup over CPU-centric, 32 KB-5 TB", "simulate", _speedups,
             "the paper (Sec. V-B, Figs 6-7): 19x-23x"),
)


def headline_rows(results: dict[str, dict], failures: dict[str, str] | None = None
                  ) -> list[tuple[str, str, str, str]]:
    """(question, measured, target, command) for each headline whose benchmark ran. A headline its
    benchmark could not give shows "failed: <error>": the benchmark's (failures: name -> error,
    for one that failed as a whole) or its failed parts' (result["failed"]); a headline whose
    benchmark did not run is left out."""
    failures = failures or {}
    out = []
    for h in HEADLINES:
        value = h.value(results[h.bench]) if h.bench in results else None
        if value is None:
            error = (_short(failures[h.bench]) if failures.get(h.bench)
                     else _parts_failed(results.get(h.bench)))
            if error is None:
                if h.bench not in results:
                    continue  # not run: no row, no made-up value
                error = "not measured in this run"
            value = f"failed: {error}"
        out.append((h.question, value, h.target,
                    "`kvtb simulate`" if h.bench == "simulate" else f"`kvtb bench {h.bench}`"))
    return out


def _parts_failed(result: dict | None) -> str | None:
    """A benchmark's failed parts, in one short line (None when none failed)."""
    failed = (result or {}).get("failed") or []
    return "; ".join(f"{f['part']}: {_short(f['error'])}" for f in failed) or None


def _short(error: str, limit: int = 160) -> str:
    """An error's last meaningful line, cut (a traceback's last line says what went wrong)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    named = r"^[A-Za-z_.]+(Error|Exception|Expired|Exit)\b"
    line = next((ln for ln in reversed(lines) if re.match(named, ln)), lines[0] if lines else "unknown error")
    line = line.replace("|", "\\|")
    return line if len(line) <= limit else line[:limit - 1] + "…"


def headline_table(results: dict[str, dict], failures: dict[str, str] | None = None) -> str:
    """The headline rows as a Markdown table (failures: name -> error of a benchmark that failed)."""
    lines = ["| question | measured | floor, goal or reference | by |", "| --- | --- | --- | --- |"]
    rows = headline_rows(results, failures)
    return "\n".join(lines + [f"| {q} | {v} | {t} | {b} |" for q, v, t, b in rows])


def splice(text: str, block: str) -> str:
    """text with everything between the START and END markers replaced by block (ValueError without them)."""
    return splice_between(text, block, START, END)


# -- running ---------------------------------------------------------------------------------------------

def run_command(name: str, argv: list[str], timeout_s: float = 3600) -> dict:
    """Run one benchmark; {name, argv, exit_code, seconds, result (its JSON) or error}. Timed out,
    or this command stopped: the benchmark is sent SIGTERM (it stops its services) first."""
    start = time.monotonic()
    logger.info("running %s: %s", name, " ".join(argv))
    try:
        done = run_child(argv, timeout_s)
    except subprocess.TimeoutExpired:
        return {"name": name, "argv": argv, "exit_code": None, "seconds": timeout_s,
                "error": f"timed out after {timeout_s:.0f} s"}
    entry = {"name": name, "argv": argv, "exit_code": done.returncode, "seconds": time.monotonic() - start,
             "stderr_tail": done.stderr[-2000:]}
    lines = done.stdout.strip().splitlines()
    try:
        entry["result"] = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        entry["result"] = None
    if entry["result"] is None or done.returncode != 0:
        entry["error"] = f"exit code {done.returncode}: {done.stderr[-1500:]}"
    return entry


def failed_parts(entries: list[dict]) -> list[dict[str, str]]:
    """Every failure of a run, {part, error}: a benchmark that failed as a whole (no result), and
    each failed part of one that gave a result (`bench.part`)."""
    out = []
    for e in entries:
        parts = (e.get("result") or {}).get("failed") or []
        out += [{"part": f"{e['name']}: {f['part']}", "error": f["error"]} for f in parts]
        if e.get("error") and not parts:
            out.append({"part": e["name"], "error": _short(e["error"])})
    return out


def step_failures(report: dict) -> dict[str, str]:
    """name -> error of each benchmark that failed without a result (its headlines say so)."""
    return {e["name"]: _short(e["error"]) for e in report.get("steps", [])
            if e.get("error") and not e.get("result")}


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    out = Path(args.out).resolve()
    steps = [s for s in STEPS if (not args.only or s.name in args.only) and s.name not in args.skip]
    start = time.monotonic()
    entries = []
    with progress_for(args, len(steps) + 1, "bench all") as progress:
        for step in steps:
            progress.update(0, note=step.name)
            entries.append(run_command(step.name, step.argv(mode, out, args.keep_data)))
            progress.update(note=f"{step.name} done")
        if (out / "datapath" / "results.json").exists():
            argv = kvtb_argv("simulate", "--json", "--out", str(out / "simulate"),
                             "--calibrate", str(out / "datapath" / "results.json"))
            entries.append(run_command("simulate", argv))
        progress.update(note="simulate done")
    return {"bench": "all", "mode": mode, "command": " ".join(["kvtb bench all", *argv]),
            "machine": machine_info(), "seconds": time.monotonic() - start, "steps": entries,
            "ratios": {f"{e['name']}.{k}": v for e in entries if e.get("result")
                       for k, v in (e["result"].get("ratios") or {}).items()},
            "failed": failed_parts(entries)}


# -- the report ------------------------------------------------------------------------------------------

def results_of(report: dict[str, Any]) -> dict[str, dict]:
    """name -> result of the steps of a report that produced one."""
    return {e["name"]: e["result"] for e in report.get("steps", []) if e.get("result")}


def _step_section(entry: dict, out: Path) -> list[str]:
    name, result = entry["name"], entry.get("result")
    title = next((s.title for s in STEPS if s.name == name), SIMULATE_TITLE)
    command = " ".join(Path(a).name if i == 0 else a for i, a in enumerate(entry["argv"]))
    lines = [f"## {title}", "", f"`{command}` ({entry['seconds']:.0f} s, exit code {entry['exit_code']})", ""]
    if entry.get("error"):
        lines += ["**This benchmark failed:**", "", "```", entry["error"].strip()[-1500:], "```", ""]
    if not result:
        return lines
    if result.get("settings"):
        shown = {k: v for k, v in result["settings"].items() if k != "stack"}
        lines += [f"Settings: `{json.dumps(shown, default=str)[:800]}`", ""]
    try:
        lines += ["```", importlib.import_module(f"bench.{name}").table(result), "```", ""]
    except Exception as exc:  # noqa: BLE001 - a report still renders without one table
        logger.warning("no table for %s: %s", name, exc)
    lines += [f"![{name}]({os.path.relpath(plot, out)})" for plot in result.get("plots", [])]
    return lines + [""]


def render(report: dict, out: Path) -> str:
    """The whole report as Markdown (plots linked relative to `out`)."""
    m = report["machine"]
    lines = ["# kvtestbed benchmark report", "",
             f"Generated by `{report['command']}` ({report['mode']} mode) in {report['seconds']:.0f} s. "
             "Every figure below was measured in this run; every ratio compares figures measured side by "
             "side in the same run.", "", "## Machine", "", "| | |", "| --- | --- |",
             *(f"| {k} | {format_bytes(v) if k == 'memory_bytes' and v else v} |" for k, v in m.items()), ""]
    if report["failed"]:
        lines += ["**Failed:**", ""] + [f"- {_failure_line(f)}" for f in report["failed"]] + [""]
    lines += ["## Summary", "", headline_table(results_of(report), step_failures(report)), ""]
    for entry in report["steps"]:
        lines += _step_section(entry, out)
    return "\n".join(lines) + "\n"


def _failure_line(failure: dict | str) -> str:
    """'part: error' of a report's failure (an older report lists names alone)."""
    if isinstance(failure, str):
        return failure
    return f"{failure['part']}: {_short(failure['error'], 300)}"


def readme_block(report: dict, report_path: Path) -> str:
    """The headline table and the line that says where and by what it was measured."""
    m = report["machine"]
    table = headline_table(results_of(report), step_failures(report))
    return (f"{table}\n\nMeasured by `{report['command']}` on {m.get('cores')} "
            f"cores of an {m.get('cpu_model')} ({m.get('time_utc', '')[:10]}, commit "
            f"{(m.get('git_commit') or '')[:12]}); the whole report with tables and plots: `{report_path}`.")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb bench all", description=__doc__.splitlines()[0])
    add_common_args(parser, "report")
    parser.add_argument("--quick", action="store_true", help="reduced sizes (about a quarter of the time)")
    names = [s.name for s in STEPS]
    parser.add_argument("--only", nargs="+", choices=names, help="run only these benchmarks")
    parser.add_argument("--skip", nargs="+", choices=names, default=[], help="leave these out")
    parser.add_argument("--readme", type=Path, metavar="FILE",
                        help="also write the summary table into FILE, between its summary markers")
    args = parser.parse_args(argv)
    if args.quick and args.smoke:
        parser.error("--quick and --smoke exclude each other")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    setup_logging(args)
    with stop_on_sigterm():  # SIGTERM: the running benchmark is sent it too (run_child), then we stop
        report = run(args, argv)
    out = Path(args.out).resolve()
    write_json(out, "all.json", report)
    readme = out / "README.md"
    readme.write_text(render(report, out))
    if args.readme:
        block = readme_block(report, Path(args.out) / "README.md")
        args.readme.write_text(splice(args.readme.read_text(), block))
    if args.json:
        emit_json({k: v for k, v in report.items() if k != "steps"} | {"report": str(readme)})
    else:
        print(f"report: {readme}")
        for entry in report["steps"]:
            status = "failed" if entry.get("error") else "ok"
            print(f"  {entry['name']:<12} {status:<7} {entry['seconds']:.0f} s")
        for failure in report["failed"]:
            print(f"  FAILED {_failure_line(failure)}")
    if report["failed"]:
        print(f"kvtb bench all: failed: {', '.join(_failure_line(f) for f in report['failed'])}",
              file=sys.stderr)
        return 1
    return 0
