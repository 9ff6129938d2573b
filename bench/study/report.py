"""What every study shares: its options, its JSON contract, its claims, its failures and its page.

A study's result is one JSON object: `study`, `mode` (full, quick or smoke), `machine`,
`settings` (with the `placement` its services ran in: `--placement shared|nic`, each stack started
in it; the machine record says each service's CPUs), `results`, `claims` (the study's claims table
judged by bench.study.claims: per claim its key, figure, the seed's words and numbers, the measure, the
test, the values per repeat, the noise band and the verdict), `ratios`
(figures measured side by side in the same run), `plots`, `failed` (a part that raised: its name
and error, never left out silently) and `elapsed_s`. `finish` writes OUT/results.json and
OUT/README.md (the page: the seed's claims beside ours, the ratios, the plots, the failures) and
prints the result as one JSON line (--json) or as the page's text.
"""
from __future__ import annotations

import argparse
import logging
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import scaled
from bench.study import claims
from bench.results import emit_json, machine_info, placement_info, setup_logging, stop_on_sigterm, write_json
from kvtb.placement import PLACEMENTS

logger = logging.getLogger(__name__)

MODES = ("full", "quick", "smoke")


def add_study_args(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """--json, --out DIR (default out/study/NAME), --quick, --smoke, --keep-data and --placement."""
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the page")
    parser.add_argument("--out", type=Path, default=Path("out") / "study" / name,
                        help=f"output directory (default out/study/{name})")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="fewer points and repeats (about 15 minutes here)")
    mode.add_argument("--smoke", action="store_true", help="a tiny random model and tiny sizes: seconds")
    parser.add_argument("--keep-data", action="store_true",
                        help="keep the services' data and logs in OUT/services (default: a temp dir)")
    parser.add_argument("--placement", choices=PLACEMENTS, default="shared",
                        help="the CPU placement the study's services run in (kvtb.placement; default "
                             "shared; nic: the agent, storage and frontend on the NIC's cores, the compute "
                             "node on the rest)")
    scaled.add_profile_args(parser)
    return parser


def check_profile(parser: argparse.ArgumentParser, args: argparse.Namespace, name: str):
    """The study's --profile checked (a parser error names what is wrong); its pages go beside today's:
    out/study/NAME-PROFILE unless --out was given."""
    profile = scaled.check(parser, args)
    if profile is not None and Path(args.out) == Path("out") / "study" / name:
        args.out = Path("out") / "study" / f"{name}-{profile.name}"
    return profile


def mode_of(args: argparse.Namespace) -> str:
    return "smoke" if getattr(args, "smoke", False) else "quick" if getattr(args, "quick", False) else "full"


def new_study(name: str, args: argparse.Namespace, settings: dict[str, Any]) -> dict[str, Any]:
    """The skeleton of a study's JSON, to fill in."""
    settings = {**settings, "placement": getattr(args, "placement", "shared")}
    return {"study": name, "mode": mode_of(args), "machine": machine_info(), "settings": settings,
            "results": {}, "claims": [], "ratios": {}, "plots": [], "failed": [],
            "_started": time.monotonic()}


def judge(study: dict, table, results: dict | None = None) -> list[dict]:
    """The study's claims table (bench.study.claims) judged on its results: each claim's record appended
    to study["claims"] (a part that failed leaves its claims `not measured`, saying which part)."""
    profile = (study.get("settings") or {}).get("profile") or ""

    def why_unmeasured(c) -> str:
        return unmeasured(study, study["failed"][0]["part"]) if study["failed"] else ""

    records = claims.evaluate(table, study["results"] if results is None else results, profile,
                              why_unmeasured)
    study["claims"].extend(records)
    return records


def fail(study: dict, part: str, exc: BaseException) -> None:
    """Record a part that failed: its error is reported, never dropped."""
    logger.error("study %s: %s failed: %s", study["study"], part, exc)
    study["failed"].append({"part": part, "error": f"{type(exc).__name__}: {exc}",
                            "traceback": traceback.format_exc(limit=8)})


def run_part(study: dict, part: str, fn: Callable[[], Any]) -> Any:
    """fn(), or None after recording its failure (KeyboardInterrupt and SystemExit go on up)."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a failed part is reported with its error
        fail(study, part, exc)
        return None


def unmeasured(study: dict, part: str) -> str:
    """The `measured` text of a claim whose part failed or did not run."""
    errors = [f["error"] for f in study["failed"] if f["part"] == part]
    return f"not measured: {part} failed ({errors[0]})" if errors else f"not measured: {part} did not run"


# -- the page ------------------------------------------------------------------------------------------

def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def verdict_text(c: dict) -> str:
    """The verdict as the page shows it."""
    return {"out of scope": "out of scope", "invalid": "invalid (dilation violations)"}.get(
        c["verdict"], c["verdict"])


def _words(c: dict) -> str:
    quoted = f"\u201c{c['claim']}\u201d" if c.get("source", "seed") == "seed" else f"(our hypothesis) {c['claim']}"
    return quoted + (f" [seed: {c['seed']}]" if c.get("seed") else "")


def claims_table(records: list[dict]) -> str:
    """The seed's claims beside ours, as a Markdown table."""
    rows = ["| figure | the seed's words [its numbers] | measured here | test | verdict | why |",
            "| --- | --- | --- | --- | --- | --- |"]
    for c in records:
        test = (c.get("test") or {}).get("text", "")
        rows.append(f"| {_cell(c['figure'])} | {_cell(_words(c))} | {_cell(c['measured'])} | {_cell(test)} "
                    f"| {verdict_text(c)} | {_cell(c['why'])} |")
    return "\n".join(rows)


