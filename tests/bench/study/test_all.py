"""kvtb study all: the headline table from one run, failures shown, the README block spliced."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.results import read_json
from bench.study import all as study_all
from kvtb.launch import kvtb_argv

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


def entry(name, result=None, error=None):
    step = next(s for s in study_all.STEPS if s.name == name)
    out = {"name": name, "argv": step.argv("quick", study_all.Path("/tmp/o")), "exit_code": 0 if not error else 1,
           "seconds": 60.0, "result": result}
    if error:
        out["error"] = error
    return out


def report(*entries):
    return {"study": "all", "mode": "quick", "command": "kvtb study all --quick", "seconds": 120.0,
            "machine": {"git_commit": "abcdef1234567890", "time_utc": "2026-11-27T12:00:00", "cores": 2,
                        "cpu_model": "a CPU"}, "steps": list(entries), "failed": []}


def test_a_failed_step_keeps_its_rows_and_says_failed():
    table = study_all.headline_table(report(entry("ttft", None, "exit code 1: boom")))
    rows = [line for line in table.splitlines()[2:]]
    assert rows and all("failed: exit code 1: boom" in row for row in rows)
    assert all("`kvtb bench ttft --sizes 64 128 256 512 2048 --reps 3`" in row for row in rows)


def test_quick_ttft_measures_below_512_so_a_crossover_there_is_bracketed():
    ttft = next(s for s in study_all.STEPS if s.name == "ttft")
    argv = ttft.argv("quick", study_all.Path("/o"))
    sizes = [int(a) for a in argv[argv.index("--sizes") + 1:argv.index("--reps")]]
    assert min(sizes) < 512 and int(argv[argv.index("--reps") + 1]) >= 3


def test_a_measured_ratio_lands_in_its_row():
    result = {"ratios": {"recompute_vs_restore_2048": 7.5, "restore_vs_resident_2048": 1.25}}
    table = study_all.headline_table(report(entry("ttft", result)))
    assert "| 7.5x |" in table and "| 1.25 |" in table


def test_the_readme_block_names_the_run_and_replaces_only_its_block():
    text = f"# x\nbefore\n{study_all.START}\nold row\n{study_all.END}\nafter\n"
    block = study_all.readme_block(report(entry("ttft", None, "boom")), "docs/results/README.md")
    new = study_all.splice(text, block)
    assert "old row" not in new and "before" in new and "after" in new
    assert "`kvtb study all --quick`" in new and "abcdef123456" in new
    with pytest.raises(ValueError):
        study_all.splice("no markers", block)


def test_a_step_run_on_another_commit_is_named():
    moved = entry("ttft", {"ratios": {}, "machine": {"git_commit": "fedcba9876543210"}})
    same = entry("ttft", {"ratios": {}, "machine": {"git_commit": "abcdef1234567890"}})
    assert study_all._commit_text(report(same)) == "commit abcdef123456"
    assert study_all._commit_text(report(moved)) == "commit abcdef123456 (ttft ran on fedcba987654)"


def test_a_step_that_prints_no_json_is_a_failure(tmp_path):
    step = study_all.Step("ttft", ("bench", "ttft"), "t")
    got = study_all.run_step(step, [sys.executable, "-c", "import sys; sys.exit(3)"], timeout_s=30)
    assert got["exit_code"] == 3 and "exit code 3" in got["error"]
    got = study_all.run_step(step, [sys.executable, "-c", "import time; time.sleep(5)"], timeout_s=0.5)
    assert got["exit_code"] is None and "timed out" in got["error"]


@pytest.mark.slow
def test_smoke_writes_the_report_and_the_readme_table(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{study_all.START}\nold\n{study_all.END}\n")
    out = tmp_path / "out"
    done = subprocess.run(kvtb_argv("study", "all", "--smoke", "--only", "eviction", "--json", "--out", str(out),
                                    "--readme", str(readme)), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["failed"] == [] and summary["mode"] == "smoke"
    assert (out / "eviction" / "README.md").exists() and (out / "all.json.gz").exists()
    text = readme.read_text()
    assert "old" not in text and "`kvtb study eviction --smoke`" in text
    page = (out / "README.md").read_text()
    assert "| figure | the seed's words [its numbers] |" in page and "| verdict |" in page
    assert "Verdicts over every study: " in page
    every = read_json(out / "all.json.gz")
    assert every["tally"]["by_step"]["eviction"] and every["budget"]["tiers"]["eviction"]["tier"] == "smoke"


def test_placements_go_to_bench_ttft_all_and_to_each_study_the_first():
    ttft = next(s for s in study_all.STEPS if s.name == "ttft")
    poster = next(s for s in study_all.STEPS if s.name == "poster")
    assert study_all.placement_args(ttft, None) == [] and study_all.placement_args(poster, None) == []
    assert study_all.placement_args(ttft, ["shared", "nic"]) == ["--placements", "shared", "nic"]
    assert study_all.placement_args(poster, ["shared", "nic"]) == ["--placement", "shared"]
    assert study_all.placement_args(poster, ["nic"]) == ["--placement", "nic"]
    assert study_all.parse_args(["--placements", "shared", "nic"]).placements == ["shared", "nic"]
    with pytest.raises(SystemExit):
        study_all.parse_args(["--placements", "numa"])


def test_ttft_in_both_placements_gets_a_row_for_each_and_nic_over_shared():
    result = {"ratios": {"recompute_vs_restore_2048": 7.5, "restore_vs_resident_2048": 1.17,
                         "restore_vs_resident_2048@shared": 1.17, "restore_vs_resident_2048@nic": 1.04,
                         "restore_vs_resident_2048@nic_vs_shared": 1.04 / 1.17},
              "results": {"by_placement": {"shared": {}, "nic": {}}}}
    table = study_all.headline_table(report(entry("ttft", result)))
    row = "| Follow-up TTFT, restored / resident, 2,048-token context, placement nic | 1.04 | at most 1.05"
    assert row in table
    assert "placement shared | 1.17 |" in table and "nic / shared | 0.89 |" in table
    assert study_all.placement_rows({"ratios": {}, "results": {"by_placement": {"shared": {}}}}) == []


def _claim(key, verdict):
    return {"key": key, "figure": "Sec. III-B", "claim": "words", "seed": "", "source": "seed", "measured": "m",
            "test": {"text": "< 0.03"}, "verdict": verdict, "why": "w"}


def test_study_rows_take_mappings_and_tuples_and_show_a_named_claims_verdict(monkeypatch):
    from bench.study import eviction
    rows = [{"question": "Real agent vs its replay", "measured": "0.1 vs 0.1", "target": "equal",
             "claim": "sec3b"},
            ("End-to-end, recompute / swap", "1.3x", "the poster: swap wins"),
            {"question": "Compute freed", "measured": "0.4 s/GB", "verdict": "disagrees"}]
    monkeypatch.setattr(eviction, "headline_rows", lambda study: rows)
    result = {"claims": [_claim("sec3b", "agrees")]}
    table = study_all.headline_table(report(entry("eviction", result)))
    assert "| Real agent vs its replay | 0.1 vs 0.1 | equal | agrees |" in table
    assert "| End-to-end, recompute / swap | 1.3x | the poster: swap wins | - |" in table
    assert "| Compute freed | 0.4 s/GB | - | disagrees |" in table
    with pytest.raises(ValueError):
        study_all.as_row({"measured": "no question"})


def test_tallies_count_each_study_and_all_and_the_page_shows_them():
    poster = entry("poster", {"claims": [_claim("a", "agrees"), _claim("b", "disagrees")]})
    evict = entry("eviction", {"claims": [_claim("c", "agrees"), _claim("d", "inconclusive")],
                               "settings": {"capacities": []}, "results": {}})
    got = study_all.tallies([poster, evict])
    assert got["by_step"]["poster"]["agrees"] == 1 and got["by_step"]["eviction"]["inconclusive"] == 1
    assert got["overall"]["agrees"] == 2 and got["overall"]["disagrees"] == 1
    page = study_all.render(report(poster, evict))
    assert "Verdicts over every study: 2 agrees, 1 disagrees, 1 inconclusive." in page
    assert "Verdicts: 1 agrees, 1 disagrees." in page and "| verdict |" in page


def test_an_older_claim_record_without_a_verdict_is_shown_not_judged():
    old = {"figure": "Fig. 2", "claim": "words", "measured": "m", "agrees": True, "why": "w"}
    records = study_all.claim_records({"claims": [old]})
    assert records[0]["verdict"].startswith("not judged")


def test_a_cut_step_is_named_on_its_section():
    rep = report(entry("poster", {"claims": []}))
    rep["mode"] = "full"
    rep["budget"] = {"text": "budget 3 h, estimated 2.1 h; cut to fit: poster quick", "cut": {"poster": "quick"}}
    page = study_all.render(rep)
    assert "Cut to fit the time budget: run as quick" in page and "budget 3 h" in page
    assert study_all.parse_args([]).hours == 3.0 and study_all.parse_args(["--hours", "0"]).hours == 0
    with pytest.raises(SystemExit):
        study_all.parse_args(["--hours", "-1"])


def test_the_budget_under_a_profile_takes_the_checks_slowdowns_rescaled_to_a_given_dilation(monkeypatch):
    from bench import profile_check
    measured = {"dilation": 50.0, "studies": {"poster": {"paced_over_real": 3.0}}}
    monkeypatch.setattr(profile_check, "check", lambda *a, **k: measured)
    slow, how = study_all.profile_slowdown("paper", ["poster", "ttft"], "auto")
    assert slow == {"poster": 3.0, "ttft": 3.0} and how.endswith("for paper at D = 50")
    slow, how = study_all.profile_slowdown("paper", ["poster"], "100")
    assert slow == {"poster": 6.0} and how.endswith("at D = 100")


def test_a_steps_time_limit_grows_with_its_slowdown_under_a_profile():
    from bench.study import all_budget
    plain = all_budget.plan(["poster"], "quick", None)
    paced = all_budget.plan(["poster"], "quick", None, {"poster": 4.6})
    assert study_all.step_timeout("quick", plain, "poster") == study_all.TIMEOUT_S["quick"]
    assert study_all.step_timeout("quick", paced, "poster") == 4.6 * study_all.TIMEOUT_S["quick"]
    assert study_all.step_timeout("full", paced, "ttft") == study_all.TIMEOUT_S["full"]  # none given: none
