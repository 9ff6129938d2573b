"""kvtb study all's time budget: full mode cut, the largest saving first, until the estimate fits."""
from bench.study import all_budget
from bench.study.all import NAMES

THREE_HOURS = 3.0


def test_every_step_has_an_estimate_with_full_above_quick():
    assert set(NAMES) <= set(all_budget.TIERS)
    for name, tiers in all_budget.TIERS.items():
        assert tiers[0].label == "full" and tiers[-1].label == "quick", name
        minutes = [t.minutes for t in tiers]
        assert minutes == sorted(minutes, reverse=True), name


def test_full_mode_of_every_step_does_not_fit_three_hours_so_it_is_cut_to_fit():
    whole = all_budget.plan(list(NAMES), "full", None)
    assert whole.minutes > THREE_HOURS * 60 and not whole.cut()
    fitted = all_budget.plan(list(NAMES), "full", THREE_HOURS)
    assert fitted.fits and fitted.minutes <= THREE_HOURS * 60
    assert fitted.cut() == {"poster": "cut (--cut)", "scalellm": "cut (--requests-per-client 1)",
                            "eviction": "quick"}
    tighter = all_budget.plan(list(NAMES), "full", 2.0)   # fewer steps in quick mode beats more minutes
    assert tighter.fits and sum(1 for c in tighter.cut().values() if c == "quick") == 1
    assert fitted.tiers["paper"].label == "full" and fitted.tiers["scalellm"].mode == "full"
    assert "cut to fit: poster cut (--cut)" in fitted.text()


def test_a_generous_budget_cuts_nothing_and_an_impossible_one_says_so():
    assert not all_budget.plan(list(NAMES), "full", 10.0).cut()
    tight = all_budget.plan(list(NAMES), "full", 0.1)
    assert not tight.fits and all(t.label == "quick" for t in tight.tiers.values())
    assert "over budget" in tight.text()


def test_quick_and_smoke_run_every_step_in_their_mode_without_a_budget():
    quick = all_budget.plan(["poster", "ttft"], "quick", THREE_HOURS)
    assert {t.mode for t in quick.tiers.values()} == {"quick"} and quick.budget_minutes is None
    smoke = all_budget.plan(["poster"], "smoke", THREE_HOURS)
    assert smoke.tiers["poster"].mode == "smoke"


def test_a_step_without_an_estimate_is_assumed_and_named():
    got = all_budget.plan(["poster", "new_study"], "full", 100.0)
    assert got.unestimated == ("new_study",) and "no estimate for new_study" in got.text()
    assert got.to_json()["tiers"]["new_study"]["minutes"] > 0


def test_under_a_profile_each_estimate_is_multiplied_by_its_slowdown_and_the_plan_says_so():
    studies = {"poster": {"paced_over_real": 4.6}, "scalellm": {"paced_over_real": 4.6},
               "paper": {"paced_over_real": None, "full": {"estimate_s": 20 * 60}},
               "eviction": {"paced_over_real": 0.5}}
    slow, how = all_budget.slowdowns(list(NAMES), studies)
    assert slow["poster"] == 4.6 and slow["eviction"] == 1.0      # pacing never makes a step faster
    assert slow["paper"] == 1.0                                    # 20 min under the profile < 30 unprofiled
    assert slow["ttft"] == 4.6 and "ttft not estimated by it, given the largest (4.6)" in how
    plain = all_budget.plan(list(NAMES), "full", THREE_HOURS)
    paced = all_budget.plan(list(NAMES), "full", THREE_HOURS, slow, how)
    assert paced.fits and paced.minutes <= THREE_HOURS * 60
    assert sum(1 for t in paced.tiers.values() if t.label == "quick") > sum(
        1 for t in plain.tiers.values() if t.label == "quick")     # the same budget buys less under pacing
    assert paced.tiers["poster"].label == "quick" and paced.tiers["poster"].minutes == 7 * 4.6
    assert "x its slowdown (poster 4.6" in paced.text() and "ttft not estimated" in paced.text()
    again = all_budget.Plan.from_json(paced.to_json())
    assert again.slowdown == paced.slowdown and again.text() == paced.text()


def test_without_a_profile_there_is_no_slowdown():
    got = all_budget.plan(list(NAMES), "full", THREE_HOURS)
    assert got.slowdown is None and "slowdown" not in got.text()
    assert all_budget.slowdowns(["ttft"], {}) == ({"ttft": 1.0}, "kvtb profile check's estimates; ttft not "
                                                                 "estimated by it, given the largest (1)")
