"""`kvtb study all`: every study on today's code, one report, and the README's headline table.

Each study runs as its own process (`kvtb study NAME --json --out OUT/NAME`), one after the other,
so one's services never share the cores with another's; then `kvtb bench ttft` answers the
testbed's first question (a follow-up's KV restored against recomputed). OUT/README.md links
each study's page and sets every claims table side by side; OUT/all.json.gz (gzipped JSON: `zcat`)
holds every result.
`--readme FILE` writes the headline table between FILE's summary markers: every figure in it
comes from this one run, whose commit and command the block names. A study that fails is
reported with its error (its rows say `failed`), never left out.

CPU placement (kvtb.placement): `bench ttft` runs every placement of its `--placements` side by
side (by default `shared nic` on 2 CPUs or more), and is where the placement matters most (a
restore against a resident context, the NIC's work beside the forward's); the studies run once,
in one placement (`--placement`, shared by default), so that placing them does not double the
run. `--placements P...` passes P to `bench ttft` and the first of them to every study.

Full mode fits a time budget, `--hours` (default 3; 0: none): full mode of every step is estimated at
about 5.4 hours here, so before it starts the run plans each step's tier (bench.study.all_budget: full,
a documented cut, or quick): the fewest steps in quick mode, then the run closest to full. With 3 hours:
poster `--cut`, scalellm `--requests-per-client 1`, eviction quick, paper and ttft full; the plan and
every cut are in all.json.gz (`budget`), on the report and in the README block. Under `--profile`
every estimate is first multiplied by what pacing costs its step, from `kvtb profile check`'s
estimates measured as the run starts (`profile_slowdown`): under polaris-a100 full mode of the poster
alone is estimated at about 7 hours, so a profiled run is cut much further, and says so. Each step's
time limit (TIMEOUT_S, by mode) grows by its slowdown too, in quick mode as well.

A run in parts (`--resume`, bench.study.all_resume): OUT/all.json.gz is written after every step, so a run
stopped part-way (killed, or out of time) keeps what finished; the steps that already finished in OUT/all.json.gz
(same mode and profile) are kept and the rest run, so that full mode of every step can be taken in
sittings of a few hours; its budget is the whole run's, planned by the first part over every step (not
only those `--only` gives it) and kept by the later ones, so each step runs at the tier the budget gave it
and the report's cuts are the run's. A step that takes --resume itself (the poster: each finished point kept
in OUT/poster/journal.json, bench.study.poster_journal) is given it, so a step longer than a sitting is
taken in sittings too. The report and the README block name each part's command,
commit and date, and which steps it ran.

The headline table takes each study's `headline_rows(study)`: a list of rows, each a mapping with
`question`, `measured` and `target` (a missing target shows "-"), and optionally `verdict` (one of
bench.study.claims.VERDICTS) or `claim` (the key of one of the study's claims, whose verdict the row then
shows); a (question, measured, target) tuple is taken too. Each study's section sets its claims table
(report.claims_table: the seed's words, the measurement, the test and the verdict) under a tally of its
verdicts; the report opens with the tally over every study (claims.Tally), and all.json.gz keeps every
step's whole result, the tallies and the budget.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import logging
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.results import (
    emit_json,
    machine_info,
    progress_for,
    run_child,
    setup_logging,
    splice_between,
    read_json,
    stop_on_sigterm,
    write_json,
)
from bench import scaled
from bench.study import all_budget, all_resume
from bench.study.claims import Tally
from bench.study.report import claims_table
from kvtb.launch import kvtb_argv
from kvtb.placement import PLACEMENTS

logger = logging.getLogger(__name__)

START = "<!-- kvtb study all: summary start -->"
END = "<!-- kvtb study all: summary end -->"
TIMEOUT_S = {"full": 6 * 3600, "quick": 30 * 60, "smoke": 10 * 60}


@dataclasses.dataclass(frozen=True)
class Step:
    """One study (or benchmark): its command words, its title, and the extra arguments per mode."""

    name: str
    words: tuple[str, ...]
    title: str
    extra: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    resumable: bool = False  # takes --resume: keeps what a stopped run of it finished (bench.study.poster_journal)

    def argv(self, mode: str, out: Path, keep_data: bool = False) -> list[str]:
        flag = {"full": (), "quick": ("--quick",), "smoke": ("--smoke",)}[mode]
        if self.words[0] == "bench" and mode == "quick":
            flag = ()  # the benchmarks' own quick arguments are in `extra`
        return kvtb_argv(*self.words, "--json", "--out", str(out / self.name), *flag,
                         *self.extra.get(mode, ()), *(("--keep-data",) if keep_data else ()))


STEPS = (
    Step("poster", ("study", "poster"), "Recompute against swap (the poster's Figs 2-6)", resumable=True),
    Step("scalellm", ("study", "scalellm"), "Latency against concurrency (ScaleLLM's Table 1, Figs 6-7)"),
    Step("paper", ("study", "paper"), "KV transfer, CPU-centric against triggered (the paper's Figs 2, 5-7)"),
    Step("eviction", ("study", "eviction"), "Eviction on a conversation trace, against Belady's bound"),
    # quick: sizes from 64 tokens, so that a crossover below 512 is bracketed, not guessed; 3 repeats
    Step("ttft", ("bench", "ttft"), "A follow-up's KV restored against recomputed",
         {"quick": ("--sizes", "64", "128", "256", "512", "2048", "--reps", "3")}),
)
NAMES = tuple(s.name for s in STEPS)
REPORT = "all.json.gz"  # every step's whole result, compressed: the raw data a committed run keeps in git
PROFILED = ("paper", "poster", "scalellm", "eviction", "ttft")  # the steps that take --profile (bench/scaled.py)


# -- running ---------------------------------------------------------------------------------------------

def placement_args(step: Step, placements: list[str] | None) -> list[str]:
    """The placement arguments of a step: the benchmark (ttft) runs every placement asked for side by
    side, a study the first; none asked for: each its default (ttft both where it can, studies shared)."""
    if not placements:
        return []
    return ["--placements", *placements] if step.words[0] == "bench" else ["--placement", placements[0]]


def run_step(step: Step, argv: list[str], timeout_s: float) -> dict:
    """Run one step; {name, argv, exit_code, seconds, result (its JSON) or error}."""
    start = time.monotonic()
    logger.info("running %s: %s", step.name, shlex.join(argv))
    try:
        done = run_child(argv, timeout_s)
    except subprocess.TimeoutExpired:
        return {"name": step.name, "argv": argv, "exit_code": None, "seconds": timeout_s,
                "error": f"timed out after {timeout_s:.0f} s"}
    entry = {"name": step.name, "argv": argv, "exit_code": done.returncode, "seconds": time.monotonic() - start}
    lines = done.stdout.strip().splitlines()
    try:
        entry["result"] = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        entry["result"] = None
    if entry["result"] is None:
        entry["error"] = f"exit code {done.returncode}: {done.stderr.strip()[-1500:]}"
    elif done.returncode != 0:
        failed = entry["result"].get("failed") or []
        entry["error"] = "; ".join(f"{f.get('part')}: {f.get('error')}" if isinstance(f, dict) else str(f)
                                   for f in failed) or f"exit code {done.returncode}: {done.stderr.strip()[-800:]}"
    return entry


def step_timeout(mode: str, budget: all_budget.Plan, name: str) -> float:
    """A step's time limit: its mode's, times its slowdown under a profile (a quick poster under polaris-a100
    outran the plain 30 minutes)."""
    return TIMEOUT_S[mode] * max(1.0, (budget.slowdown or {}).get(name, 1.0))


def profile_slowdown(profile: str, names: list[str], dilation: str | float) -> tuple[dict[str, float], str]:
    """Each step's slowdown under `profile` for the time budget (all_budget.slowdowns), from
    `kvtb profile check`'s estimates, measured here (about 15 s); a D given in numbers rescales them."""
    from bench import profile_check
    from scale import profile as pf
    check = profile_check.check(pf.load(profile), quick=False, margin=2.0, repeats=3)
    studies = check["studies"]
    try:
        scale = float(dilation) / check["dilation"]
    except (TypeError, ValueError):  # auto: the check's own recommendation stands in for the warm-up's
        scale = 1.0
    if scale != 1.0:
        studies = {n: e | ({"paced_over_real": max(1.0, e["paced_over_real"] * scale)}
                           if e.get("paced_over_real") is not None else {}) for n, e in studies.items()}
    slow, how = all_budget.slowdowns(names, studies)
    return slow, f"{how} for {profile} at D = {check['dilation'] * scale:.3g}"


