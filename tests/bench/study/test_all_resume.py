"""`kvtb study all --resume`: the steps that finished are kept with the part they came from, the rest run."""
import json

import pytest

from bench.study import all as study_all
from bench.study import all_resume

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

ORDER = ("poster", "scalellm", "paper", "eviction", "ttft")


def entry(name, ok=True, seconds=60.0):
    e = {"name": name, "argv": ["kvtb", "study", name], "exit_code": 0 if ok else 1, "seconds": seconds,
         "result": {"claims": [], "machine": {"git_commit": "aaa"}}}
    if not ok:
        e["error"] = "boom"
    return e


def report(steps, commit="aaa", command="kvtb study all --only x", mode="full", profile=None):
    return {"mode": mode, "profile": profile, "command": command, "seconds": sum(e["seconds"] for e in steps),
            "machine": {"git_commit": commit, "time_utc": "2026-11-29T10:00:00"}, "steps": steps}


def test_the_finished_steps_are_carried_and_a_failed_one_is_not():
    first = all_resume.merge(None, report([entry("poster"), entry("paper", ok=False)]), ORDER)
    assert all_resume.done(first).keys() == {"poster"}
    second = all_resume.merge(first, report([entry("paper"), entry("ttft")], commit="bbb",
                                            command="kvtb study all --resume"), ORDER)
    assert [e["name"] for e in second["steps"]] == ["poster", "paper", "ttft"]   # in the steps' order
    assert second["steps"][0]["carried"] and not second["steps"][1].get("carried")
    assert [p["steps"] for p in second["parts"]] == [["poster"], ["paper", "ttft"]]
    assert [p["commit"] for p in second["parts"]] == ["aaa", "bbb"]
    assert second["seconds"] == 180.0
    text = all_resume.parts_text(second)
    assert text.startswith("2 parts") and "commit aaa" in text and "commit bbb" in text


def test_a_step_run_again_replaces_the_carried_one_and_its_part_drops_out():
    first = all_resume.merge(None, report([entry("poster")]), ORDER)
    second = all_resume.merge(first, report([entry("poster", seconds=5.0)], commit="bbb"), ORDER)
    assert len(second["steps"]) == 1 and not second["steps"][0].get("carried")
    assert [p["commit"] for p in second["parts"]] == ["bbb"] and all_resume.parts_text(second) is None


def test_another_mode_or_profile_cannot_be_resumed():
    prev = report([entry("poster")], mode="quick")
    assert "quick mode" in all_resume.check(prev, "full", None)
    assert "profile" in all_resume.check(report([entry("poster")], profile="paper"), "full", None)
    assert all_resume.check(None, "full", None) is None
    assert all_resume.check(report([entry("poster")]), "full", None) is None


def test_the_command_refuses_a_mismatched_report_before_any_work(tmp_path):
    (tmp_path / "all.json").write_text(json.dumps(report([entry("poster")], mode="quick")))
    with pytest.raises(SystemExit):
        study_all.parse_args(["--out", str(tmp_path), "--resume"])
    args = study_all.parse_args(["--out", str(tmp_path), "--resume", "--quick"])
    assert all_resume.done(args.previous).keys() == {"poster"}


def test_a_run_in_parts_is_planned_once_over_every_step_and_later_parts_keep_that_plan():
    every = list(ORDER)
    first = all_resume.plan(None, every, "full", 3.0)
    assert first.tiers["poster"].label == "cut"   # the whole run's 3 hours, not the first part's alone
    again = all_resume.plan({"budget": first.to_json()}, every, "full", 1.0)   # another --hours is not a new plan
    assert again.tiers == first.tiers and again.budget_minutes == first.budget_minutes
    fewer = all_resume.plan({"budget": first.to_json()}, every + ["new"], "full", 3.0)
    assert "new" in fewer.tiers   # a plan that lacks a step is made again for all


def test_the_first_part_runs_its_steps_at_the_whole_runs_tiers(tmp_path, monkeypatch):
    ran = []

    def fake_step(step, argv, timeout_s):
        ran.append(argv)
        return {"name": step.name, "argv": argv, "exit_code": 0, "seconds": 1.0,
                "result": {"claims": [], "machine": {"git_commit": "aaa"}}}

    monkeypatch.setattr(study_all, "run_step", fake_step)
    args = study_all.parse_args(["--out", str(tmp_path), "--resume", "--only", "poster", "--hours", "3"])
    part = study_all.run(args, ["--resume"])
    assert "--cut" in ran[0] and part["budget"]["tiers"].keys() == set(ORDER)
    assert "--resume" in ran[0]  # the poster keeps its own finished points too (bench.study.poster_journal)
    (tmp_path / "all.json").write_text(json.dumps(part))
    args = study_all.parse_args(["--out", str(tmp_path), "--resume", "--only", "eviction", "--hours", "0"])
    second = study_all.run(args, ["--resume"])
    assert "--quick" in ran[1] and [e["name"] for e in second["steps"]] == ["poster", "eviction"]
    assert "--resume" not in ran[1]  # the eviction study has no points to keep
    assert second["budget"] == part["budget"]


def test_a_run_stopped_part_way_keeps_the_steps_that_finished_and_goes_on_with_resume(tmp_path, monkeypatch):
    ran = []

    def fake_step(step, argv, timeout_s):
        ran.append(step.name)
        if step.name == "eviction" and ran.count("eviction") == 1:
            raise SystemExit("SIGTERM")  # killed in its second step (stop_on_sigterm raises this)
        return {"name": step.name, "argv": argv, "exit_code": 0, "seconds": 1.0,
                "result": {"claims": [], "machine": {"git_commit": "aaa"}}}

    monkeypatch.setattr(study_all, "run_step", fake_step)
    args = study_all.parse_args(["--out", str(tmp_path), "--quick", "--only", "poster", "eviction"])
    with pytest.raises(SystemExit):
        study_all.run(args, ["--quick"])
    args = study_all.parse_args(["--out", str(tmp_path), "--quick", "--resume", "--only", "poster", "eviction"])
    assert all_resume.done(args.previous).keys() == {"poster"}  # the first step's result was written as it ended
    whole = study_all.run(args, ["--quick", "--resume"])
    assert ran == ["poster", "eviction", "eviction"]  # the poster ran once
    assert [e["name"] for e in whole["steps"]] == ["poster", "eviction"] and whole["steps"][0].get("carried")
