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