def run(args: argparse.Namespace, argv: list[str]) -> dict:
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    out = Path(args.out).resolve()
    steps = [s for s in STEPS if (not args.only or s.name in args.only) and s.name not in args.skip]
    profiled = getattr(args, "profile", "")
    if profiled:  # the studies that run under a hardware profile; the others are said to be left out
        left = [s.name for s in steps if s.name not in PROFILED]
        steps = [s for s in steps if s.name in PROFILED]
        if left:
            logger.warning("under --profile, %s do not run (only %s take a profile)", ", ".join(left),
                           ", ".join(PROFILED))
    previous, hours = getattr(args, "previous", None), getattr(args, "hours", None)
    steps = [s for s in steps if s.name not in all_resume.done(previous)]  # --resume: each step once
    resume = getattr(args, "resume", False)
    names = ([s.name for s in STEPS if s.name not in args.skip and (not profiled or s.name in PROFILED)]
             if resume else [s.name for s in steps])
    slow = (profile_slowdown(profiled, names, args.dilation)
            if profiled and mode != "smoke" and not all_resume.kept(previous, names) else (None, ""))
    if resume:  # a part of a run: the budget is the whole run's, planned once
        budget = all_resume.plan(previous, names, mode, hours, *slow)
    else:
        budget = all_budget.plan(names, mode, hours, *slow)
    if not budget.fits:
        logger.warning("study all: %s", budget.text())
    start, machine = time.monotonic(), machine_info()  # the commit as the run starts
    entries = []

    def report_of(entries: list[dict]) -> dict:
        report = {"study": "all", "mode": mode, "command": shlex.join(["kvtb", "study", "all", *argv]),
                  "machine": machine, "seconds": time.monotonic() - start, "steps": entries,
                  "placements": args.placements or "each step's default",
                  "profile": profiled or None, "budget": budget.to_json()}
        report = all_resume.merge(previous, report, NAMES)
        done = report["steps"]
        return report | {"tally": tallies(done),
                         "ratios": {f"{e['name']}.{k}": v for e in done if e.get("result")
                                    for k, v in (e["result"].get("ratios") or {}).items()},
                         "failed": [{"part": e["name"], "error": e["error"]} for e in done if e.get("error")]}

    with progress_for(args, len(steps), "study all") as progress:
        for step in steps:
            progress.update(0, note=step.name)
            tier = budget.tiers[step.name]
            step_argv = (step.argv(tier.mode, out, args.keep_data) + list(tier.extra)
                         + placement_args(step, args.placements))
            if profiled:
                step_argv += ["--profile", profiled, "--dilation", str(args.dilation)]
            if resume and step.resumable:  # a step stopped part-way keeps its own finished points too
                step_argv.append("--resume")
            entries.append(run_step(step, step_argv, step_timeout(tier.mode, budget, step.name)))
            progress.update(note=f"{step.name} {'failed' if entries[-1].get('error') else 'done'}")
            if step is not steps[-1]:  # what finished so far, kept: a run stopped later goes on with --resume
                write_json(out, REPORT, report_of(list(entries)))
    return report_of(entries)


