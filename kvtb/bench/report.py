"""`kvtb bench all`: every benchmark, then `kvtb simulate --calibrate`, and a Markdown report.

Each benchmark runs as its own process (`kvtb bench NAME --json --out OUT/NAME`), one after
the other, so one's services never share the cores with another's. The report
(OUT/README.md) says on what machine and with what settings it ran, shows each benchmark's
table and ratios, and embeds its plots; OUT/all.json holds every raw result.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from kvtb.bench import suite, summary
from kvtb.bench.common import add_common_args, progress_for
from kvtb.bench.emit import setup_logging
from kvtb.bench.machine import machine_info
from kvtb.bench.output import emit_json, write_json
from kvtb.bench.report_md import render

logger = logging.getLogger(__name__)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb bench all", description=__doc__.splitlines()[0])
    add_common_args(parser, "report")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="reduced sizes (about a quarter of the time)")
    mode.add_argument("--smoke", action="store_true", help="tiny sizes: checks that everything runs")
    names = [s.name for s in suite.STEPS]
    parser.add_argument("--only", nargs="+", choices=names, help="run only these benchmarks")
    parser.add_argument("--skip", nargs="+", choices=names, default=[], help="leave these out")
    parser.add_argument("--readme", type=Path, metavar="FILE",
                        help="also write the summary table into FILE, between its summary markers")
    return parser.parse_args(argv)


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    out = Path(args.out).resolve()
    steps = [s for s in suite.STEPS if (not args.only or s.name in args.only) and s.name not in args.skip]
    start = time.monotonic()
    entries = []
    with progress_for(args, len(steps) + 1, "bench all") as progress:
        for step in steps:
            progress.update(0, note=step.name)
            entries.append(suite.run_command(step.name, suite.step_argv(step, mode, out), out))
            progress.update(note=f"{step.name} done")
        if (out / "datapath" / "results.json").exists():
            entries.append(suite.run_command("simulate", suite.simulate_argv(out), out))
        progress.update(note="simulate done")
    return {"bench": "all", "mode": mode, "command": " ".join(["kvtb bench all", *argv]),
            "machine": machine_info(), "seconds": time.monotonic() - start, "steps": entries,
            "ratios": {f"{e['name']}.{k}": v for e in entries if e.get("result")
                       for k, v in (e["result"].get("ratios") or {}).items()},
            "failed": [e["name"] for e in entries if e.get("error")]}


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    setup_logging(args)
    report = run(args, argv)
    out = Path(args.out).resolve()
    write_json(out, "all.json", report)
    readme = out / "README.md"
    readme.write_text(render(report, out))
    if args.readme:
        m = report["machine"]
        block = (f"{summary.table(summary.results_of(report))}\n\n"
                 f"Measured by `{report['command']}` on {m.get('cores_logical')} cores of an "
                 f"{m.get('cpu_model')} ({m.get('time_utc', '')[:10]}, "
                 f"commit {m.get('git_commit', '')[:12]}); "
                 f"the whole report with tables and plots: `{Path(args.out) / 'README.md'}`.")
        args.readme.write_text(summary.splice(args.readme.read_text(), block))
    if args.json:
        emit_json({k: v for k, v in report.items() if k != "steps"} | {"report": str(readme)})
    else:
        print(f"report: {readme}")
        for entry in report["steps"]:
            status = "failed" if entry.get("error") else "ok"
            print(f"  {entry['name']:<12} {status:<7} {entry['seconds']:.0f} s")
    if report["failed"]:
        print(f"kvtb bench all: failed: {', '.join(report['failed'])}", file=sys.stderr)
        return 1
    return 0