def placement_text(record: Any) -> str:
    """'placement nic (compute 0, frontend 1, smartnic 1, storage 1; torch threads 1)'."""
    if not isinstance(record, dict):
        return "placement not recorded"
    cpus = ", ".join(f"{service} {c or 'all'}" for service, c in sorted((record.get("cpus") or {}).items()))
    threads = f"; torch threads {record['torch_threads']}" if record.get("torch_threads") else ""
    return f"placement {record.get('name')} ({cpus}{threads})"


def scale_lines(record: Any) -> list[str]:
    """The page's word on a scale model: the profile, D, virtual time, the violations."""
    if not isinstance(record, dict):
        return []
    d = record.get("dilation")
    d_text = f"D = {d:.3g}" if isinstance(d, (int, float)) else f"D {d}"
    pacing = record.get("pacing") or {}
    bad = record.get("invalid_kinds") or []
    return [f"**Under hardware profile `{record.get('profile')}`: times are virtual (wall / D), {d_text} "
            f"({record.get('dilation_chosen', '')}); {pacing.get('violations', 0)} of {pacing.get('ops', 0)} "
            f"paced operations violated their budget"
            + (f"; kinds over 1%: {', '.join(bad)} (claims depending on them are invalid)" if bad else "")
            + ".**", ""]


def page(study: dict, title: str, intro: str, body: str = "") -> str:
    """The study's Markdown page: what it is, where and how it ran, the claims, ratios, plots, failures."""
    m = study["machine"]
    lines = [f"# {title}", "", intro.strip(), "",
             f"Run: `{study.get('command', 'kvtb study ' + study['study'])}` ({study['mode']} mode), commit "
             f"`{(m.get('git_commit') or 'unknown')[:12]}`, {m.get('time_utc')}, on {m.get('cores')} cores of "
             f"{m.get('cpu_model')} (load average {m.get('load_average_1m')}), torch {m.get('torch')}; "
             f"{study.get('elapsed_s', 0):.0f} s; {placement_text(m.get('placement'))}.", "",
             *scale_lines(study.get("scale")),
             "## The seed's claims beside ours", "", claims_table(study["claims"]), ""]
    if study["ratios"]:
        lines += ["## Ratios (measured side by side in this run)", "", "| ratio | value |", "| --- | --- |"]
        lines += [f"| `{k}` | {v:.3g} |" if isinstance(v, float) else f"| `{k}` | {v} |"
                  for k, v in study["ratios"].items()]
        lines.append("")
    if body.strip():
        lines += [body.strip(), ""]
    if study["plots"]:
        lines += ["## Plots", ""]
        lines += [f"![{Path(p).stem}]({Path(p).name})" for p in study["plots"]]
        lines.append("")
    if study["failed"]:
        lines += ["## Failed", ""]
        lines += [f"- **{f['part']}**: {_cell(f['error'])}" for f in study["failed"]]
        lines.append("")
    return "\n".join(lines)


def invalidate(study: dict) -> None:
    """Under a profile whose run had kinds over 1% of violations: a judged claim is invalid, never agreed
    (every claim of a study depends on its times). A claim already invalid stays so."""
    bad = (study.get("scale") or {}).get("invalid_kinds") or []
    if not bad:
        return
    for c in study["claims"]:
        if c["verdict"] in claims.JUDGED:
            c["verdict"] = "invalid"
            c["why"] += f" [invalid: dilation violations over 1% in {', '.join(bad)}]"


def finish(args: argparse.Namespace, study: dict, title: str, intro: str, body: str = "") -> int:
    """Write OUT/results.json and OUT/README.md; print one JSON line (--json) or the page.
    Exit status 1 when a part failed (the result still says everything that was measured)."""
    study["elapsed_s"] = time.monotonic() - study.pop("_started", time.monotonic())
    invalidate(study)
    if isinstance(study.get("machine"), dict):  # the stacks started after new_study made the record
        study["machine"]["placement"] = placement_info()
    study["plots"] = [str(p) for p in study["plots"] if p]
    study["page"] = str(Path(args.out) / "README.md")
    write_json(args.out, "results.json", study)
    text = page(study, title, intro, body)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "README.md").write_text(text)
    if args.json:
        emit_json(study)
    else:
        print(text)
        print(f"\nraw results: {Path(args.out) / 'results.json'}\npage: {study['page']}")
    return 1 if study["failed"] else 0


def main_of(parse_args: Callable[[list[str]], argparse.Namespace],
            run: Callable[[argparse.Namespace], tuple[dict, str, str, str]]) -> Callable[[list[str] | None], int]:
    """A study's main: parse, log, run under stop_on_sigterm, finish. `run` returns
    (study, title, intro, body)."""
    def main(argv: list[str] | None = None) -> int:
        import sys
        args = parse_args(sys.argv[1:] if argv is None else argv)
        if getattr(args, "profile", "") and getattr(args, "profile_obj", None) is None:
            print("kvtb study: this study does not take --profile (kvtb study all --help names those that "
                  "do); run it without --profile", file=sys.stderr)
            return 2
        setup_logging(args)
        with stop_on_sigterm():
            study, title, intro, body = run(args)
        study["command"] = " ".join(["kvtb", "study", study["study"], *(sys.argv[1:] if argv is None else argv)])
        return finish(args, study, title, intro, body)
    return main