# -- the headline table ---------------------------------------------------------------------------------

def as_row(raw: Any) -> dict:
    """A headline row as the table takes it: {question, measured, target, verdict, claim}, from a mapping
    (question and measured required) or a (question, measured[, target]) tuple."""
    if isinstance(raw, dict):
        if "question" not in raw or "measured" not in raw:
            raise ValueError(f"a headline row needs a question and a measured value, got keys {sorted(raw)}")
        row = dict(raw)
    elif isinstance(raw, (tuple, list)) and 2 <= len(raw) <= 4:
        row = dict(zip(("question", "measured", "target"), raw))
    else:
        raise ValueError(f"a headline row is a mapping or a (question, measured, target) tuple, got {raw!r}")
    row.setdefault("target", "-")
    return row


def row_verdict(row: dict, result: dict | None) -> str:
    """The row's own verdict, or that of the claim it names (by key) in the step's result; else '-'."""
    if row.get("verdict"):
        return str(row["verdict"])
    key = row.get("claim")
    found = next((c for c in (result or {}).get("claims") or [] if c.get("key") == key), None) if key else None
    return str(found.get("verdict") or "-") if found else "-"


def _rows_of(entry: dict) -> list[dict]:
    """A step's headline rows (question, measured, target, verdict), from its own module."""
    name, result = entry["name"], entry.get("result")
    if name == "ttft":
        from bench import suite
        rows = [{"question": q, "measured": v, "target": t}
                for q, v, t, _ in suite.headline_rows({"ttft": result})] if result else []
        rows += placement_rows(result)
        if not rows:
            rows = [{"question": h.question, "measured": "", "target": h.target}
                    for h in suite.HEADLINES if h.bench == "ttft"]
    else:
        module = importlib.import_module(f"bench.study.{name}")
        try:
            rows = [as_row(r) for r in module.headline_rows(result)] if result else []
        except Exception as exc:  # noqa: BLE001 - a study whose result lacks a figure still gets its row
            logger.warning("no headline rows for %s: %s", name, exc)
            rows = [{"question": f"{name} study", "measured": f"failed: no headline ({exc})", "target": "-"}]
        rows = rows or [{"question": f"{name} study", "measured": "", "target": "-"}]
    if entry.get("error"):
        for row in rows:
            if not row["measured"] or entry.get("result") is None:
                row["measured"] = f"failed: {entry['error'][:300]}"
    for row in rows:
        row["verdict"] = row_verdict(row, result)
    return rows


def claim_records(result: dict | None) -> list[dict]:
    """A step's claim records; one without a verdict (an older record) is shown as not judged."""
    return [c if "verdict" in c else {**c, "verdict": "not judged (no verdict in the record)"}
            for c in (result or {}).get("claims") or []]


def tallies(entries: list[dict]) -> dict:
    """Each step's verdict counts and the counts over every step (claims.Tally)."""
    by = {e["name"]: Tally.of(claim_records(e.get("result"))).counts for e in entries
          if claim_records(e.get("result"))}
    overall = Tally()
    for counts in by.values():
        for verdict, n in counts.items():
            overall.counts[verdict] = overall.counts.get(verdict, 0) + n
    return {"overall": overall.counts, "by_step": by}


def tally_text(counts: dict[str, int]) -> str:
    """'3 agrees, 1 disagrees' (no claims: 'no claims')."""
    return Tally(dict(counts)).text() or "no claims"


def placement_rows(result: dict | None) -> list[dict]:
    """bench ttft's restore / resident at 2,048 tokens in each placement it ran, when it ran more
    than one, and nic / shared."""
    ratios = (result or {}).get("ratios") or {}
    by = ((result or {}).get("results") or {}).get("by_placement") or {}
    if len(by) < 2:
        return []
    key = "restore_vs_resident_2048"
    rows = [{"question": f"Follow-up TTFT, restored / resident, 2,048-token context, placement {name}",
             "measured": f"{ratios[f'{key}@{name}']:.2f}" if f"{key}@{name}" in ratios else "",
             "target": "at most 1.05 (issue 30)" if name == "nic" else "at most 1.1"} for name in by]
    if f"{key}@nic_vs_shared" in ratios:
        rows.append({"question": "Follow-up TTFT restored / resident at 2,048 tokens, nic / shared",
                     "measured": f"{ratios[f'{key}@nic_vs_shared']:.2f}", "target": "-"})
    return rows


def _command(entry: dict) -> str:
    argv = entry["argv"]
    rest = argv[argv.index("-m") + 2:] if "-m" in argv else argv[1:]
    keep, skip = [], False
    for word in rest:  # the command as a user types it, without the run's own output options
        if skip:
            skip = False
            continue
        if word == "--out":
            skip = True
            continue
        if word != "--json":
            keep.append(word)
    return "`" + shlex.join(["kvtb", *keep]) + "`"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def headline_table(report: dict) -> str:
    """One row per headline figure of every step, with the command that measured it."""
    lines = ["| question | measured | the seed's figure, floor or goal | verdict | by |",
             "| --- | --- | --- | --- | --- |"]
    for entry in report["steps"]:
        for row in _rows_of(entry):
            lines.append(f"| {_cell(row['question'])} | {_cell(row['measured'] or 'not measured')} "
                         f"| {_cell(row['target'])} | {_cell(row['verdict'])} | {_command(entry)} |")
    return "\n".join(lines)


def _commit_text(report: dict) -> str:
    """The run's commit, and each step's own where one differs (the tree changed during the run)."""
    first = (report["machine"].get("git_commit") or "unknown")[:12]
    own = {e["name"]: ((e.get("result") or {}).get("machine") or {}).get("git_commit") for e in report["steps"]}
    differ = {name: commit[:12] + ("-dirty" if commit.endswith("-dirty") else "")
              for name, commit in own.items() if commit and commit[:12] != first[:12]}
    if not differ:
        return f"commit {first}"
    return f"commit {first} (" + ", ".join(f"{name} ran on {c}" for name, c in differ.items()) + ")"


def readme_block(report: dict, report_path: str) -> str:
    """The headline table and the line that says which run, commit and command it comes from."""
    m = report["machine"]
    parts = all_resume.parts_text(report)
    if parts:
        return (f"{headline_table(report)}\n\nEvery figure above comes from one {report['mode']}-mode run in "
                f"{parts}; {report['seconds'] / 60:.0f} min in all, on {m.get('cores')} cores of an "
                f"{m.get('cpu_model')}; each study's page, claims and plots: `{report_path}`.")
    return (f"{headline_table(report)}\n\nEvery figure above comes from one run: `{report['command']}` "
            f"({report['mode']} mode, {report['seconds'] / 60:.0f} min; {_budget_text(report)}) of "
            f"{_commit_text(report)}, "
            f"{m.get('time_utc', '')[:10]}, on {m.get('cores')} "
            f"cores of an {m.get('cpu_model')}; each study's page, claims and plots: `{report_path}`.")


def _budget_text(report: dict) -> str:
    """The run's budget and cuts in words ('no time budget' for a report without one)."""
    return (report.get("budget") or {}).get("text") or "no time budget"


def splice(text: str, block: str) -> str:
    """text with everything between the START and END markers replaced by block (ValueError without them)."""
    return splice_between(text, block, START, END)


# -- the report -------------------------------------------------------------------------------------------

def render(report: dict) -> str:
    """OUT/README.md: the headline table, then each study's claims beside the seed's, linking its page."""
    lines = ["# kvtestbed: the studies", "",
             f"Generated by `{report['command']}` ({report['mode']} mode) in {report['seconds'] / 60:.1f} min. "
             "Every figure was measured in this run; every ratio compares figures measured side by side.", "",
             f"Time: {_budget_text(report)}.", "",
             *([f"Taken in {all_resume.parts_text(report)}.", ""] if all_resume.parts_text(report) else []),
             f"Verdicts over every study: {tally_text(tallies(report['steps'])['overall'])}.", "",
             "## Headline", "", headline_table(report), ""]
    if report["failed"]:
        lines += ["**Failed:** " + "; ".join(f"{f['part']}: {_cell(f['error'][:300])}" for f in report["failed"]), ""]
    for entry in report["steps"]:
        step = next(s for s in STEPS if s.name == entry["name"])
        result = entry.get("result") or {}
        lines += [f"## {step.title}", "",
                  f"{_command(entry)}: {entry['seconds'] / 60:.1f} min, exit code {entry['exit_code']}. "
                  + (f"Page: [{step.name}/README.md]({step.name}/README.md)." if step.words[0] == "study"
                     else f"Raw results: its entry in `{REPORT}`."), ""]
        cut = ((report.get("budget") or {}).get("cut") or {}).get(step.name)
        if cut and report["mode"] == "full":
            lines += [f"**Cut to fit the time budget: run as {cut}, not full mode.**", ""]
        if entry.get("error"):
            lines += [f"**Failed:** {_cell(entry['error'][:600])}", ""]
        records = claim_records(result)
        if records:
            lines += [f"Verdicts: {tally_text(Tally.of(records).counts)}.", "", claims_table(records), ""]
        lines += [f"![{Path(p).stem}]({step.name}/{Path(p).name})" for p in result.get("plots", [])[:3]]
        lines.append("")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvtb study all", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
    parser.add_argument("--out", type=Path, default=Path("out") / "study",
                        help="output directory (default out/study; docs/results holds a committed run)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="every study's --quick (about 25 minutes here)")
    mode.add_argument("--smoke", action="store_true", help="every study's --smoke (a tiny model: minutes)")
    parser.add_argument("--hours", type=float, default=all_budget.DEFAULT_HOURS,
                        help="full mode's time budget in hours (default 3; 0: none): full mode of every step "
                             "is estimated at 5.4 h here, so steps are cut (the fewest in quick mode, then the "
                             "run closest to full) until the estimate fits; with 3 h: poster --cut, scalellm "
                             "--requests-per-client 1, eviction quick (bench/study/all_budget.py; the plan is "
                             "in all.json.gz and the report); under --profile each estimate is first "
                             "multiplied by what `kvtb profile check` says pacing costs that step")
    parser.add_argument("--keep-data", action="store_true", help="keep the services' data and logs")
    parser.add_argument("--resume", action="store_true",
                        help="keep the steps that already finished in OUT/all.json.gz (same mode and profile) and "
                             "run the rest: a full run taken in parts, each step once, one report; the first part "
                             "plans the budget over every step, the later ones keep its plan "
                             "(bench/study/all_resume.py)")
    parser.add_argument("--only", nargs="+", choices=NAMES, help="run only these")
    parser.add_argument("--skip", nargs="+", choices=NAMES, default=[], help="leave these out")
    parser.add_argument("--placements", nargs="+", choices=PLACEMENTS, metavar="PLACEMENT",
                        help="CPU placements: bench ttft runs them all side by side, each study the "
                             "first (default: bench ttft's own, shared nic on 2 CPUs or more; "
                             "studies shared)")
    parser.add_argument("--readme", type=Path, metavar="FILE",
                        help="also write the headline table into FILE, between its summary markers")
    scaled.add_profile_args(parser)
    args = parser.parse_args(argv)
    if args.hours < 0:
        parser.error("--hours must not be negative")
    profile = scaled.check(parser, args)
    if profile is not None and args.out == Path("out") / "study":
        args.out = Path("out") / "study" / f"profile-{profile.name}"  # beside today's pages
    args.previous = None
    if args.resume:
        path = next((p for p in (Path(args.out) / REPORT, Path(args.out) / "all.json") if p.is_file()), None)
        try:  # all.json: a part written before the report was compressed
            args.previous = read_json(path) if path is not None else None
        except (OSError, ValueError) as exc:
            parser.error(f"--resume: {path} cannot be read ({exc})")
        mode = "smoke" if args.smoke else "quick" if args.quick else "full"
        why = all_resume.check(args.previous, mode, getattr(args, "profile", "") or None)
        if why:
            parser.error(f"--resume: {why}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    setup_logging(args)
    if args.readme is not None:
        splice(args.readme.read_text(), "")  # no markers: say so before an hour of work, not after
    with stop_on_sigterm():
        report = run(args, argv)
    out = Path(args.out).resolve()
    write_json(out, REPORT, report)
    (out / "all.json").unlink(missing_ok=True)  # an earlier part's, uncompressed: carried into this one
    readme = out / "README.md"
    readme.write_text(render(report))
    if args.readme:
        args.readme.write_text(splice(args.readme.read_text(), readme_block(report, str(args.out / "README.md"))))
    if args.json:
        emit_json({k: v for k, v in report.items() if k != "steps"} | {"report": str(readme)})
    else:
        print(f"report: {readme}")
        for entry in report["steps"]:
            status = "failed" if entry.get("error") else "ok"
            print(f"  {entry['name']:<10} {status:<7} {entry['seconds'] / 60:.1f} min")
    for failure in report["failed"]:
        print(f"kvtb study all: {failure['part']} failed: {failure['error'][:500]}", file=sys.stderr)
    return 1 if report["failed"] else 0
